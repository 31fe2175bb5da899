/**
 * OS thread count of this process (Linux /proc), for "close() leaves no threads behind" checks.
 * libuv starts its thread pool lazily on the first async fs / native async call; `osThreads()`
 * starts it first so that lazily created pool threads are not mistaken for leaked workers.
 */
import { readdirSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';

export async function osThreads(): Promise<number> {
  await readFile(fileURLToPath(import.meta.url));
  return readdirSync('/proc/self/task').length;
}
