// A partition deleted while its drive is lost, against the real kube-apiserver and the nvmf_tgt
// emulator: the agent waits out DISTORT_LOST_DRIVE_RELEASE_AFTER_SECONDS, then lets the partition
// go with a DataOnLostDevice Warning naming the drive and node, touching nothing on the target;
// its ledger entry stays as a leftover the manager's capacity reconciler does not drop (the room
// stays held); when the drive is back, the agent deletes the volume and its export from it, drops
// the entry, and the capacity reconciler frees the room.
import { afterAll, beforeAll, expect, test } from "bun:test";
import * as k8s from "@kubernetes/client-node";
import { kinds, type NVMeDevice } from "../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import {
  placeOnReportedDrive,
  type SimStorageNode,
  startSimStorageNode,
} from "../lab/harness/storage-node.ts";
import { setCondition } from "../lib/kube/conditions.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { updateStatus } from "../lib/kube/status.ts";
import { createLogger, silentLogger } from "../lib/log.ts";
import { capacityReconciler } from "../manager/capacity/capacity-controller.ts";
import { Inventory } from "../manager/inventory.ts";
import { harness } from "../manager/testdata/harness.ts";
import { parseAgentConfig } from "./config.ts";
import { type RunningAgent, runAgent } from "./main.ts";
import { externalIdFor, nqnFor } from "./partitions/identity.ts";
import { nextDeviceStatus, PRESENT } from "./reporter/device-object.ts";

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
const SERIAL = "SIMLOST01";
const NODE = "node-lost";
const BOUND_S = 3;

let tc: TestCluster;
let node: SimStorageNode;
let agent: RunningAgent;
let ns: string;

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("lost-drive");
  node = await startSimStorageNode({
    nodeName: NODE,
    drives: [{ serial: SERIAL, pciAddress: "0000:3f:00.0", sizeBytes: GiB }],
  });
  agent = await runAgent(
    parseAgentConfig(
      node.agentEnv(tc.kubeconfigPath, ns, {
        DISTORT_LOST_DRIVE_RELEASE_AFTER_SECONDS: String(BOUND_S),
        // The test plays the reporter's verdicts on the drive (lost, back): no scan in between
        // may overwrite them. The first scan at start reports the drive.
        DISTORT_REPORT_PERIOD_MS: "3600000",
      }),
    ),
    createLogger({ level: (process.env.DISTORT_TEST_LOG as "info") ?? "warn" }),
  );
}, 300_000);

afterAll(async () => {
  await agent?.stop();
  await node?.close();
  await tc?.stop();
});

test("a deleted partition on a lost drive is released past the bound, its room held until the drive is back and cleaned", async () => {
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  const device = await placeOnReportedDrive(tc.conn, ns, SERIAL, ["p-lost"], 64 * MiB);
  const exported = await eventually(
    async () => {
      const p = await parts.get("p-lost", ns);
      return p?.status?.state === "Exported" ? p : undefined;
    },
    30_000,
    "partition exported",
  );
  const uid = exported.metadata.uid as string;
  const externalId = externalIdFor(uid);
  const lvolOf = () => node.emulator.state().lvols.find((l) => l.name === externalId);
  const subsystemOf = () => node.emulator.state().subsystems.find((s) => s.nqn === nqnFor(externalId));
  expect(lvolOf()).toBeDefined();
  // Bytes the volume holds: nothing may touch them while the drive is believed lost.
  const lvolBdev = node.emulator.bdev(lvolOf()?.uuid as string);
  const marker = Buffer.alloc(4096, 0x5a);
  await lvolBdev.write(0, marker);

  // What the reporter writes after a complete scan that missed the drive (its own function).
  const lostAt = Date.now();
  await updateStatus(devices, device.metadata.name, undefined, (latest) =>
    nextDeviceStatus(latest, { kind: "absent" }, new Date()),
  );
  await parts.delete("p-lost", ns);

  // Within the bound: still there, saying why and when it will let go; nothing deleted.
  const waiting = await eventually(
    async () => {
      const p = await parts.get("p-lost", ns);
      const ready = p?.status?.conditions?.find((c) => c.type === "Ready");
      // The deletion's own report: before the agent sees the deletion it may already report the
      // drive missing for the partition as it stands (Pending, DeviceUnavailable), a version that
      // says nothing about deleting.
      return ready?.reason === "DeviceUnavailable" &&
        p?.metadata.deletionTimestamp &&
        ready.message?.includes("released at")
        ? { p, ready }
        : undefined;
    },
    BOUND_S * 1000 - 500,
    "waits for the lost drive",
  );
  expect(waiting.p?.status?.state).toBe("Deleting");
  expect(waiting.ready.message).toContain("released at");
  expect(lvolOf()).toBeDefined();

  // Past it: gone, with the Event; the ledger entry stays, marked leftover.
  await eventually(
    async () => ((await parts.get("p-lost", ns)) ? undefined : true),
    20_000,
    "partition gone",
  );
  expect(Date.now() - lostAt).toBeGreaterThanOrEqual(BOUND_S * 1000);
  const events = await tc.conn.api(k8s.EventsV1Api);
  const lostEvents = async () =>
    [
      ...(await events.listNamespacedEvent({ namespace: ns })).items,
      ...(await events.listNamespacedEvent({ namespace: "default" })).items,
    ].filter((e) => e.reason === "DataOnLostDevice");
  const evs = await eventually(
    async () => {
      const l = await lostEvents();
      return l.length >= 2 ? l : undefined;
    },
    10_000,
    "DataOnLostDevice events on the partition and the drive",
  );
  expect(evs.every((e) => e.type === "Warning")).toBe(true);
  expect(evs.map((e) => e.regarding?.kind).sort()).toEqual(["NVMeDevice", "NVMePartition"]);
  for (const e of evs) {
    expect(e.note).toContain(SERIAL);
    expect(e.note).toContain(NODE);
  }
  const held = (await devices.get(device.metadata.name)) as NVMeDevice;
  const entry = held.status?.reservations?.find((r) => r.uid === uid);
  expect(entry?.leftover?.reason).toBe("DeviceUnavailable");
  // The target was not touched: the volume, its bytes and its export are all still there.
  expect(lvolOf()).toBeDefined();
  expect(subsystemOf()).toBeDefined();
  expect(Buffer.from(await lvolBdev.read(0, 4096)).equals(marker)).toBe(true);

  // The manager's capacity reconciler, run on the device as the API server holds it, does not
  // drop the entry of the gone partition: its room stays held.
  const capacity = await capacityPass(device.metadata.name);
  expect(capacity.status?.reservations?.map((r) => r.uid)).toEqual([uid]);
  expect(capacity.status?.freeBytes).toBe(capacity.spec.allocatableBytes - (entry?.bytes ?? 0));

  // The drive is back (what the reporter writes when a scan finds it): the agent deletes the
  // leftover volume and its export, then the entry; the capacity reconciler frees the room.
  await updateStatus(devices, device.metadata.name, undefined, (latest) => ({
    ...(latest.status as NonNullable<NVMeDevice["status"]>),
    phase: "Claimed",
    conditions: setCondition(
      latest.status?.conditions ?? [],
      { type: PRESENT, status: "True", reason: "BoundToSpdk", message: "back" },
      new Date(),
    ),
  }));
  await eventually(
    async () => {
      const d = await devices.get(device.metadata.name);
      return d?.status?.reservations?.some((r) => r.uid === uid) ? undefined : true;
    },
    20_000,
    "leftover entry dropped",
  );
  expect(lvolOf()).toBeUndefined();
  expect(subsystemOf()).toBeUndefined();
  const freed = await capacityPass(device.metadata.name);
  expect(freed.status?.freeBytes).toBe(freed.spec.allocatableBytes);
  const cleaned = await eventually(
    async () =>
      (await events.listNamespacedEvent({ namespace: "default" })).items.find(
        (e) => e.reason === "LeftoverDeleted" && e.regarding?.name === device.metadata.name,
      ),
    10_000,
    "LeftoverDeleted event",
  );
  expect(cleaned.note).toContain(externalId);
}, 120_000);

/**
 * One pass of the manager's capacity reconciler over device `name`, on an inventory holding the
 * device and the partitions as the API server has them now; resolves with the device it stored.
 */
async function capacityPass(name: string): Promise<NVMeDevice> {
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  const inv = new Inventory();
  inv.setDevice((await devices.get(name)) as NVMeDevice);
  for (const p of (await new ResourceClient(tc.conn, kinds.NVMePartition).list({ namespace: ns })).items)
    inv.setPartition(p);
  const h = await harness(tc, "lost-cap");
  await capacityReconciler(h.context(inv))(name, {
    signal: new AbortController().signal,
    log: silentLogger,
    attempt: 1,
  });
  return (await devices.get(name)) as NVMeDevice;
}
