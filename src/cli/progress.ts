/**
 * A small progress bar on stderr. On a terminal it redraws one line; elsewhere (CI logs, pipes) it
 * prints a line per 10% so logs stay short but still show that work is moving.
 */
export class ProgressBar {
  private done = 0;
  private lastDecile = -1;
  private readonly start = performance.now();
  private readonly tty: boolean;

  constructor(
    private readonly total: number,
    private readonly label: string,
    private readonly stream: NodeJS.WriteStream = process.stderr,
  ) {
    this.tty = !!stream.isTTY;
  }

  /** Advances by `n` units and shows `status` (e.g. the phase being run). */
  tick(status = '', n = 1): void {
    this.done = Math.min(this.total, this.done + n);
    const frac = this.total === 0 ? 1 : this.done / this.total;
    const secs = ((performance.now() - this.start) / 1000).toFixed(1);
    if (this.tty) {
      const width = 28;
      const filled = Math.round(frac * width);
      const bar = '█'.repeat(filled) + '░'.repeat(width - filled);
      this.stream.write(`\r${this.label} ${bar} ${(frac * 100).toFixed(0).padStart(3)}% ${secs}s ${status}`.slice(0, 120).padEnd(120));
    } else {
      const decile = Math.floor(frac * 10);
      if (decile !== this.lastDecile) {
        this.lastDecile = decile;
        this.stream.write(`${this.label} ${(frac * 100).toFixed(0)}% (${secs}s) ${status}\n`);
      }
    }
  }

  /** Ends the bar (moves to a new line on a terminal). */
  finish(): void {
    if (this.done < this.total) this.tick('done', this.total - this.done);
    if (this.tty) this.stream.write('\n');
  }
}
