/** Plain-text tables and human units for CLI reports. */

/** Renders rows as an aligned text table; the first row is the header. Numbers right-aligned. */
export function table(rows: (string | number)[][]): string {
  const cells = rows.map((r) => r.map((c) => String(c)));
  const widths = cells[0]!.map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  const line = (r: string[], isHeader: boolean) =>
    r
      .map((c, i) => {
        const numeric = !isHeader && /^[-+]?[\d.,]+(e[-+]?\d+)?\s*[%a-zA-Z/]*$/.test(c);
        return numeric ? c.padStart(widths[i]!) : c.padEnd(widths[i]!);
      })
      .join('  ')
      .trimEnd();
  const sep = widths.map((w) => '-'.repeat(w)).join('  ');
  return [line(cells[0]!, true), sep, ...cells.slice(1).map((r) => line(r, false))].join('\n');
}

/** Bytes in binary units (KiB, MiB, GiB). */
export function bytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let x = n;
  while (x >= 1024 && i < units.length - 1) {
    x /= 1024;
    i++;
  }
  return `${x.toFixed(i === 0 ? 0 : x < 10 ? 2 : 1)} ${units[i]}`;
}

/** Milliseconds with sensible precision. */
export function ms(x: number): string {
  return x < 1 ? `${x.toFixed(3)} ms` : x < 100 ? `${x.toFixed(2)} ms` : `${x.toFixed(0)} ms`;
}
