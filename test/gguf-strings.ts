/** Test strings for tokenizer comparisons. */
/** 120 varied strings: words, punctuation, digits, whitespace runs, accents, CJK, emoji, code. */
export function variedStrings(): string[] {
  const base = [
    'Once upon a time', 'Hello, world!', "It's a dog's life; isn't it?", '  leading and trailing  ', 'tabs\tand\nnewlines\n\n',
    'numbers 12345 and 3.14159', 'naïve café résumé', '日本語のテキスト', 'emoji 😀🚀 done', 'function f(x) { return x*2; }',
    'UPPER lower MiXeD', "we'll they've I'd you're", '', ' ', 'a', 'The quick brown fox jumps over the lazy dog.',
    '!!!???...', 'line1\r\nline2', '$100 + 20% = ?', 'Ünïcödé ßtraße', 'москва', 'x'.repeat(50), 'ab ab ab ab',
  ];
  const out = [...base];
  for (let i = 0; out.length < 120; i++) out.push(`${base[i % base.length]} ${base[(i * 7 + 3) % base.length]} #${i}`);
  return out;
}
