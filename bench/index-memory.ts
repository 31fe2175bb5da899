/**
 * The real memory of one layer's offloaded kvdrive index (the runtime's `offloadedPolicyOptions`):
 * the process's VmRSS (/proc/self/status) before and after building it over a context of random
 * keys, beside the index's own count (`indexBytes()`, what the runtime's memory plan budgets). Run
 * with --expose-gc, so the keys' conversion garbage is collected before each reading.
 *
 *   node --expose-gc dist/bench/index-memory.js [context=131072] [kvHeads=8] [headDim=128]
 *
 * To compare two builds, run it once with each build's addon in build/Release.
 */
import { readFileSync } from 'node:fs';
import { createPolicy } from '../src/index/policy.js';
import { offloadedPolicyOptions } from '../src/index/options.js';

const T = Number(process.argv[2] ?? 131072);
const H = Number(process.argv[3] ?? 8);
const D = Number(process.argv[4] ?? 128);
const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error('run with node --expose-gc (the readings need the garbage collected)');
const rss = (): number => Number(/VmRSS:\s+(\d+)/.exec(readFileSync('/proc/self/status', 'utf8'))![1]) * 1024;

const data = new Float32Array(T * H * D);
let x = 0x9e3779b9;
for (let i = 0; i < data.length; i++) {
  x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + 0x6b43a9b5) >>> 0;
  data[i] = x / 2 ** 31 - 1;
}
const policy = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { threads: 2, qHeads: 4 * H, kvHeads: H, headDim: D }));
gc();
const before = rss();
policy.buildSync({ data, dtype: 'f32', tokens: T, heads: H, dim: D }, T);
gc();
const grown = rss() - before;
const mib = (b: number) => (b / 2 ** 20).toFixed(1);
console.log(
  `kvdrive offloaded index, ${T} tokens x ${H} kv heads x dim ${D}: its own count ${mib(policy.indexBytes())} MiB ` +
    `(${(policy.indexBytes() / T).toFixed(0)} B/token); VmRSS grew ${mib(grown)} MiB over the build`,
);
