// Homes of lvol bytes, apart from SPDK's accounting: first-fit runs for thick lvols (also in a
// hole a delete left), own containers otherwise, growth in place or a move (to a run, else an own
// container), shrinking in place, and checkpoints.
import { describe, expect, test } from "bun:test";
import { Lvol } from "./blobstore.ts";
import { PhysicalMap } from "./physical-map.ts";

// 64 clusters, the first one metadata.
const MD = 1;
const fresh = () => new PhysicalMap(64, MD);
const lvol = (name: string) => new Lvol(`uuid-${name}`, name, false, false, null, []);

describe("PhysicalMap", () => {
  test("thick lvols take the first run that fits, also in a hole left by a delete", () => {
    const pm = fresh();
    const [a, b, c] = [lvol("a"), lvol("b"), lvol("c")];
    expect(pm.place(a, 2, true)).toEqual({ kind: "run", start: MD, count: 2 });
    expect(pm.place(b, 3, true)).toEqual({ kind: "run", start: MD + 2, count: 3 });
    expect(pm.place(c, 2, true)).toEqual({ kind: "run", start: MD + 5, count: 2 });
    expect(pm.remove(b)).toEqual({ kind: "run", start: MD + 2, count: 3 });
    // Too big for the hole: after c. Small enough: in the hole, first fit.
    expect(pm.place(lvol("big"), 4, true)).toEqual({ kind: "run", start: MD + 7, count: 4 });
    expect(pm.place(lvol("d"), 2, true)).toEqual({ kind: "run", start: MD + 2, count: 2 });
    expect(pm.freeBaseClusters).toBe(63 - 10);
  });

  test("thin lvols, empty ones and thick ones no run fits get their own container", () => {
    const pm = fresh();
    expect(pm.place(lvol("thin"), 4, false)).toEqual({ kind: "own" });
    expect(pm.place(lvol("empty"), 0, true)).toEqual({ kind: "own" });
    expect(pm.place(lvol("huge"), 64, true)).toEqual({ kind: "own" });
    expect(pm.freeBaseClusters).toBe(63);
  });

  test("growth is in place when the next clusters are free, a move when not; shrinking is in place", () => {
    const pm = fresh();
    const [a, b] = [lvol("a"), lvol("b")];
    pm.place(a, 2, true);
    pm.place(b, 2, true);
    // b is last: it grows in place; only the new clusters need zeroing.
    const grown = pm.resize(b, 2, 4);
    expect(grown).toMatchObject({
      after: { kind: "run", start: MD + 2, count: 4 },
      zero: { start: MD + 4, count: 2 },
      released: undefined,
    });
    // a is boxed in by b: it moves to the first run of 3 after b; the new run is zeroed whole
    // (the caller copies the old bytes in), the old one released.
    expect(pm.resize(a, 2, 3)).toMatchObject({
      before: { kind: "run", start: MD, count: 2 },
      after: { kind: "run", start: MD + 6, count: 3 },
      zero: { start: MD + 6, count: 3 },
      released: { start: MD, count: 2 },
    });
    // Shrinking keeps the start and frees the tail.
    expect(pm.resize(a, 3, 1)).toMatchObject({
      after: { kind: "run", start: MD + 6, count: 1 },
      released: { start: MD + 7, count: 2 },
    });
    // The freed front is reused first.
    expect(pm.place(lvol("c"), 2, true)).toEqual({ kind: "run", start: MD, count: 2 });
  });

  test("a run that fits nowhere moves into its own container", () => {
    const pm = fresh();
    const a = lvol("a");
    pm.place(a, 2, true);
    pm.place(lvol("b"), 60, true);
    const plan = pm.resize(a, 2, 8);
    expect(plan).toMatchObject({
      after: { kind: "own" },
      zero: undefined,
      released: { start: MD, count: 2 },
    });
    expect(pm.home(a)).toEqual({ kind: "own" });
    // An own container just changes length.
    const same = pm.resize(a, 8, 2);
    expect(same.after).toBe(same.before);
  });

  test("adopt marks a stored run used; checkpoint puts homes and runs back", () => {
    const pm = fresh();
    const a = lvol("a");
    pm.adopt(a, { kind: "run", start: 10, count: 4 });
    expect(pm.findRun(10)).toBe(14);
    expect(() => pm.adopt(lvol("bad"), { kind: "run", start: 0, count: 1 })).toThrow();
    const undo = pm.checkpoint();
    pm.resize(a, 4, 8);
    pm.place(lvol("b"), 3, true);
    undo();
    expect(pm.home(a)).toEqual({ kind: "run", start: 10, count: 4 });
    expect(pm.freeBaseClusters).toBe(63 - 4);
  });
});
