// SpdkReadCache against a scripted SpdkRpc: what it serves from a listing or an earlier read, and
// every way a served answer is invalidated (mutations, overlap, TTL, a new connection).
import { expect, test } from "bun:test";
import { ManualClock } from "../clock.ts";
import type { SpdkRpc } from "./client.ts";
import { SpdkError } from "./errors.ts";
import { SpdkReadCache } from "./read-cache.ts";

/** A target with subsystems and bdevs as plain records; counts every call that reaches it. */
function fakeTarget() {
  const subs = new Map<string, { nqn: string; hosts: string[] }>();
  const bdevs = new Map<string, { name: string; aliases: string[] }>();
  const calls: string[] = [];
  let hold: Promise<void> | undefined;
  const rpc: SpdkRpc & { connectionGeneration: number } = {
    connectionGeneration: 1,
    serialize: (_k, fn) => fn(),
    async call(method, params) {
      calls.push(method);
      const p = (params ?? {}) as Record<string, string>;
      if (hold) await hold;
      switch (method) {
        case "nvmf_get_subsystems": {
          if (p.nqn === undefined) return [...subs.values()];
          const s = subs.get(p.nqn);
          if (!s) throw new SpdkError(method, -19, "No such device", { params });
          return [structuredClone(s)];
        }
        case "bdev_get_bdevs": {
          if (p.name === undefined) return [...bdevs.values()];
          const b = [...bdevs.values()].find(
            (x) => x.name === p.name || x.aliases.includes(p.name as string),
          );
          if (!b) throw new SpdkError(method, -19, "No such device", { params });
          return [structuredClone(b)];
        }
        case "nvmf_subsystem_add_host":
          subs.get(p.nqn as string)?.hosts.push(p.host as string);
          return true;
        case "nvmf_create_subsystem":
          subs.set(p.nqn as string, { nqn: p.nqn as string, hosts: [] });
          return true;
        case "bdev_lvol_resize":
          return true;
        default:
          return true;
      }
    },
  };
  return {
    subs,
    bdevs,
    calls,
    rpc,
    holdReplies(): () => void {
      let release = () => {};
      hold = new Promise((r) => {
        release = () => {
          hold = undefined;
          r();
        };
      });
      return release;
    },
  };
}

const A = "nqn.2024-01.io.distort:a";
const B = "nqn.2024-01.io.distort:b";

test("a listing answers every per-NQN read, absent ones with SPDK's -19, without a call", async () => {
  const t = fakeTarget();
  t.subs.set(A, { nqn: A, hosts: [] });
  const c = new SpdkReadCache({ rpc: t.rpc, clock: new ManualClock(0) });
  await c.load();
  expect(t.calls.sort()).toEqual(["bdev_get_bdevs", "nvmf_get_subsystems"]);
  expect(await c.call("nvmf_get_subsystems", { nqn: A })).toEqual([{ nqn: A, hosts: [] }]);
  const err = await c.call("nvmf_get_subsystems", { nqn: B }).catch((e) => e);
  expect(err).toBeInstanceOf(SpdkError);
  expect((err as SpdkError).code).toBe(-19);
  expect((err as SpdkError).kind).toBe("not-found");
  expect(t.calls).toHaveLength(2);
});

test("a mutation of one subsystem sends its next read to the target; others stay served", async () => {
  const t = fakeTarget();
  t.subs.set(A, { nqn: A, hosts: [] });
  t.subs.set(B, { nqn: B, hosts: [] });
  const c = new SpdkReadCache({ rpc: t.rpc, clock: new ManualClock(0) });
  await c.load();
  await c.call("nvmf_subsystem_add_host", { nqn: A, host: "h1" });
  const n = t.calls.length;
  expect(await c.call("nvmf_get_subsystems", { nqn: A })).toEqual([{ nqn: A, hosts: ["h1"] }]);
  expect(t.calls.length).toBe(n + 1);
  await c.call("nvmf_get_subsystems", { nqn: B });
  expect(t.calls.length).toBe(n + 1);
  // The fresh read is kept: the pass's second read of A is served.
  await c.call("nvmf_get_subsystems", { nqn: A });
  expect(t.calls.length).toBe(n + 1);
});

test("a read answered while a mutation of the same record was in flight is not kept", async () => {
  const t = fakeTarget();
  t.subs.set(A, { nqn: A, hosts: [] });
  const c = new SpdkReadCache({ rpc: t.rpc, clock: new ManualClock(0) });
  const release = t.holdReplies();
  const read = c.call("nvmf_get_subsystems", { nqn: A });
  const write = c.call("nvmf_subsystem_add_host", { nqn: A, host: "h1" });
  release();
  await Promise.all([read, write]);
  const n = t.calls.length;
  expect(await c.call("nvmf_get_subsystems", { nqn: A })).toEqual([{ nqn: A, hosts: ["h1"] }]);
  expect(t.calls.length).toBe(n + 1);
});

test("a listing sent before a mutation does not answer for the mutated record", async () => {
  const t = fakeTarget();
  const c = new SpdkReadCache({ rpc: t.rpc, clock: new ManualClock(0) });
  const release = t.holdReplies();
  const listing = c.load();
  const create = c.call("nvmf_create_subsystem", { nqn: A });
  release();
  await Promise.all([listing, create]);
  expect(await c.call("nvmf_get_subsystems", { nqn: A })).toEqual([{ nqn: A, hosts: [] }]);
  expect(t.calls.filter((m) => m === "nvmf_get_subsystems")).toHaveLength(2);
});

test("nothing is served after the TTL or over a new connection", async () => {
  const t = fakeTarget();
  t.subs.set(A, { nqn: A, hosts: [] });
  const clock = new ManualClock(0);
  const c = new SpdkReadCache({ rpc: t.rpc, clock, ttlMs: 1000 });
  await c.load();
  clock.advance(1000);
  await c.call("nvmf_get_subsystems", { nqn: A });
  expect(t.calls).toHaveLength(3);
  t.rpc.connectionGeneration = 2;
  await c.call("nvmf_get_subsystems", { nqn: A });
  expect(t.calls).toHaveLength(4);
});

test("bdevs: a read is kept under its name and aliases; absent is never served; any bdev mutation drops all", async () => {
  const t = fakeTarget();
  t.bdevs.set("u1", { name: "u1", aliases: ["lvs/v1"] });
  const c = new SpdkReadCache({ rpc: t.rpc, clock: new ManualClock(0) });
  await c.call("bdev_get_bdevs", { name: "lvs/v1" });
  await c.call("bdev_get_bdevs", { name: "u1" });
  expect(t.calls).toEqual(["bdev_get_bdevs"]);
  await c.call("bdev_get_bdevs", { name: "lvs/v2" }).catch(() => {});
  await c.call("bdev_get_bdevs", { name: "lvs/v2" }).catch(() => {});
  expect(t.calls).toHaveLength(3);
  // Waiting for examine changes no bdev it found: still served.
  await c.call("bdev_wait_for_examine");
  await c.call("bdev_get_bdevs", { name: "u1" });
  expect(t.calls).toHaveLength(4);
  await c.call("bdev_lvol_resize", { name: "u1", size_in_mib: 8 });
  await c.call("bdev_get_bdevs", { name: "u1" });
  expect(t.calls.slice(-1)).toEqual(["bdev_get_bdevs"]);
  expect(t.calls).toHaveLength(6);
});

test("a read with other parameters, and a method it does not know, pass straight through", async () => {
  const t = fakeTarget();
  t.subs.set(A, { nqn: A, hosts: [] });
  const c = new SpdkReadCache({ rpc: t.rpc, clock: new ManualClock(0) });
  await c.load();
  await c.call("nvmf_get_subsystems", { nqn: A, tgt_name: "x" });
  expect(t.calls).toHaveLength(3);
  // An unknown method may have changed anything: the listing no longer answers.
  await c.call("some_future_method", {});
  await c.call("nvmf_get_subsystems", { nqn: A });
  expect(t.calls).toHaveLength(5);
});
