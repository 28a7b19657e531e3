// The node plugin's connection metrics: connects counted by result around the initiator, paths per
// kernel state and subsystems without a live path from a listing, and a reconnect counted when a
// path seen down is live again (a path that stays live, or appears live, is not one).
import { expect, test } from "bun:test";
import { silentLogger } from "../../lib/log.ts";
import { Registry } from "../../lib/metrics.ts";
import type { ConnectedSubsystem, NvmeInitiator } from "../host/nvme-initiator.ts";
import { csiNodeMetrics, meteredInitiator, PathObserver } from "./metrics.ts";

function scripted(listing: { now: ConnectedSubsystem[] }, failConnect: () => boolean): NvmeInitiator {
  return {
    connect: async () => {
      if (failConnect()) throw new Error("refused");
    },
    disconnect: async () => {},
    list: async () => listing.now,
    findNamespaceDevice: async () => undefined,
    rescan: async () => {},
  };
}

const sub = (nqn: string, states: string[], transport = "tcp"): ConnectedSubsystem => ({
  nqn,
  hostNqn: "nqn.h",
  name: `nvme-subsys-${nqn}`,
  paths: states.map((state, i) => ({
    name: `${nqn}-c${i}`,
    transport,
    traddr: "10.0.0.1",
    trsvcid: "4420",
    state,
  })),
});

test("connects are counted by result and errors still propagate", async () => {
  const m = csiNodeMetrics(new Registry());
  let fail = false;
  const init = meteredInitiator(
    scripted({ now: [] }, () => fail),
    m,
  );
  const params = { transport: "tcp", address: "10.0.0.1", port: 4420, nqn: "n", hostNqn: "h" } as const;
  await init.connect(params);
  fail = true;
  await expect(init.connect(params)).rejects.toThrow("refused");
  expect([m.connects.get({ result: "ok" }), m.connects.get({ result: "error" })]).toEqual([1, 1]);
});

test("paths by state, subsystems without a live path, and reconnects", async () => {
  const registry = new Registry();
  const m = csiNodeMetrics(registry);
  const listing = {
    now: [sub("a", ["live", "connecting"]), sub("b", ["resetting"]), sub("local", ["live"], "pcie")],
  };
  const obs = new PathObserver(
    scripted(listing, () => false),
    m,
    silentLogger,
  );
  await obs.observe();
  expect([
    m.paths.get({ state: "live" }),
    m.paths.get({ state: "connecting" }),
    m.paths.get({ state: "resetting" }),
  ]).toEqual([1, 1, 1]);
  expect(m.unreachable.get()).toBe(1);
  expect(m.reconnects.get()).toBe(0);
  // Both down paths come back; a new live subsystem appears.
  listing.now = [sub("a", ["live", "live"]), sub("b", ["live"]), sub("c", ["live"])];
  await obs.observe();
  expect(m.reconnects.get()).toBe(2);
  expect(m.paths.get({ state: "live" })).toBe(4);
  expect(registry.render()).not.toContain('state="connecting"');
  expect(m.unreachable.get()).toBe(0);
  await obs.observe();
  expect(m.reconnects.get()).toBe(2);
});
