import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
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

  // The addon alone would ignore a value it cannot honour and run the best level instead.
  const cli = join(dirname(fileURLToPath(import.meta.url)), '..', 'dist', 'src', 'cli', 'main.js');
  it.skipIf(!existsSync(cli))('KVDRIVE_SIMD: a level is honoured; a typo or a level the CPU lacks is refused at load (E_CONFIG), not ignored', () => {
    const run = (simd: string) => spawnSync(process.execPath, [cli, '--help'], { env: { ...process.env, KVDRIVE_SIMD: simd }, encoding: 'utf8' });
    expect(run('scalar').status).toBe(0);
    const typo = run('AVX2');
    expect(typo.status).toBe(2);
    expect(typo.stderr).toMatch(/kvdrive: error E_CONFIG: KVDRIVE_SIMD: expected scalar, avx2 or avx512 .*got "AVX2"/);
    const missing = (['avx2', 'avx512'] as const).find((l) => !cpuFeatures().levels.includes(l));
    if (missing) expect(run(missing).stderr).toMatch(/KVDRIVE_SIMD: expected a level this CPU has/);
  });
});
