import { afterAll, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { baseKey } from "./image-plan.ts";
import { imageCachePaths, pruneImageCache } from "./images.ts";

const root = mkdtempSync(join(tmpdir(), "distort-prune-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

test("pruneImageCache removes only its own entries unused for longer than the limit", () => {
  const paths = imageCachePaths(root);
  const old = new Date(Date.now() - 10 * 86_400_000);
  const make = (p: string, dir: boolean, when?: Date) => {
    if (dir) mkdirSync(p, { recursive: true });
    else {
      mkdirSync(join(p, ".."), { recursive: true });
      writeFileSync(p, "x");
    }
    if (when) utimesSync(p, when, when);
    return p;
  };
  const staleArchive = make(join(paths.images, "a".repeat(24)), true, old);
  const freshArchive = make(join(paths.images, "b".repeat(24)), true);
  const foreign = make(join(paths.images, "c".repeat(32)), true, old); // not a name buildImages writes
  const staleBin = make(paths.binaryDir("d".repeat(24)), true, old);
  const staleBusybox = make(paths.busyboxDir("e".repeat(64)), true, old);
  const currentBase = make(paths.base(baseKey()), false, old);
  const otherBase = make(paths.base("f".repeat(16)), false, old);

  const removed = pruneImageCache({ cache: root, olderThanDays: 7 }).sort();
  expect(removed).toEqual([staleArchive, staleBin, staleBusybox, otherBase].sort());
  for (const p of removed) expect(existsSync(p)).toBe(false);
  for (const p of [freshArchive, foreign, currentBase]) expect(existsSync(p)).toBe(true);
});
