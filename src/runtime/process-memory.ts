/**
 * The process's real memory, read from /proc/self/status (Linux): what budgets are checked against.
 * A budget is "kept" when the resident set stays at or below the configured budgets plus a stated,
 * itemised overhead (the Node runtime, the loaded addon, the caller's own buffers); the helper here
 * is the one place that reads it and the one place that compares it.
 */
import { readFileSync } from 'node:fs';

/** Resident and peak resident set of this process, bytes; undefined where /proc is not available. */
export interface ProcessMemory {
  /** VmRSS: resident now. */
  rssBytes: number;
  /** VmHWM: the highest resident set since the process started (or since the last reset). */
  peakRssBytes: number;
}

/** Reads VmRSS and VmHWM of this process, or undefined when the platform has no /proc/self/status. */
export function processMemory(): ProcessMemory | undefined {
  let text: string;
  try {
    text = readFileSync('/proc/self/status', 'utf8');
  } catch {
    return undefined;
  }
  const kib = (name: string): number | undefined => {
    const m = new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(text);
    return m ? Number(m[1]) * 1024 : undefined;
  };
  const rss = kib('VmRSS');
  const hwm = kib('VmHWM');
  if (rss === undefined || hwm === undefined) return undefined;
  return { rssBytes: rss, peakRssBytes: hwm };
}

/** One line of a memory bound: what it is and how many bytes it may take. */
export interface MemoryItem {
  what: string;
  bytes: number;
}

/** A measured resident set against budgets plus stated overhead. */
export interface MemoryCheck {
  /** Sum of the budget items. */
  budgetBytes: number;
  /** Sum of the overhead items. */
  overheadBytes: number;
  /** budgetBytes + overheadBytes. */
  limitBytes: number;
  /** The measured figure compared (peak RSS unless said otherwise). */
  measuredBytes: number;
  /** measuredBytes <= limitBytes. */
  within: boolean;
  budget: MemoryItem[];
  overhead: MemoryItem[];
}

/**
 * Compares `measuredBytes` (default: this process's peak RSS) with the budgets plus the stated
 * overhead. A caller measuring one phase subtracts its own baseline into an overhead item, e.g.
 * `{ what: 'process before open (node, addon, test data)', bytes: before.rssBytes }`.
 */
export function checkMemory(budget: MemoryItem[], overhead: MemoryItem[], measuredBytes?: number): MemoryCheck {
  const measured = measuredBytes ?? processMemory()?.peakRssBytes ?? 0;
  const budgetBytes = budget.reduce((a, i) => a + i.bytes, 0);
  const overheadBytes = overhead.reduce((a, i) => a + i.bytes, 0);
  const limitBytes = budgetBytes + overheadBytes;
  return { budgetBytes, overheadBytes, limitBytes, measuredBytes: measured, within: measured <= limitBytes, budget, overhead };
}

/** A short human-readable account of a {@link MemoryCheck} (MiB, one line per item). */
export function formatMemoryCheck(c: MemoryCheck): string {
  const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
  const lines = [`measured ${mib(c.measuredBytes)} ${c.within ? '<=' : '>'} limit ${mib(c.limitBytes)} (budgets ${mib(c.budgetBytes)} + overhead ${mib(c.overheadBytes)})`];
  for (const i of c.budget) lines.push(`  budget   ${i.what}: ${mib(i.bytes)}`);
  for (const i of c.overhead) lines.push(`  overhead ${i.what}: ${mib(i.bytes)}`);
  return lines.join('\n');
}
