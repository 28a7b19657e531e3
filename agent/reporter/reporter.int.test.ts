// The reporter against a real kube-apiserver, on a simulated host (sysfs, lsblk, ip) and SPDK
// replies: devices created once and kept current, claimed capacity aggregated, drives missing from
// a complete scan marked Unavailable with their claim kept, never on a degraded scan, heartbeats
// advancing on the Clock, Events recorded.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { API_VERSION } from "../../api/common.ts";
import { kinds } from "../../api/kinds.ts";
import type { NVMeDevice } from "../../api/nvme-device.ts";
import type { RDMAStorageNode } from "../../api/rdma-storage-node.ts";
import { eventually, type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { buildSysfs, type SimController, type SimHostSpec } from "../../lab/sim/sysfs/build-sysfs.ts";
import { type ScratchRoot, scratchRoot } from "../../lab/sim/sysfs/scratch-root.ts";
import { ManualClock } from "../../lib/clock.ts";
import { WatchCache } from "../../lib/kube/cache.ts";
import { EventRecorder } from "../../lib/kube/events.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { createLogger, silentLogger } from "../../lib/log.ts";
import { allocatableBytes } from "../discovery/capacity.ts";
import { nvmeDeviceName } from "../discovery/device-name.ts";
import { discoverDevices } from "../discovery/discover.ts";
import { hostNetworkSource } from "../discovery/network-source.ts";
import { findRdmaEndpoint } from "../discovery/rdma-endpoint.ts";
import type { SpdkInventorySource } from "../discovery/spdk-source.ts";
import { type SpdkDrive, spdkBdevs, spdkControllers } from "../discovery/testdata/spdk-replies.ts";
import { PRESENT } from "./device-object.ts";
import { Reporter } from "./reporter.ts";

const GiB = 1024 ** 3;
const T0 = Date.parse("2026-03-01T00:00:00Z");

let tc: TestCluster;
let devices: ResourceClient<NVMeDevice>;
let storageNodes: ResourceClient<RDMAStorageNode>;
let scratch: ScratchRoot;
beforeAll(async () => {
  tc = await testCluster();
  devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  storageNodes = new ResourceClient(tc.conn, kinds.RDMAStorageNode);
  scratch = await scratchRoot("distort-reporter");
}, 300_000);
afterAll(async () => {
  await scratch?.remove();
  await tc?.stop();
});

const kernelDrive = (n: number, gib: number, extra: Partial<SimController> = {}): SimController => ({
  name: `nvme${n}`,
  transport: "pcie",
  pciAddress: `0000:${(0x3b + n).toString(16)}:00.0`,
  serial: `S4EWNX0R00000${n}`,
  model: "SAMSUNG MZQL23T8HCLS",
  numaNode: n % 2,
  ns1Bytes: gib * GiB,
  ...extra,
});
const SPDK_DRIVE: SpdkDrive = {
  name: "Nvme0",
  pciAddress: "0000:81:00.0",
  serial: "PHLJ9100",
  model: "INTEL SSDPE2KX040T8",
  namespaces: [{ nsid: 1, blockSize: 4096, numBlocks: 78_643_200 }], // 300 GiB
};
const HOST: SimHostSpec = {
  controllers: [
    kernelDrive(0, 100),
    kernelDrive(1, 200),
    {
      name: "nvme2",
      transport: "tcp",
      serial: "SPDK00000000000001",
      model: "SPDK bdev Controller",
      ns1Bytes: GiB,
    },
    kernelDrive(3, 50, { mounted: "/" }),
  ],
  rdma: [
    { device: "mlx5_0", state: "ACTIVE", rateGbps: 100, netdev: "ens1f0", address: "192.168.100.10/24" },
  ],
};

/** One simulated storage node with its reporter, SPDK replies and export count under test control. */
async function storageNode(
  spec: SimHostSpec = HOST,
  listDevices?: (node: string) => () => Promise<NVMeDevice[]>,
) {
  const ns = await tc.namespace("reporter");
  const node = `node-${randomBytes(4).toString("hex")}`;
  const sim = await buildSysfs(join(scratch.path, node), spec);
  const spdk = { drives: [SPDK_DRIVE] as SpdkDrive[], down: false };
  const source: SpdkInventorySource = {
    listControllers: async () => {
      if (spdk.down) throw new Error("connect ECONNREFUSED /var/tmp/spdk.sock");
      return spdkControllers(spdk.drives);
    },
    getBdevs: async () => {
      if (spdk.down) throw new Error("connect ECONNREFUSED /var/tmp/spdk.sock");
      return spdkBdevs(spdk.drives);
    },
  };
  const clock = new ManualClock(T0);
  const exports = { count: 0 };
  const recorderLog: string[] = [];
  const reporter = new Reporter(
    {
      devices,
      ...(listDevices ? { listDevices: listDevices(node) } : {}),
      storageNodes,
      discover: () => discoverDevices({ fs: sim.fs, exec: sim.exec, spdk: source, logger: silentLogger }),
      findEndpoint: () => findRdmaEndpoint(hostNetworkSource(sim.fs, sim.exec)),
      exportCount: async () => exports.count,
      // Events about cluster-scoped NVMeDevices go to "default": the apiserver refuses them elsewhere.
      events: new EventRecorder(tc.conn, {
        controller: "storage.distort.io/agent",
        instance: node,
        logger: createLogger({ sink: (l) => recorderLog.push(l) }),
        now: () => clock.now(),
      }),
      clock,
      logger: silentLogger,
    },
    { nodeName: node, namespace: ns },
  );
  const nodeDevices = async () =>
    (await devices.list()).items
      .filter((d) => d.spec.nodeName === node)
      .sort((a, b) => a.spec.pciAddress.localeCompare(b.spec.pciAddress));
  const device = async (serial: string) => (await devices.get(nvmeDeviceName(node, serial))) as NVMeDevice;
  const record = async () => (await storageNodes.get(node, ns)) as RDMAStorageNode;
  const eventReasons = async () => {
    const api = tc.conn.api(k8s.EventsV1Api);
    const lists = await Promise.all(
      [ns, "default"].map((namespace) => api.listNamespacedEvent({ namespace })),
    );
    // Every write went through; a refused event would only show up in the recorder's log.
    expect(recorderLog).toEqual([]);
    return lists
      .flatMap((l) => l.items)
      .filter((e) => e.reportingInstance === node)
      .map((e) => e.reason ?? "");
  };
  /** Acts as the manager's claim reconciler would. */
  const claim = async (serial: string, freeBytes?: number) => {
    const d = await device(serial);
    return devices.replaceStatus({
      ...d,
      status: {
        ...(d.status ?? { reservations: [], conditions: [] }),
        phase: "Claimed",
        claimRef: { namespace: ns, name: `claim-${serial.toLowerCase()}`, uid: `uid-${serial}` },
        ...(freeBytes === undefined ? {} : { freeBytes }),
      },
    });
  };
  return {
    ns,
    node,
    sim,
    spdk,
    clock,
    exports,
    reporter,
    storageNodes,
    nodeDevices,
    device,
    record,
    eventReasons,
    claim,
  };
}

const cond = (
  obj: { status?: { conditions: { type: string; status: string; reason: string }[] } },
  type: string,
) => {
  const c = obj.status?.conditions.find((x) => x.type === type);
  return c ? `${c.status}/${c.reason}` : undefined;
};

test("a node with three drives: three NVMeDevices and a ready RDMAStorageNode; a second pass writes nothing", async () => {
  const h = await storageNode();
  const first = await h.reporter.reportOnce();
  expect(first.complete).toBe(true);
  expect(first.errors).toEqual([]);
  expect(first.created.length).toBe(3);

  const list = await h.nodeDevices();
  expect(
    list.map((d) => [d.metadata.name, d.spec.serial, d.spec.pciAddress, d.spec.allocatableBytes]),
  ).toEqual([
    [nvmeDeviceName(h.node, "S4EWNX0R000000"), "S4EWNX0R000000", "0000:3b:00.0", allocatableBytes(100 * GiB)],
    [nvmeDeviceName(h.node, "S4EWNX0R000001"), "S4EWNX0R000001", "0000:3c:00.0", allocatableBytes(200 * GiB)],
    [nvmeDeviceName(h.node, "PHLJ9100"), "PHLJ9100", "0000:81:00.0", allocatableBytes(300 * GiB)],
  ]);
  expect(list.map((d) => d.status?.phase)).toEqual(["Available", "Available", "Available"]);
  expect(list.map((d) => cond(d, PRESENT))).toEqual([
    "True/BoundToKernel",
    "True/BoundToKernel",
    "True/BoundToSpdk",
  ]);
  expect(list.map((d) => d.spec.numaNode)).toEqual([0, 1, -1]);

  const sn = await h.record();
  expect(sn.spec.nodeName).toBe(h.node);
  expect(sn.status).toMatchObject({
    rdmaIP: "192.168.100.10",
    transport: "rdma",
    linkSpeedMbps: 100_000,
    totalBytes: 0, // nothing claimed yet
    freeBytes: 0,
    exportCount: 0,
    lastHeartbeatTime: new Date(T0).toISOString(),
  });
  expect(
    ["Ready", "KernelInventoryReady", "SpdkInventoryReady", "NVMeInventoryReady"].map((t) => cond(sn, t)),
  ).toEqual(["True/RdmaEndpointReady", "True/Scanned", "True/Scanned", "True/InventoryComplete"]);
  await eventually(
    async () => (await h.eventReasons()).filter((r) => r === "DeviceDiscovered").length === 3,
    10_000,
    "three DeviceDiscovered events",
  );

  const versions = list.map((d) => d.metadata.resourceVersion);
  const second = await h.reporter.reportOnce();
  expect([second.created, second.updated, second.unavailable, second.errors]).toEqual([[], [], [], []]);
  expect((await h.nodeDevices()).map((d) => d.metadata.resourceVersion)).toEqual(versions);
});

test("claimed capacity is aggregated; export count and heartbeat follow each pass", async () => {
  const h = await storageNode();
  await h.reporter.reportOnce();
  await h.claim("S4EWNX0R000000", 60 * GiB);
  await h.claim("PHLJ9100"); // not yet accounted by the manager: counts as 0 free
  h.exports.count = 2;
  h.clock.advance(30_000);
  await h.reporter.reportOnce();
  const sn = await h.record();
  expect(sn.status).toMatchObject({
    totalBytes: allocatableBytes(100 * GiB) + allocatableBytes(300 * GiB),
    freeBytes: 60 * GiB,
    exportCount: 2,
    lastHeartbeatTime: new Date(T0 + 30_000).toISOString(),
  });
  // The reporter kept the manager's claim and phase.
  expect((await h.device("S4EWNX0R000000")).status).toMatchObject({ phase: "Claimed", freeBytes: 60 * GiB });
});

test("a heartbeat between full passes moves lastHeartbeatTime alone; none before the first pass; a later pass never moves it back", async () => {
  const h = await storageNode();
  // No status yet: nothing to beat for (the manager sees no heartbeat, fail closed).
  expect(await h.reporter.heartbeat()).toBe(false);
  expect(h.reporter.lastHeartbeatMs()).toBeUndefined();
  await h.reporter.reportOnce();
  expect(h.reporter.lastHeartbeatMs()).toBe(T0);
  const first = await h.record();
  h.clock.advance(2_000);
  expect(await h.reporter.heartbeat()).toBe(true);
  const beat = await h.record();
  expect(beat.status?.lastHeartbeatTime).toBe(new Date(T0 + 2_000).toISOString());
  expect(h.reporter.lastHeartbeatMs()).toBe(T0 + 2_000);
  // Everything but the heartbeat is the full pass's.
  expect({ ...beat.status, lastHeartbeatTime: undefined }).toEqual({
    ...first.status,
    lastHeartbeatTime: undefined,
  });
  // A heartbeat that landed while a full pass ran is newer than the pass's clock: the pass keeps it.
  const later = new Date(T0 + 9_000).toISOString();
  const status = beat.status as NonNullable<RDMAStorageNode["status"]>;
  await h.storageNodes.replaceStatus({ ...beat, status: { ...status, lastHeartbeatTime: later } });
  h.clock.advance(1_000);
  await h.reporter.reportOnce();
  expect((await h.record()).status?.lastHeartbeatTime).toBe(later);
  expect(h.reporter.lastHeartbeatMs()).toBe(T0 + 2_000);
});

test("a drive gone from a complete scan is Unavailable with its claim kept, and comes back Claimed", async () => {
  const h = await storageNode();
  await h.reporter.reportOnce();
  const claimed = await h.claim("S4EWNX0R000001", 150 * GiB);
  const claimRef = claimed.status?.claimRef;

  await h.sim.rebuild({ ...HOST, controllers: HOST.controllers?.filter((c) => c.name !== "nvme1") });
  h.clock.advance(30_000);
  const pass = await h.reporter.reportOnce();
  expect(pass.complete).toBe(true);
  expect(pass.unavailable).toEqual([nvmeDeviceName(h.node, "S4EWNX0R000001")]);
  const gone = await h.device("S4EWNX0R000001");
  expect(gone.status?.phase).toBe("Unavailable");
  expect(gone.status?.claimRef).toEqual(claimRef);
  expect(gone.status?.freeBytes).toBe(150 * GiB);
  expect(cond(gone, PRESENT)).toBe("False/NotFound");
  // Its capacity no longer counts for the node.
  expect((await h.record()).status).toMatchObject({ totalBytes: 0, freeBytes: 0 });
  // The other drives are untouched.
  expect((await h.device("S4EWNX0R000000")).status?.phase).toBe("Available");
  await eventually(
    async () => (await h.eventReasons()).includes("DeviceMissing"),
    10_000,
    "DeviceMissing event",
  );

  await h.sim.rebuild(HOST);
  const back = await h.reporter.reportOnce();
  expect(back.restored).toEqual([nvmeDeviceName(h.node, "S4EWNX0R000001")]);
  const returned = await h.device("S4EWNX0R000001");
  expect(returned.status?.phase).toBe("Claimed");
  expect(returned.status?.claimRef).toEqual(claimRef);
  expect((await h.record()).status?.totalBytes).toBe(allocatableBytes(200 * GiB));
});

test("a drive gone during a degraded scan is not marked Unavailable; placement is blocked instead", async () => {
  const h = await storageNode();
  await h.reporter.reportOnce();
  await h.claim("S4EWNX0R000000", 90 * GiB);

  // The kernel drive disappears while SPDK cannot be asked: the scan is incomplete.
  await h.sim.rebuild({ ...HOST, controllers: HOST.controllers?.filter((c) => c.name !== "nvme0") });
  h.spdk.down = true;
  const degraded = await h.reporter.reportOnce();
  expect(degraded.complete).toBe(false);
  expect(degraded.unavailable).toEqual([]);
  expect((await h.device("S4EWNX0R000000")).status?.phase).toBe("Claimed");
  expect((await h.device("PHLJ9100")).status?.phase).toBe("Available"); // unseen SPDK drive: unknown, untouched
  let sn = await h.record();
  expect(cond(sn, "NVMeInventoryReady")).toBe("False/SpdkInventoryNotReady");
  expect(cond(sn, "SpdkInventoryReady")).toBe("False/RpcFailed");
  expect(cond(sn, "KernelInventoryReady")).toBe("True/Scanned");
  expect(cond(sn, "Ready")).toBe("True/RdmaEndpointReady");
  await eventually(
    async () => (await h.eventReasons()).includes("InventoryIncomplete"),
    10_000,
    "InventoryIncomplete event",
  );

  // SPDK answers again: the scan is complete, so now the absence counts.
  h.spdk.down = false;
  const complete = await h.reporter.reportOnce();
  expect(complete.complete).toBe(true);
  expect(complete.unavailable).toEqual([nvmeDeviceName(h.node, "S4EWNX0R000000")]);
  const gone = await h.device("S4EWNX0R000000");
  expect(gone.status?.phase).toBe("Unavailable");
  expect(gone.status?.claimRef?.name).toBe("claim-s4ewnx0r000000");
  sn = await h.record();
  expect(cond(sn, "NVMeInventoryReady")).toBe("True/InventoryComplete");
});

test("capacity and model are kept current; identity fields are never changed", async () => {
  const h = await storageNode({ ...HOST, controllers: [kernelDrive(0, 100)] });
  h.spdk.drives = [];
  // Someone else's object already holds the name our second drive would get.
  const squatted = nvmeDeviceName(h.node, "S4EWNX0R000001");
  await devices.create({
    apiVersion: API_VERSION,
    kind: "NVMeDevice",
    metadata: { name: squatted },
    spec: {
      nodeName: "elsewhere",
      pciAddress: "0000:01:00.0",
      serial: "NOT-OURS",
      model: "X",
      allocatableBytes: GiB,
      numaNode: -1,
    },
  });
  await h.reporter.reportOnce();
  const before = await h.device("S4EWNX0R000000");

  await h.sim.rebuild({
    ...HOST,
    controllers: [
      kernelDrive(0, 120, { model: "SAMSUNG MZQL23T8HCLS-NEW", pciAddress: "0000:5e:00.0" }),
      kernelDrive(1, 200),
    ],
  });
  const pass = await h.reporter.reportOnce();
  expect(pass.updated).toEqual([before.metadata.name]);
  expect(pass.errors.length).toBe(1);
  expect(pass.errors[0]).toContain(squatted);
  const after = await h.device("S4EWNX0R000000");
  expect(after.metadata.uid).toBe(before.metadata.uid);
  expect(after.spec).toEqual({
    ...before.spec,
    allocatableBytes: allocatableBytes(120 * GiB),
    model: "SAMSUNG MZQL23T8HCLS-NEW",
    pciAddress: "0000:5e:00.0",
  });
  const foreign = (await devices.get(squatted)) as NVMeDevice;
  expect(foreign.spec).toMatchObject({ nodeName: "elsewhere", serial: "NOT-OURS" });
  expect(foreign.status).toBeUndefined();
  await eventually(
    async () => (await h.eventReasons()).includes("DeviceIdentityConflict"),
    10_000,
    "conflict event",
  );
  await devices.delete(squatted);
});

test("the loop reports on its Clock: a heartbeat every period (devices from a node-scoped watch)", async () => {
  // The production wiring: a watch cache limited to this node by the selectable field spec.nodeName.
  const caches: WatchCache<NVMeDevice>[] = [];
  const h = await storageNode(HOST, (node) => {
    const cache = new WatchCache(devices, { fieldSelector: `spec.nodeName=${node}`, logger: silentLogger });
    caches.push(cache);
    return async () => {
      await cache.start();
      return cache.list();
    };
  });
  const ctl = new AbortController();
  const running = h.reporter.run(ctl.signal);
  await eventually(
    async () => (await storageNodes.get(h.node, h.ns))?.status?.lastHeartbeatTime,
    20_000,
    "first pass",
  );
  expect((await h.record()).status?.lastHeartbeatTime).toBe(new Date(T0).toISOString());
  await eventually(() => h.clock.pendingTimers > 0, 10_000, "the loop to wait for the next period");
  h.clock.advance(29_999);
  expect((await h.record()).status?.lastHeartbeatTime).toBe(new Date(T0).toISOString());
  h.clock.advance(1);
  await eventually(
    async () => (await h.record()).status?.lastHeartbeatTime === new Date(T0 + 30_000).toISOString(),
    20_000,
    "second heartbeat",
  );
  await eventually(() => caches[0]?.list().length === 3, 10_000, "the cache to see the three devices");
  ctl.abort();
  await running;
  await Promise.all(caches.map((c) => c.stop()));
});
