/**
 * Storage benchmarks (bench/storage.md has the commands and the figures).
 *
 * 1. sparse: the SSD store's sparse cluster reads (whole extents, coalesced, crc32c-verified,
 *    scattered into a fetch buffer) against a raw read of exactly the same extents through the
 *    same engine options (block size maxIoBytes, queue depth), same file, O_DIRECT, same run;
 *    for io_uring and pread. Reported: store throughput / raw throughput (target >= 0.85), and a
 *    control (a second identical raw engine / the first) that shows the noise floor.
 * 2. replay: end-to-end fetch replay of a synthetic selection sequence (temporal locality: most
 *    clusters of a step stay selected the next step) over KV 3x the DRAM budget. Per-step fetch
 *    time of DRAM+SSD (TieredKv with promotion) against DRAM-only (all KV resident, the bound)
 *    and a FlexGen-style baseline that reads each layer's whole KV from SSD every step.
 *
 * 3. engines (bench/storage.md §4): the same sparse cluster reads through SsdStore.readBatch with each I/O engine —
 *    io_uring, pread, mmap — all buffered (O_DIRECT does not apply to a mapping), cold (the files'
 *    pages dropped from the page cache with posix_fadvise before each read) and warm (the same
 *    read again), rotated order, same run. Reported: GB/s of extent bytes and CPU ms per GB.
 *
 * Run: npm run build:ts && node --expose-gc dist/bench/storage.bench.js [--gib 1] [--dir /tmp]
 *      [--sparse-only | --replay-only | --engines-only]
 * The store file is deleted afterwards.
 */
import { rmSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DramStore } from '../src/storage/dram-store.js';
import { IoEngine, ioUringAvailable, type IoEngineKind } from '../src/storage/io-engine.js';
import { SsdStore, type ClusterLayout, type StoreShape } from '../src/storage/ssd-store.js';
import { TieredKv, type FetchRequest } from '../src/storage/tiered-kv.js';
import { arg } from './bench-util.js';

const gib = Number(arg('gib', '1'));
const baseDir = arg('dir', tmpdir());
const shape: StoreShape = { layers: 8, kvHeads: 8, headDim: 128, dtype: 'f16', chunkSize: 4 }; // 2 KiB chunks
const segTokens = 4096; // 1024 chunks per (layer, head) per segment; 128 MiB per segment
const segBytes = shape.layers * shape.kvHeads * segTokens * 2 * shape.headDim * 2;
const nSegments = Math.max(3, Math.round((gib * 2 ** 30) / segBytes));
const chunksPerSeg = segTokens / shape.chunkSize;
const budgetTokens = 2048; // K per (layer, kv head) per step
const queueDepth = 32;
const maxIoBytes = 256 << 10;

let seed = 12345;
function rand(): number {
  seed = (Math.imul(seed ^ (seed >>> 15), 0x2c1b3c6d) + 0x6d2b79f5) >>> 0;
  return seed / 2 ** 32;
}

/** Random clusters of 1..7 chunks (mean 4 chunks = 16 tokens, DESIGN.md). */
function clustersFor(): ClusterLayout[] {
  const out: ClusterLayout[] = [];
  for (let r = 0; r < shape.layers * shape.kvHeads; r++) {
    const ids = Int32Array.from({ length: chunksPerSeg }, (_, j) => j);
    for (let j = ids.length - 1; j > 0; j--) {
      const k = Math.floor(rand() * (j + 1));
      [ids[j], ids[k]] = [ids[k]!, ids[j]!];
    }
    const offsets = [0];
    while (offsets[offsets.length - 1]! < chunksPerSeg) offsets.push(Math.min(chunksPerSeg, offsets[offsets.length - 1]! + 1 + Math.floor(rand() * 7)));
    out.push({ offsets: Int32Array.from(offsets), chunkIds: ids });
  }
  return out;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

/** Per (segment, layer, head): the cluster table of the layout, for selecting whole clusters. */
type Layout = Map<string, { offsets: Float64Array; bytes: Float64Array; firstPos: Int32Array; chunks: Int32Array; order: Int32Array; file: number }>;

/**
 * One step's selection per (layer, head): whole clusters, picked at random across all segments
 * until budgetTokens; `keep` of the previous step's clusters stay (temporal locality).
 */
class SelectionSequence {
  private prev = new Map<number, Array<[number, number]>>(); // region -> [segment, extent]
  /**
   * `weight` (optional): per `${segment}/${layer}/${head}` a popularity in [0, 1] per cluster; new
   * clusters are drawn with probability proportional to it (skewed importance, as attention is).
   */
  constructor(
    private layout: Layout,
    private keep: number,
    private weight?: Map<string, Float32Array>,
  ) {}
  step(layer: number): Array<{ head: number; picks: Array<[number, number]> }> {
    const out = [];
    for (let h = 0; h < shape.kvHeads; h++) {
      const region = layer * shape.kvHeads + h;
      const old = this.prev.get(region) ?? [];
      const picks: Array<[number, number]> = [];
      const seen = new Set<string>();
      let tokens = 0;
      for (const p of old) {
        if (rand() >= this.keep) continue;
        const e = this.layout.get(`${p[0]}/${layer}/${h}`)!;
        picks.push(p);
        seen.add(`${p[0]}/${p[1]}`);
        tokens += e.chunks[p[1]]! * shape.chunkSize;
        if (tokens >= budgetTokens) break;
      }
      while (tokens < budgetTokens) {
        const s = Math.floor(rand() * nSegments);
        const e = this.layout.get(`${s}/${layer}/${h}`)!;
        const x = Math.floor(rand() * e.offsets.length);
        if (seen.has(`${s}/${x}`)) continue;
        if (this.weight && rand() >= this.weight.get(`${s}/${layer}/${h}`)![x]!) continue;
        seen.add(`${s}/${x}`);
        picks.push([s, x]);
        tokens += e.chunks[x]! * shape.chunkSize;
      }
      this.prev.set(region, picks);
      out.push({ head: h, picks });
    }
    return out;
  }
}

/**
 * A fetch request for one layer's selection. Score = 1 + the cluster's warm-up importance: being
 * selected now (decode attention mass) outranks any chunk that is only warm-up important.
 */
function fetchRequest(layer: number, sel: Array<{ head: number; picks: Array<[number, number]> }>, layout: Layout, weight: Map<string, Float32Array>): FetchRequest {
  const offsets = new Int32Array(shape.kvHeads + 1);
  const ids: number[] = [];
  const scores: number[] = [];
  for (const { head, picks } of sel) {
    const list: Array<[number, number]> = [];
    for (const [s, x] of picks) {
      const e = layout.get(`${s}/${layer}/${head}`)!;
      const w = 1 + weight.get(`${s}/${layer}/${head}`)![x]!;
      for (let p = e.firstPos[x]!; p < e.firstPos[x]! + e.chunks[x]!; p++) list.push([s * chunksPerSeg + e.order[p]!, w]);
    }
    list.sort((a, b) => a[0] - b[0]);
    for (const [id, w] of list) {
      ids.push(id);
      scores.push(w);
    }
    offsets[head + 1] = ids.length;
  }
  return { layer, offsets, chunkIds: Int32Array.from(ids), scores: Float32Array.from(scores) };
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(baseDir, 'kvd-storage-bench-'));
  const u = ioUringAvailable();
  const kinds: IoEngineKind[] = u.usable ? ['uring', 'pread'] : ['pread'];
  if (!u.usable) console.log(`io_uring unavailable (${u.reason}); pread only`);
  console.log(`store: ${nSegments} segments x ${(segBytes / 2 ** 20).toFixed(0)} MiB = ${((nSegments * segBytes) / 2 ** 30).toFixed(2)} GiB in ${dir}; O_DIRECT; QD ${queueDepth}; maxIo ${maxIoBytes >> 10} KiB`);
  try {
    // Build the store once (KV content is random bits; one set of layers reused by every segment).
    const writer = await SsdStore.open({ dir, shape, kind: 'pread' });
    const layers = [];
    for (let l = 0; l < shape.layers; l++) {
      const mk = () => {
        const d = new Uint16Array(segTokens * shape.kvHeads * shape.headDim);
        for (let i = 0; i < d.length; i++) d[i] = (rand() * 65536) | 0;
        return { data: d, dtype: shape.dtype, tokens: segTokens, heads: shape.kvHeads, dim: shape.headDim };
      };
      layers.push({ k: mk(), v: mk() });
    }
    const tw = performance.now();
    for (let s = 0; s < nSegments; s++) await writer.writeSegment(`seg${s}`, { layers, clusters: clustersFor() });
    console.log(`wrote ${nSegments} segments in ${((performance.now() - tw) / 1000).toFixed(1)} s`);
    await writer.close();
    const segIds = Array.from({ length: nSegments }, (_, s) => `seg${s}`);

    // ---- 1. sparse reads: store vs raw, same extents, same engine options --------------------
    for (const kind of process.argv.includes('--replay-only') || process.argv.includes('--engines-only') ? [] : kinds) {
      const store = await SsdStore.open({ dir, kind, direct: true, queueDepth, maxIoBytes });
      const raw = new IoEngine({ kind, queueDepth, maxIoBytes });
      const rawFiles = segIds.map((id) => raw.open(join(dir, `${id}.kvseg`), true).file);
      // Control: a second, identical raw engine; raw2/raw shows the run-to-run noise floor.
      const raw2 = new IoEngine({ kind, queueDepth, maxIoBytes });
      const raw2Files = segIds.map((id) => raw2.open(join(dir, `${id}.kvseg`), true).file);
      const layout: Layout = new Map();
      for (let s = 0; s < nSegments; s++)
        for (let l = 0; l < shape.layers; l++) for (let h = 0; h < shape.kvHeads; h++) layout.set(`${s}/${l}/${h}`, { ...store.extents(`seg${s}`, l, h), file: rawFiles[s]! });
      const seq = new SelectionSequence(layout, 0); // fresh random clusters: every read is cold
      const ratios: number[] = [];
      const controls: number[] = [];
      let storeCpu = 0;
      let rawCpu = 0;
      let storeIos = 0;
      let rawIos = 0;
      let storeRead = 0;
      let rawRead = 0;
      let totalBytes = 0;
      const storeRates: number[] = [];
      const rawRates: number[] = [];
      const fetchBuf = new Uint8Array(shape.kvHeads * (budgetTokens / shape.chunkSize + 8) * store.chunkBytes);
      for (let round = 0; round < 8; round++) {
        // One step = every layer; the same selection is read by both paths (alternating order).
        let storeMs = 0;
        let rawMs = 0;
        let raw2Ms = 0;
        let bytes = 0;
        for (let l = 0; l < shape.layers; l++) {
          const sel = seq.step(l);
          const items: Array<{ segment: string; layer: number; kvHead: number; chunkIds: Int32Array }> = [];
          const files: number[] = [];
          const offs: number[] = [];
          const lens: number[] = [];
          const dofs: number[] = [];
          let at = 0;
          for (const { head, picks } of sel) {
            const bySeg = new Map<number, number[]>();
            for (const [s, x] of picks) {
              const e = layout.get(`${s}/${l}/${head}`)!;
              if (!bySeg.has(s)) bySeg.set(s, []);
              for (let p = e.firstPos[x]!; p < e.firstPos[x]! + e.chunks[x]!; p++) bySeg.get(s)!.push(e.order[p]!);
              files.push(e.file);
              offs.push(e.offsets[x]!);
              lens.push(e.bytes[x]!);
              dofs.push(at);
              at += e.bytes[x]!;
            }
            for (const [s, ids] of bySeg) items.push({ segment: `seg${s}`, layer: l, kvHead: head, chunkIds: Int32Array.from(ids) });
          }
          bytes += at;
          const rawReq = { files: Int32Array.from(files), offsets: Float64Array.from(offs), lengths: Float64Array.from(lens), destOffsets: Float64Array.from(dofs), dest: fetchBuf };
          const runStore = async () => {
            const t = performance.now();
            const c = process.cpuUsage();
            const st = await store.readBatch(items, fetchBuf);
            storeMs += performance.now() - t;
            const d = process.cpuUsage(c);
            storeCpu += (d.user + d.system) / 1000;
            if (st.extentBytes !== at) throw new Error(`store read ${st.extentBytes} extent bytes, raw ${at}`);
            storeIos += st.ios;
            storeRead += st.bytesRead;
          };
          const runRaw = async () => {
            const t = performance.now();
            const c = process.cpuUsage();
            const rs = await raw.readArrays(rawReq);
            rawIos += rs.ios;
            rawRead += rs.bytesRead;
            rawMs += performance.now() - t;
            const d = process.cpuUsage(c);
            rawCpu += (d.user + d.system) / 1000;
          };
          const raw2Req = { ...rawReq, files: Int32Array.from(rawReq.files, (f) => raw2Files[rawFiles.indexOf(f)]!) };
          const runRaw2 = async () => {
            const t = performance.now();
            await raw2.readArrays(raw2Req);
            raw2Ms += performance.now() - t;
          };
          // Rotate the order so no path always runs first.
          const order = [runRaw, runStore, runRaw2];
          for (let k = 0; k < 3; k++) await order[(round + l + k) % 3]!();
        }
        if (round === 0) {
          storeCpu = rawCpu = 0;
          continue; // warm-up
        }
        totalBytes += bytes;
        storeRates.push(bytes / storeMs / 1e6);
        rawRates.push(bytes / rawMs / 1e6);
        ratios.push(rawMs / storeMs);
        controls.push(rawMs / raw2Ms);
      }
      console.log(
        `sparse ${store.engineInfo.kind.padEnd(8)} raw ${median(rawRates).toFixed(2)} GB/s, store ${median(storeRates).toFixed(2)} GB/s, store/raw ${median(ratios).toFixed(3)} (control raw2/raw ${median(controls).toFixed(3)}; median of ${ratios.length} steps, each ${shape.layers} layers x ${shape.kvHeads} heads x ${budgetTokens} tokens of whole clusters); ` +
          `CPU ms per GB: raw ${((rawCpu / totalBytes) * 1e9).toFixed(0)}, store ${((storeCpu / totalBytes) * 1e9).toFixed(0)}; ` +
          `I/Os raw ${rawIos} store ${storeIos}, device bytes raw ${(rawRead / 2 ** 20).toFixed(0)} MiB store ${(storeRead / 2 ** 20).toFixed(0)} MiB`,
      );
      raw.close();
      raw2.close();
      await store.close();
    }

    // ---- 3. engines: io_uring vs pread vs mmap, buffered, cold and warm ------------------------
    if (!process.argv.includes('--sparse-only') && !process.argv.includes('--replay-only')) {
      const engineKinds: IoEngineKind[] = [...kinds, 'mmap'];
      const stores = new Map<IoEngineKind, SsdStore>();
      for (const kind of engineKinds) stores.set(kind, await SsdStore.open({ dir, kind, direct: false, queueDepth, maxIoBytes }));
      // Drops the segment files' pages from the page cache (this process's files only).
      const dropper = new IoEngine({ kind: 'pread' });
      const dropFiles = segIds.map((id) => dropper.open(join(dir, `${id}.kvseg`)).file);
      const drop = () => dropFiles.forEach((f) => dropper.dropCache(f));
      const anyStore = stores.get(engineKinds[0]!)!;
      const layout: Layout = new Map();
      for (let s = 0; s < nSegments; s++) for (let l = 0; l < shape.layers; l++) for (let h = 0; h < shape.kvHeads; h++) layout.set(`${s}/${l}/${h}`, { ...anyStore.extents(`seg${s}`, l, h), file: 0 });
      const seq = new SelectionSequence(layout, 0);
      const fetchBuf = new Uint8Array(shape.kvHeads * (budgetTokens / shape.chunkSize + 8) * anyStore.chunkBytes);
      const acc = new Map(engineKinds.map((k) => [k, { cold: 0, warm: 0, coldCpu: 0, warmCpu: 0, bytes: 0 }]));
      const rounds = 5;
      for (let round = 0; round < rounds; round++)
        for (let l = 0; l < shape.layers; l++) {
          const items: Array<{ segment: string; layer: number; kvHead: number; chunkIds: Int32Array }> = [];
          let extentBytes = 0;
          for (const { head, picks } of seq.step(l)) {
            const bySeg = new Map<number, number[]>();
            for (const [s, x] of picks) {
              const e = layout.get(`${s}/${l}/${head}`)!;
              if (!bySeg.has(s)) bySeg.set(s, []);
              for (let p = e.firstPos[x]!; p < e.firstPos[x]! + e.chunks[x]!; p++) bySeg.get(s)!.push(e.order[p]!);
              extentBytes += e.bytes[x]!;
            }
            for (const [s, ids] of bySeg) items.push({ segment: `seg${s}`, layer: l, kvHead: head, chunkIds: Int32Array.from(ids) });
          }
          for (let k = 0; k < engineKinds.length; k++) {
            const kind = engineKinds[(round + l + k) % engineKinds.length]!;
            const store = stores.get(kind)!;
            const a = acc.get(kind)!;
            for (const phase of ['cold', 'warm'] as const) {
              if (phase === 'cold') drop();
              const c = process.cpuUsage();
              const t = performance.now();
              await store.readBatch(items, fetchBuf);
              const dt = performance.now() - t;
              const u = process.cpuUsage(c);
              if (round === 0) continue; // warm-up round
              a[phase] += dt;
              a[phase === 'cold' ? 'coldCpu' : 'warmCpu'] += (u.user + u.system) / 1000;
            }
            if (round > 0) a.bytes += extentBytes;
          }
        }
      const base = acc.get('pread')!;
      for (const [kind, a] of acc)
        console.log(
          `engines ${stores.get(kind)!.engineInfo.kind.padEnd(8)} cold ${(a.bytes / a.cold / 1e6).toFixed(2)} GB/s (x${(base.cold / a.cold).toFixed(2)} pread), warm ${(a.bytes / a.warm / 1e6).toFixed(2)} GB/s (x${(base.warm / a.warm).toFixed(2)} pread); ` +
            `CPU ms per GB cold ${((a.coldCpu / a.bytes) * 1e9).toFixed(0)}, warm ${((a.warmCpu / a.bytes) * 1e9).toFixed(0)} (${rounds - 1} steps x ${shape.layers} layers of whole clusters, buffered)`,
        );
      dropper.close();
      for (const st of stores.values()) await st.close();
    }

    // ---- 2. end-to-end replay: DRAM+SSD vs DRAM-only vs FlexGen-style -------------------------
    if (process.argv.includes('--sparse-only') || process.argv.includes('--engines-only')) return;
    const kvBytes = nSegments * segBytes;
    const ssd = await SsdStore.open({ dir, kind: kinds[0]!, direct: true, queueDepth, maxIoBytes });
    const layout: Layout = new Map();
    for (let s = 0; s < nSegments; s++) for (let l = 0; l < shape.layers; l++) for (let h = 0; h < shape.kvHeads; h++) layout.set(`${s}/${l}/${h}`, { ...ssd.extents(`seg${s}`, l, h), file: 0 });
    const steps = 12;
    const keep = 0.85;
    seed = 777;
    // Skewed cluster importance (u^3): what prefill warm-up scores would rank.
    const weight = new Map<string, Float32Array>();
    for (const [k, e] of layout) weight.set(k, Float32Array.from(e.offsets, () => rand() ** 3));
    const seq = new SelectionSequence(layout, keep, weight);
    const requests: FetchRequest[][] = [];
    for (let s = 0; s < steps; s++) requests.push(Array.from({ length: shape.layers }, (_, l) => fetchRequest(l, seq.step(l), layout, weight)));
    const maxChunks = Math.max(...requests.flat().map((r) => r.chunkIds.length));
    const dest = new Uint8Array(maxChunks * ssd.chunkBytes);
    const tally = () => ({ times: [] as number[], dramB: 0, ssdB: 0, ssdRead: 0, runs: 0 });
    const runStep = async (kv: TieredKv, s: number, t: ReturnType<typeof tally>) => {
      const t0 = performance.now();
      for (const r of requests[s]!) {
        const st = await kv.fetch(r, dest);
        t.dramB += st.dramBytes;
        t.ssdB += st.ssdBytes;
        t.ssdRead += st.ssdReadBytes;
        t.runs += st.ssdRuns;
      }
      t.times.push(performance.now() - t0);
    };
    const report = (label: string, t: ReturnType<typeof tally>) => {
      const m = median(t.times.slice(2));
      console.log(
        `replay ${label.padEnd(10)} ${m.toFixed(1)} ms/step (median of steps 3..${steps}); per step: DRAM ${(t.dramB / steps / 2 ** 20).toFixed(1)} MiB, ` +
          `SSD ${(t.ssdB / steps / 2 ** 20).toFixed(1)} MiB of chunks (${(t.ssdRead / steps / 2 ** 20).toFixed(1)} MiB read in ${(t.runs / steps).toFixed(0)} runs)`,
      );
      return m;
    };
    // DRAM+SSD: budget one third of the KV, filled by importance-guided warm-up (kvdrive §7.1:
    // the highest-scoring chunks of every segment, from the KV still in memory after prefill).
    const budget = Math.floor(kvBytes / 3);
    const dram = new DramStore({ budgetBytes: budget, shape });
    const tWarm = performance.now();
    for (let s = 0; s < nSegments; s++) {
      dram.addSegment(`seg${s}`, segTokens);
      const scores = new Float32Array(shape.layers * shape.kvHeads * chunksPerSeg);
      for (let l = 0; l < shape.layers; l++)
        for (let h = 0; h < shape.kvHeads; h++) {
          const e = layout.get(`${s}/${l}/${h}`)!;
          const w = weight.get(`${s}/${l}/${h}`)!;
          for (let x = 0; x < e.offsets.length; x++)
            for (let p = e.firstPos[x]!; p < e.firstPos[x]! + e.chunks[x]!; p++) scores[(l * shape.kvHeads + h) * chunksPerSeg + e.order[p]!] = w[x]!;
        }
      dram.warm(`seg${s}`, { layers }, scores);
    }
    console.log(`  warm-up filled ${(dram.stats().usedBytes / 2 ** 20).toFixed(0)} MiB of DRAM by importance in ${((performance.now() - tWarm) / 1000).toFixed(1)} s`);
    const tiered = new TieredKv({ ssd, dram, segments: segIds });
    // DRAM-only: every chunk resident (budget >= KV), loaded by fetching everything once.
    const full = new DramStore({ budgetBytes: kvBytes + chunksPerSeg * nSegments * shape.layers * shape.kvHeads * (DramStore.metadataBytesPerSlot + 1), shape });
    const onlyDram = new TieredKv({ ssd, dram: full, segments: segIds });
    const all = new Int32Array(chunksPerSeg * nSegments).map((_, i) => i);
    const bigDest = new Uint8Array(all.length * ssd.chunkBytes);
    for (let l = 0; l < shape.layers; l++)
      for (let h = 0; h < shape.kvHeads; h++) {
        const offsets = new Int32Array(shape.kvHeads + 1);
        for (let x = h + 1; x <= shape.kvHeads; x++) offsets[x] = all.length;
        await onlyDram.fetch({ layer: l, offsets, chunkIds: all, scores: new Float32Array(all.length).fill(1) }, bigDest);
      }
    if (full.stats().residentChunks !== all.length * shape.layers * shape.kvHeads) throw new Error('DRAM-only store did not hold all KV');
    // Interleaved (alternating order per step) so both see the same machine load.
    const tT = tally();
    const tD = tally();
    for (let s = 0; s < steps; s++) {
      if (s % 2) {
        await runStep(tiered, s, tT);
        await runStep(onlyDram, s, tD);
      } else {
        await runStep(onlyDram, s, tD);
        await runStep(tiered, s, tT);
      }
    }
    const tTiered = report('DRAM+SSD', tT);
    const ds = dram.stats();
    console.log(
      `  DRAM budget ${(budget / 2 ** 20).toFixed(0)} MiB for ${(kvBytes / 2 ** 20).toFixed(0)} MiB of KV (1/3); resident ${(ds.usedBytes / 2 ** 20).toFixed(0)} MiB; ` +
        `reserved ${(ds.reservedBytes / 2 ** 20).toFixed(0)} MiB <= budget; replay promoted ${tiered.totals().promoted} chunks`,
    );
    const tDram = report('DRAM-only', tD);
    await tiered.close();
    await onlyDram.close();
    // FlexGen-style: each layer's whole KV read from SSD every step (sequential region reads).
    const engine = new IoEngine({ kind: kinds[0]!, queueDepth, maxIoBytes });
    const files = segIds.map((id) => engine.open(join(dir, `${id}.kvseg`), true).file);
    const layerBytes = nSegments * shape.kvHeads * chunksPerSeg * ssd.chunkBytes;
    const layerBuf = new Uint8Array(layerBytes);
    const flexTimes: number[] = [];
    for (let s = 0; s < 4; s++) {
      const t = performance.now();
      for (let l = 0; l < shape.layers; l++) {
        const reads = [];
        let at = 0;
        for (let g = 0; g < nSegments; g++)
          for (let h = 0; h < shape.kvHeads; h++) {
            const e = layout.get(`${g}/${l}/${h}`)!;
            const start = e.offsets[0]!;
            const len = e.offsets[e.offsets.length - 1]! + e.bytes[e.bytes.length - 1]! - start;
            reads.push({ file: files[g]!, offset: start, length: len, destOffset: at });
            at += len;
          }
        await engine.read(reads, layerBuf);
      }
      flexTimes.push(performance.now() - t);
    }
    engine.close();
    const tFlex = median(flexTimes.slice(1));
    console.log(`replay ${'FlexGen'.padEnd(10)} ${tFlex.toFixed(1)} ms/step (median of steps 2..4; ${(layerBytes * shape.layers / 2 ** 20).toFixed(0)} MiB read per step)`);
    console.log(`ratios: DRAM+SSD / DRAM-only time ${(tTiered / tDram).toFixed(2)}x; FlexGen / DRAM+SSD time ${(tFlex / tTiered).toFixed(1)}x`);
    await ssd.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
