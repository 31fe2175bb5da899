// Test stage module (loaded by stage workers). Descriptor user words: [op, a, b, c].
//   op 0: c = a * init.mul + init.add (and, with init.arena, also arena[b] += c as f64)
//   op 1: throw an Error   op 2: process.exit(3)   op 3: uncaught error from a timer
//   op 4: spin forever (only for close-timeout tests)
//   op 5: with init.gate, set word 0 of the gate and wait until word 1 is set; then as op 0
//   op 6: allocate JS heap without bound (for resource-limit tests)
// init.failInit: createStage throws. init.failOnRespawn: throw when ctx shows a replacement
// (a SharedArrayBuffer counter `init.starts` counts createStage calls per worker index 0).
export function createStage(init, ctx) {
  if (init?.failInit) throw new Error('init refused');
  if (init?.exitInit) process.exit(5);
  if (init?.starts) {
    const n = Atomics.add(new Int32Array(init.starts), ctx.worker, 1);
    if (init.failOnRespawn && n > 0) throw new Error('replacement refused');
  }
  const arena = init?.arena ? new Float64Array(init.arena) : undefined;
  // control: {set: n} changes `add` after an async delay (the loop must not run batches meanwhile);
  // {fail: code} throws an error carrying that code.
  const control = async (req) => {
    if (req.fail) throw Object.assign(new Error(`refused ${req.fail}`), { name: 'KvdriveError', code: req.fail });
    await new Promise((r) => setTimeout(r, 20));
    init.add = req.set;
    return { worker: ctx.worker, add: init.add };
  };
  const run = (desc) => {
    switch (desc[0]) {
      case 1:
        throw new Error(`boom ${desc[1]}`);
      case 2:
        process.exit(3);
      case 3:
        setTimeout(() => {
          throw new Error('async boom');
        }, 0);
        return new Promise(() => {});
      case 4:
        for (;;);
      case 6: {
        const hoard = [];
        for (;;) hoard.push(new Array(1 << 16).fill(desc[1]));
      }
      case 5:
        if (init.gate) {
          const g = new Int32Array(init.gate);
          Atomics.store(g, 0, 1);
          while (Atomics.load(g, 1) === 0) Atomics.wait(g, 1, 0, 100);
        }
      // falls through
      default:
        desc[3] = desc[1] * init.mul + init.add;
        if (arena) arena[desc[2]] += desc[3];
    }
  };
  return init?.plain ? run : { run, control };
}
