import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ManualClock } from "../../lib/clock.ts";
import { createLogger } from "../../lib/log.ts";
import { parseFenceRecord } from "./lease.ts";
import { TargetWatchdog } from "./watchdog.ts";

const T = 1_000_000;
const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** A target with listeners whose ANA states the watchdog's calls change; it records every call. */
function fakeTarget(subsystems: Record<string, string[]>) {
  const ana = new Map<string, string>();
  for (const [nqn, addrs] of Object.entries(subsystems))
    for (const a of addrs) ana.set(`${nqn} ${a}`, "optimized");
  const calls: string[] = [];
  return {
    ana,
    calls,
    spdk: {
      async nvmfGetSubsystems() {
        calls.push("nvmf_get_subsystems");
        return Object.keys(subsystems).map((nqn) => ({ nqn }) as never);
      },
      async nvmfSubsystemGetListeners(nqn: string) {
        calls.push(`get_listeners ${nqn}`);
        return (subsystems[nqn] ?? []).map(
          (traddr) =>
            ({
              address: { trtype: "TCP", adrfam: "IPv4", traddr, trsvcid: "4420" },
              ana_states: [{ ana_group: 1, ana_state: ana.get(`${nqn} ${traddr}`) }],
            }) as never,
        );
      },
      async nvmfSubsystemListenerSetAnaState(p: {
        nqn: string;
        listen_address: { traddr: string };
        ana_state: string;
      }) {
        calls.push(`set ${p.nqn} ${p.listen_address.traddr} ${p.ana_state}`);
        ana.set(`${p.nqn} ${p.listen_address.traddr}`, p.ana_state);
      },
    },
  };
}

function setup(subsystems: Record<string, string[]>) {
  const dir = mkdtempSync(join(tmpdir(), "distort-watchdog-"));
  dirs.push(dir);
  const clock = new ManualClock(T);
  const target = fakeTarget(subsystems);
  const lines: string[] = [];
  const dog = new TargetWatchdog({
    leasePath: join(dir, "lease.json"),
    recordPath: join(dir, "record.json"),
    node: "n1",
    spdk: target.spdk,
    clock,
    logger: createLogger({ level: "debug", sink: (l) => void lines.push(l) }),
  });
  const writeLease = (o: object) => writeFileSync(join(dir, "lease.json"), JSON.stringify(o));
  return { dir, clock, target, dog, lines, writeLease };
}

test("no lease: nothing is called on the target", async () => {
  const s = setup({ "nqn.a": ["10.0.0.1"] });
  expect(await s.dog.poll()).toEqual({ due: [], set: [], held: true });
  expect(s.target.calls).toEqual([]);
});

test("past the deadline every listener of each listed subsystem goes inaccessible, the record says what, an unlisted one is left alone", async () => {
  const s = setup({ "nqn.a": ["10.0.0.1", "10.0.0.2"], "nqn.b": ["10.0.0.1"], "nqn.single": ["10.0.0.1"] });
  s.writeLease({
    version: 1,
    node: "n1",
    heartbeatMs: T,
    fenceAtMs: T + 3_000,
    nqns: ["nqn.a", "nqn.b", "nqn.gone"],
  });
  expect((await s.dog.poll()).due).toEqual([]);
  s.clock.advance(3_000);
  expect((await s.dog.poll()).due).toEqual([]);
  expect(s.target.calls).toEqual([]);
  s.clock.advance(1);
  const r = await s.dog.poll();
  expect(r.held).toBe(true);
  expect(r.set.sort()).toEqual(["nqn.a 10.0.0.1:4420", "nqn.a 10.0.0.2:4420", "nqn.b 10.0.0.1:4420"]);
  expect([...s.target.ana]).toEqual([
    ["nqn.a 10.0.0.1", "inaccessible"],
    ["nqn.a 10.0.0.2", "inaccessible"],
    ["nqn.b 10.0.0.1", "inaccessible"],
    ["nqn.single 10.0.0.1", "optimized"],
  ]);
  expect(s.target.calls.filter((c) => c.startsWith("set")).every((c) => c.endsWith("inaccessible"))).toBe(
    true,
  );
  const rec = parseFenceRecord(readFileSync(join(s.dir, "record.json"), "utf8"));
  expect(rec).toEqual({
    record: {
      version: 1,
      node: "n1",
      fencedAtMs: T + 3_001,
      leaseHeartbeatMs: T,
      fenceAtMs: T + 3_000,
      nqns: ["nqn.a", "nqn.b", "nqn.gone"],
    },
  });
  expect(s.lines.some((l) => l.includes("serving lease expired"))).toBe(true);
});

test("a fence that holds is checked again later and put back if something set a listener optimized", async () => {
  const s = setup({ "nqn.a": ["10.0.0.1"] });
  s.writeLease({ version: 1, node: "n1", heartbeatMs: T, fenceAtMs: T + 3_000, nqns: ["nqn.a"] });
  s.clock.advance(3_001);
  await s.dog.poll();
  s.target.ana.set("nqn.a 10.0.0.1", "optimized");
  s.target.calls.length = 0;
  s.clock.advance(250);
  expect((await s.dog.poll()).set).toEqual([]);
  expect(s.target.calls).toEqual([]);
  s.clock.advance(2_000);
  expect((await s.dog.poll()).set).toEqual(["nqn.a 10.0.0.1:4420"]);
  expect(s.target.ana.get("nqn.a 10.0.0.1")).toBe("inaccessible");
});

test("a malformed lease is logged and the last valid one stands; a renewed one is never fenced", async () => {
  const s = setup({ "nqn.a": ["10.0.0.1"] });
  s.writeLease({ version: 1, node: "n1", heartbeatMs: T, fenceAtMs: T + 3_000, nqns: ["nqn.a"] });
  await s.dog.poll();
  writeFileSync(join(s.dir, "lease.json"), "{ half");
  s.clock.advance(2_000);
  expect((await s.dog.poll()).due).toEqual([]);
  expect(s.lines.filter((l) => l.includes("serving lease malformed"))).toHaveLength(1);
  s.clock.advance(1_001);
  expect((await s.dog.poll()).set).toEqual(["nqn.a 10.0.0.1:4420"]);
  // Renewed by a live agent (which lifts the fence itself): the watchdog sets nothing back.
  s.target.ana.set("nqn.a 10.0.0.1", "optimized");
  s.writeLease({ version: 1, node: "n1", heartbeatMs: T + 3_500, fenceAtMs: T + 6_500, nqns: ["nqn.a"] });
  s.target.calls.length = 0;
  for (let i = 0; i < 10; i++) {
    s.clock.advance(250);
    expect((await s.dog.poll()).due).toEqual([]);
  }
  expect(s.target.calls).toEqual([]);
  expect(s.target.ana.get("nqn.a 10.0.0.1")).toBe("optimized");
});

test("a failing call leaves the fence unheld (retried next poll) and no record written", async () => {
  const s = setup({ "nqn.a": ["10.0.0.1"] });
  const set = s.target.spdk.nvmfSubsystemListenerSetAnaState;
  let fail = true;
  s.target.spdk.nvmfSubsystemListenerSetAnaState = async (p) => {
    if (fail) throw new Error("timeout");
    await set(p);
  };
  s.writeLease({ version: 1, node: "n1", heartbeatMs: T, fenceAtMs: T + 3_000, nqns: ["nqn.a"] });
  s.clock.advance(3_001);
  expect((await s.dog.poll()).held).toBe(false);
  expect(() => readFileSync(join(s.dir, "record.json"))).toThrow();
  fail = false;
  s.clock.advance(250);
  expect((await s.dog.poll()).held).toBe(true);
  expect(s.target.ana.get("nqn.a 10.0.0.1")).toBe("inaccessible");
});
