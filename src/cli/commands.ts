/** The list of subcommands; each entry adds one command to the program. */
import type { Command } from 'commander';
import { register as registerGenerate } from './generate.js';
import { register as synth } from './synth.js';
import { register as profile } from './profile.js';
import { register as solveWindows } from './solve-windows.js';

export type RegisterCommand = (program: Command) => void;

export const commands: RegisterCommand[] = [registerGenerate, synth, profile, solveWindows];
