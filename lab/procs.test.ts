// The lab's process table: restart after an unasked-for exit, no restart after stop, readiness
// failures carry the log, and pids.json follows the live processes.
import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ManualClock } from "../lib/clock.ts";
import { ProcessTable } from "./procs.ts";
import { stateDiff } from "./sweep.ts";

const dirs: string[] = [];
const tables: ProcessTable[] = [];
afterEach(async () => {
  for (const t of tables.splice(0)) await t.stopAll(1000);
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** A table whose restart back-off runs on a manual clock: tests step it instead of sleeping. */
function table(): { t: ProcessTable; dir: string; clock: ManualClock } {
  const dir = mkdtempSync(join(tmpdir(), "procs-"));
  dirs.push(dir);
  const clock = new ManualClock(Date.now());
  const t = new ProcessTable(dir, () => {}, clock);
  tables.push(t);
  return { t, dir, clock };
}

/** Longer than the longest restart delay: a restart that was going to happen has happened. */
const PAST_ANY_BACKOFF_MS = 60_000;

async function until<T>(fn: () => T | undefined, ms = 10_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = fn();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error("timed out");
    await Bun.sleep(20);
  }
}

test("a killed process comes back with a new pid and the exit is counted as unexpected", async () => {
  const { t, dir, clock } = table();
  await t.start({ name: "sleeper", argv: ["sleep", "30"] });
  const first = t.pid("sleeper");
  expect(first).toBeNumber();
  expect(JSON.parse(readFileSync(join(dir, "pids.json"), "utf8")).sleeper).toBe(first);
  await t.kill("sleeper");
  // Not before the first back-off step (200 ms), then as soon as it passed.
  await until(() => (t.state()[0]?.unexpectedExits === 1 ? true : undefined));
  clock.advance(199);
  expect(t.pid("sleeper")).toBeUndefined();
  clock.advance(1);
  const second = await until(() => {
    const p = t.pid("sleeper");
    return p !== undefined && p !== first ? p : undefined;
  });
  expect(second).not.toBe(first);
  const s = t.state().find((x) => x.name === "sleeper");
  expect(s?.unexpectedExits).toBe(1);
  expect(s?.restarts).toBe(1);
  expect(JSON.parse(readFileSync(join(dir, "pids.json"), "utf8")).sleeper).toBe(second);
  const log = readFileSync(t.logPath("sleeper"), "utf8");
  expect(log).toContain("signal SIGKILL");
  // Both runs are in the log: a restart appends.
  expect(log.match(/ start sleep 30/g)?.length).toBe(2);
});

test("a stopped process stays stopped and leaves pids.json", async () => {
  const { t, dir, clock } = table();
  await t.start({ name: "a/b", argv: ["sleep", "30"] });
  const pid = t.pid("a/b") as number;
  await t.stop("a/b", 1000);
  expect(t.pid("a/b")).toBeUndefined();
  expect(clock.pendingTimers).toBe(0); // no restart scheduled
  clock.advance(PAST_ANY_BACKOFF_MS); // and nothing comes back
  await Bun.sleep(0);
  expect(t.names()).toEqual([]);
  expect(() => process.kill(pid, 0)).toThrow();
  expect(JSON.parse(readFileSync(join(dir, "pids.json"), "utf8"))).toEqual({});
});

test("restart: false keeps a crashed process down", async () => {
  const { t, clock } = table();
  await t.start({ name: "once", argv: ["sh", "-c", "exit 3"], restart: false });
  await until(() => (t.state()[0]?.unexpectedExits === 1 ? true : undefined));
  expect(clock.pendingTimers).toBe(0);
  clock.advance(PAST_ANY_BACKOFF_MS);
  await Bun.sleep(0);
  expect(t.pid("once")).toBeUndefined();
  expect(t.state()[0]?.restarts).toBe(0);
});

test("a process that exits before it is ready fails start with its log", async () => {
  const { t } = table();
  await expect(
    t.start({ name: "bad", argv: ["sh", "-c", "echo cannot-bind >&2; exit 1"], ready: async () => false }),
  ).rejects.toThrow(/bad exited while starting[\s\S]*cannot-bind/);
});

test("stateDiff names what appeared and what went away", () => {
  const before = { loops: ["/dev/loop0 -> /a"], mounts: ["/"], labProcesses: [] };
  const after = { loops: ["/dev/loop1 -> /b"], mounts: ["/"], labProcesses: ["12 bun x"] };
  expect(stateDiff(before, after)).toEqual([
    "+ loops: /dev/loop1 -> /b",
    "- loops: /dev/loop0 -> /a",
    "+ labProcesses: 12 bun x",
  ]);
  expect(stateDiff(before, before)).toEqual([]);
});
