/** The list of subcommands; each entry adds one command to the program. */
import type { Command } from 'commander';
import { register as registerDemo } from './demo.js';
import { register as registerGenerate } from './generate.js';
import { register as registerEval } from './eval.js';
import { register as registerSynth } from './synth.js';
import { register as registerProfile } from './profile.js';
import { register as registerSolveWindows } from './solve-windows.js';
import { register as registerConvert } from './convert.js';
import { register as registerRandomGguf } from './random-gguf.js';

export type RegisterCommand = (program: Command) => void;

export const commands: RegisterCommand[] = [
  registerDemo,
  registerGenerate,
  registerEval,
  registerSynth,
  registerProfile,
  registerSolveWindows,
  registerConvert,
  registerRandomGguf,
];
