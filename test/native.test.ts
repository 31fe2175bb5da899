import { describe, expect, it } from 'vitest';
import { cpuFeatures } from '../src/index.js';
import { setSimdLevel } from '../src/native.js';
import { expectKvdError } from './helpers.js';

describe('native addon', () => {
  it('reports CPU features and always offers the scalar fallback', () => {
    const f = cpuFeatures();
    expect(f.levels).toContain('scalar');
    expect(f.levels).toContain(f.active);
  });

  it('switches SIMD levels and rejects unknown ones with a typed error', async () => {
    const before = cpuFeatures().active;
    expect(setSimdLevel('scalar')).toBe('scalar');
    expect(cpuFeatures().active).toBe('scalar');
    setSimdLevel(before);
    await expectKvdError(() => setSimdLevel('sse9' as never), 'E_CONFIG', /expected SIMD level/);
  });
});
