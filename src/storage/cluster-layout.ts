/**
 * The on-disk order of sealed chunks: one extent per kvdrive index cluster, so that a selection
 * (which picks whole clusters' chunks together) reads few, large extents. Used by the memory model
 * when it seals a segment (src/runtime/kv-memory.ts).
 */
import type { NativeSelectionPolicy } from '../index/policy.js';
import type { ClusterLayout } from './ssd-store.js';

/**
 * On-disk order of chunks [first, end) of one (layer, kv head): the kvdrive index clusters inside
 * that range, each one extent; chunks the index does not cover (sinks, the local window) follow in
 * token order, four per extent.
 */
export function clusterLayout(policy: NativeSelectionPolicy, head: number, first: number, end: number): ClusterLayout {
  const n = end - first;
  const seen = new Uint8Array(n);
  const ids: number[] = [];
  const offsets = [0];
  for (const seg of policy.clusters(head)) {
    if (seg.endChunk <= first || seg.firstChunk >= end) continue;
    for (let c = 0; c < seg.k; c++) {
      let added = 0;
      for (let m = seg.offsets[c]!; m < seg.offsets[c + 1]!; m++) {
        const j = seg.members[m]! - first;
        if (j < 0 || j >= n || seen[j]) continue;
        seen[j] = 1;
        ids.push(j);
        added++;
      }
      if (added) offsets.push(ids.length);
    }
  }
  let run = 0;
  for (let j = 0; j < n; j++) {
    if (seen[j]) continue;
    ids.push(j);
    if (++run === 4) {
      offsets.push(ids.length);
      run = 0;
    }
  }
  if (offsets[offsets.length - 1] !== ids.length) offsets.push(ids.length);
  return { offsets: Int32Array.from(offsets), chunkIds: Int32Array.from(ids) };
}
