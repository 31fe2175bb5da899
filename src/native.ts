/**
 * Loads the C++ addon and wraps every exported function so native errors surface as
 * {@link KvdriveError}. Everything else imports native functions from here, never the .node file.
 */
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { KvdriveError, fromNative } from './errors.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type NativeModule = Record<string, any>;

function findAddon(): string {
  // Works from src/ (vitest) and dist/src/ (compiled): walk up to the package root.
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 5; i++) {
    const p = join(dir, 'build', 'Release', 'kvdrive.node');
    if (existsSync(p)) return p;
    dir = dirname(dir);
  }
  throw new KvdriveError('E_NOT_FOUND', 'native addon build/Release/kvdrive.node: expected it to be built by `npm install`, but it was not found; run `npm install` (or `npm run build`) in the package root');
}

function wrap(mod: NativeModule): NativeModule {
  const out: NativeModule = {};
  for (const [name, value] of Object.entries(mod)) {
    if (typeof value !== 'function' || /^[A-Z]/.test(name)) {
      out[name] = value; // classes and constants pass through
      continue;
    }
    out[name] = (...args: unknown[]) => {
      try {
        const r = value(...args);
        if (r instanceof Promise) return r.catch((e: unknown) => Promise.reject(fromNative(e)));
        return r;
      } catch (e) {
        throw fromNative(e);
      }
    };
  }
  return out;
}

const require = createRequire(import.meta.url);
/** The addon, with errors translated. Typed per use site by the modules that wrap it. */
export const native: NativeModule = wrap(require(findAddon()) as NativeModule);
checkSimdEnv();

/** CPU features and SIMD levels the addon found at load time. */
export interface CpuFeatures {
  avx2: boolean;
  fma: boolean;
  f16c: boolean;
  avx512f: boolean;
  avx512bw: boolean;
  avx512fp16: boolean;
  avx512bf16: boolean;
  /** SIMD levels usable here, always including 'scalar'. */
  levels: SimdLevel[];
  /** The level kernels use now. */
  active: SimdLevel;
}
export type SimdLevel = 'scalar' | 'avx2' | 'avx512';

export function cpuFeatures(): CpuFeatures {
  return native.cpuFeatures() as CpuFeatures;
}

/**
 * KVDRIVE_SIMD names the level the addon starts with. The addon ignores a value it cannot honour
 * (a typo, a level this CPU lacks) and takes the best level: refused here instead, so that a run
 * meant to measure or test one level never silently measures another.
 */
function checkSimdEnv(): void {
  const want = process.env.KVDRIVE_SIMD;
  if (!want) return;
  const { levels } = cpuFeatures();
  if (!(['scalar', 'avx2', 'avx512'] as string[]).includes(want))
    throw new KvdriveError('E_CONFIG', `KVDRIVE_SIMD: expected scalar, avx2 or avx512 (or unset for the best level), got "${want}"`);
  if (!(levels as string[]).includes(want))
    throw new KvdriveError('E_CONFIG', `KVDRIVE_SIMD: expected a level this CPU has (${levels.join(', ')}), got "${want}"`);
}

/** Forces a SIMD level for all kernels in this process ('best' restores the default). */
export function setSimdLevel(level: SimdLevel | 'best'): SimdLevel {
  return native.setSimdLevel(level) as SimdLevel;
}
