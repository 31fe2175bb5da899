/**
 * This process's OS threads as Linux /proc shows them. `osThreads()`: their count, for "close()
 * leaves no threads behind" checks (libuv starts its thread pool lazily on the first async fs /
 * native async call; `osThreads()` starts it first so that lazily created pool threads are not
 * mistaken for leaked workers). `poolThreads()` and `allowedCpus()`: the addon's thread pool and
 * where a thread may run, for its placement tests.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';

export async function osThreads(): Promise<number> {
  await readFile(fileURLToPath(import.meta.url));
  return readdirSync('/proc/self/task').length;
}

/** Task ids of the addon's pool threads (named kvd-pool, native/common/thread_pool.cc). */
export function poolThreads(): string[] {
  return readdirSync('/proc/self/task').filter((t) => {
    try {
      return readFileSync(`/proc/self/task/${t}/comm`, 'utf8').trim() === 'kvd-pool';
    } catch {
      return false; // the thread ended between the listing and the read
    }
  });
}

/** The CPUs a task may run on (its Cpus_allowed_list, e.g. "0-3,6" -> [0, 1, 2, 3, 6]); the process's main thread by default. */
export function allowedCpus(task: string = String(process.pid)): number[] {
  const list = /Cpus_allowed_list:\s*(\S+)/.exec(readFileSync(`/proc/self/task/${task}/status`, 'utf8'))![1]!;
  const out: number[] = [];
  for (const part of list.split(',')) {
    const [a, b] = part.split('-').map(Number);
    for (let c = a!; c <= (b ?? a)!; c++) out.push(c);
  }
  return out;
}
