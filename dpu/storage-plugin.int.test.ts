// The DPF plugin over its real gRPC socket (grpc-js client) against two SPDK emulators on one
// SimFabric: a target set up as DISTORT's agent does it (lvstore and lvols on a simulated drive,
// subsystem, namespace, listener, host ACL) and a second instance playing SNAP, whose
// bdev_nvme_attach_controller really reaches the target and is refused for a host NQN the
// subsystem does not allow.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import {
  AccessMode,
  StoragePluginServiceCapability_RPC_Type as Cap,
  IdentityService,
  StoragePluginService,
} from "../gen/nvidia/storage/plugins/v1/plugin_pb.ts";
import { type SpdkEmulator, startSpdkEmulator } from "../lab/sim/spdk/emulator.ts";
import { createFabric, type SimFabric } from "../lab/sim/spdk/fabric.ts";
import { GrpcCallError, GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { createLogger, silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { VolumeContextKeys } from "../lib/volume-context.ts";
import { parseDpuConfig } from "./config.ts";
import { namesFor } from "./devices/names.ts";
import { ALTERNATE_PORTALS_KEY, PUBLISHED_HOST_NQN_KEY, StorageParameterKeys } from "./devices/request.ts";
import { type RunningDpu, runDpu } from "./main.ts";
import { exportOnTarget, mapSecretReader, RecordingRpc, type TargetListener } from "./testing.ts";

const MIB = 1024 * 1024;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:3b0c8a52-5d1e-4c7b-9a44-0d2f6e8b1c37";
const OTHER_HOST = "nqn.2014-08.org.nvmexpress:uuid:9e7d6c5b-4a39-4281-b7f6-e5d4c3b2a190";
// A valid DH-HMAC-CHAP secret (nvme gen-dhchap-key; check-dhchap-key: CRC ff1c9c56): the target now
// authenticates the initiator with it.
const SECRET = "DHHC-1:00:9gb8PYK0rmteVJT0wi+Kpv1Z5AXoNQAD0KKp/JiQgzNWnBz/:";
const NS = "distort-system";

let root: string;
let fabric: SimFabric;
let target: SpdkEmulator;
let snap: SpdkEmulator;
let targetClient: SpdkClient;
let tm: SpdkMethods;
let plugin: RunningDpu;
let recorder: RecordingRpc | undefined;
let client: GrpcJsClient;
const secrets = new Map<string, string>();
let seq = 0;

const env = () => ({
  DISTORT_DPU_SOCKET: join(root, "dpu.sock"),
  DISTORT_DPU_SNAP_SOCKET: snap.socketPath,
  DISTORT_DPU_HOST_NQN: HOST,
  DISTORT_DPU_STATE_DIR: join(root, "state"),
  DISTORT_DPU_KEY_DIR: join(root, "keys"),
  DISTORT_DPU_MOUNT_ROOT: join(root, "mnt"),
  DISTORT_DPU_SECRET_NAMESPACE: NS,
  DISTORT_DPU_TCP_TRTYPE: "NVDA_TCP",
  DISTORT_HEALTH_HOST: "127.0.0.1",
  DISTORT_HEALTH_PORT: "0",
  DISTORT_DPU_SHUTDOWN_GRACE_MS: "1000",
});

async function startPlugin(): Promise<void> {
  plugin = await runDpu(parseDpuConfig(env()), silentLogger, {
    kube: null,
    secrets: mapSecretReader(secrets),
    wrapSnapRpc: (rpc) => {
      recorder = new RecordingRpc(rpc);
      return recorder;
    },
  });
  await plugin.initialised;
  client = new GrpcJsClient(plugin.address);
}

/** After SNAP restarted: the plugin's connection notices the drop on its next call, then reconnects. */
async function waitReady(): Promise<void> {
  for (let i = 0; i < 50; i++) {
    if ((await client.unary(IdentityService.method.probe, {})).ready) return;
    await Bun.sleep(20);
  }
  throw new Error("plugin never became ready");
}

async function stopPlugin(): Promise<void> {
  client.close();
  await plugin.stop();
}

interface Volume {
  readonly nqn: string;
  readonly lvolUuid: string;
  readonly context: Record<string, string>;
}

/** A DISTORT volume on the target: an lvol exported as namespace 1, as the agent does it. */
async function newVolume(
  o: { listeners?: TargetListener[]; allow?: string[]; dhchapKey?: string; transport?: "tcp" | "rdma" } = {},
): Promise<Volume> {
  const n = ++seq;
  const nqn = `nqn.2026-02.io.distort:pv-${n}`;
  const lvolUuid = await tm.bdevLvolCreate({
    lvs_name: "lvs0",
    lvol_name: `pv${n}`,
    size_in_mib: 8,
    thin_provision: true,
  });
  const transport = o.transport ?? "tcp";
  const listeners = o.listeners ?? [
    {
      trtype: transport === "tcp" ? "TCP" : "RDMA",
      adrfam: "ipv4",
      traddr: "192.168.50.10",
      trsvcid: String(4420 + n),
    },
  ];
  await exportOnTarget(tm, {
    nqn,
    bdevName: lvolUuid,
    listeners,
    hosts: (o.allow ?? [HOST]).map((h) => ({ nqn: h, ...(o.dhchapKey ? { dhchapKey: o.dhchapKey } : {}) })),
  });
  const first = listeners[0] as TargetListener;
  return {
    nqn,
    lvolUuid,
    context: {
      [VolumeContextKeys.nqn]: nqn,
      [VolumeContextKeys.portalIP]: first.traddr,
      [VolumeContextKeys.portalPort]: first.trsvcid,
      [VolumeContextKeys.transport]: transport,
      [VolumeContextKeys.namespaceUUID]: lvolUuid,
    },
  };
}

const create = (
  volumeId: string,
  vol: Volume,
  o: {
    modes?: AccessMode[];
    mode?: string;
    params?: Record<string, string>;
    publish?: Record<string, string>;
    context?: Record<string, string>;
  } = {},
) =>
  client.unary(StoragePluginService.method.createDevice, {
    volumeId,
    accessModes: o.modes ?? [AccessMode.RWO],
    volumeMode: o.mode ?? "Block",
    volumeContext: { ...vol.context, ...o.context },
    publishContext: o.publish ?? {},
    storageParameters: o.params ?? {},
  });
const del = (volumeId: string, deviceName: string) =>
  client.unary(StoragePluginService.method.deleteDevice, { volumeId, deviceName });
const get = (volumeId: string, deviceName: string) =>
  client.unary(StoragePluginService.method.getDevice, { volumeId, deviceName });
const list = (maxEntries: number, startingToken = "") =>
  client.unary(StoragePluginService.method.listDevices, { maxEntries, startingToken });

async function code(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return "OK";
  } catch (err) {
    if (!(err instanceof GrpcCallError)) throw err;
    return `${err.code}:${err.details}`;
  }
}
/** gRPC status code numbers. */
const C = {
  NOT_FOUND: "5",
  ALREADY_EXISTS: "6",
  PRECONDITION: "9",
  ABORTED: "10",
  UNIMPLEMENTED: "12",
  UNAVAILABLE: "14",
};
const codeOf = async (p: Promise<unknown>) => (await code(p)).split(":")[0];

const ctrlrsOf = (volumeId: string) =>
  snap.state().nvmeControllers.filter((c) => c.name === namesFor(volumeId).controller);

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "dpu-"));
  fabric = createFabric(join(root, "f"));
  target = await startSpdkEmulator({
    socketPath: join(root, "t.sock"),
    dataDir: join(root, "t"),
    fabric,
    drives: [{ pciAddress: "0000:5e:00.0", serial: "S5E", model: "Sim", sizeBytes: 512 * MIB }],
  });
  snap = await startSpdkEmulator({
    socketPath: join(root, "snap.sock"),
    dataDir: join(root, "s"),
    fabric,
    trtypeAliases: { NVDA_TCP: "TCP" },
  });
  targetClient = new SpdkClient({ socketPath: target.socketPath, logger: silentLogger });
  tm = new SpdkMethods(targetClient);
  await tm.bdevNvmeAttachController({ name: "Nvme0", trtype: "PCIe", traddr: "0000:5e:00.0" });
  await tm.bdevLvolCreateLvstore({ bdev_name: "Nvme0n1", lvs_name: "lvs0" });
  await startPlugin();
});

afterAll(async () => {
  await stopPlugin();
  await targetClient.close();
  await snap.close();
  await target.close();
  rmSync(root, { recursive: true, force: true });
});

describe("identity", () => {
  test("GetPluginInfo names the plugin in domain notation with a version and a manifest", async () => {
    const info = await client.unary(IdentityService.method.getPluginInfo, {});
    expect(info.name).toBe("storage.distort.io");
    expect(info.name.length).toBeLessThanOrEqual(63);
    expect(info.vendorVersion).toMatch(/^\d+\.\d+\.\d+/);
    expect(info.manifest.hostNqn).toBe(HOST);
    expect(info.manifest.transports).toBe("tcp=NVDA_TCP,rdma=RDMA");
  });

  test("Probe is ready once SNAP answered, and not ready (but healthy) while SNAP is down", async () => {
    expect((await client.unary(IdentityService.method.probe, {})).ready).toBe(true);
    await snap.crash();
    try {
      expect((await client.unary(IdentityService.method.probe, {})).ready).toBe(false);
      const res = await fetch(`http://127.0.0.1:${plugin.healthPort}/readyz`);
      expect(res.status).toBe(503);
      expect(await res.text()).toContain("SNAP does not answer");
      expect((await fetch(`http://127.0.0.1:${plugin.healthPort}/healthz`)).status).toBe(200);
    } finally {
      await snap.restart();
    }
    await waitReady();
  });

  test("capabilities are all four; the SNAP provider is the default one", async () => {
    const caps = await client.unary(StoragePluginService.method.storagePluginGetCapabilities, {});
    expect(caps.capabilities.map((c) => (c.type.case === "rpc" ? c.type.value.type : -1)).sort()).toEqual([
      Cap.CREATE_DELETE_BLOCK_DEVICE,
      Cap.CREATE_DELETE_FS_DEVICE,
      Cap.GET_DEVICE_STATS,
      Cap.LIST_DEVICES,
    ]);
    expect((await client.unary(StoragePluginService.method.getSNAPProvider, {})).providerName).toBe("");
  });

  test("a method the services do not have answers UNIMPLEMENTED", async () => {
    const raw = new grpc.Client(plugin.address, grpc.credentials.createInsecure());
    const status = await new Promise<number>((resolve) =>
      raw.makeUnaryRequest(
        "/nvidia.storage.plugins.v1.StoragePluginService/ResizeDevice",
        (b: Buffer) => b,
        (b: Buffer) => b,
        Buffer.alloc(0),
        (err) => resolve(err?.code ?? 0),
      ),
    );
    raw.close();
    expect(status).toBe(12);
  });
});

describe("block devices", () => {
  test("CreateDevice attaches the volume into SNAP as this DPU, with reconnect settings; data reaches the lvol", async () => {
    const vol = await newVolume();
    const r = await create("vol-a", vol, {
      params: {
        [StorageParameterKeys.ctrlrLossTimeoutSec]: "30",
        [StorageParameterKeys.reconnectDelaySec]: "2",
        [StorageParameterKeys.fastIoFailTimeoutSec]: "10",
        policy: "dpf-policy-ignored",
      },
    });
    expect(r.deviceName).toBe(namesFor("vol-a").bdev);
    const [c] = ctrlrsOf("vol-a");
    expect(c?.hostnqn).toBe(HOST);
    expect(c?.trtype).toBe("NVDA_TCP");
    expect(c?.subnqn).toBe(vol.nqn);
    expect(c?.bdevs).toEqual([r.deviceName]);
    const attach = recorder?.paramsOf("bdev_nvme_attach_controller").at(-1);
    expect(attach).toEqual({
      name: namesFor("vol-a").controller,
      trtype: "NVDA_TCP",
      adrfam: "ipv4",
      traddr: "192.168.50.10",
      trsvcid: vol.context[VolumeContextKeys.portalPort],
      subnqn: vol.nqn,
      hostnqn: HOST,
      ctrlr_loss_timeout_sec: 30,
      reconnect_delay_sec: 2,
      fast_io_fail_timeout_sec: 10,
    });
    const payload = Buffer.from("through SNAP, over the fabric, into the lvol");
    await snap.bdev(r.deviceName).write(2 * MIB, payload);
    expect((await target.bdev(vol.lvolUuid).read(2 * MIB, payload.length)).equals(payload)).toBe(true);
  });

  test("repeated CreateDevice returns the same device without a new attach; other modes are ALREADY_EXISTS", async () => {
    const vol = await newVolume();
    const first = await create("vol-b", vol);
    const attaches = recorder?.paramsOf("bdev_nvme_attach_controller").length;
    expect((await create("vol-b", vol)).deviceName).toBe(first.deviceName);
    expect((await create("vol-b", vol, { modes: [AccessMode.RWO, AccessMode.RWO] })).deviceName).toBe(
      first.deviceName,
    );
    expect(recorder?.paramsOf("bdev_nvme_attach_controller").length).toBe(attaches);
    expect(ctrlrsOf("vol-b")).toHaveLength(1);
    expect(await code(create("vol-b", vol, { modes: [AccessMode.RWX] }))).toStartWith(`${C.ALREADY_EXISTS}:`);
    expect(await code(create("vol-b", vol, { mode: "Filesystem" }))).toContain(
      "volume mode Block (requested Filesystem)",
    );
    const other = await newVolume();
    expect(await codeOf(create("vol-b", other))).toBe(C.ALREADY_EXISTS);
  });

  test("GetDevice reports modes and contexts; NOT_FOUND for another volume or name", async () => {
    const vol = await newVolume();
    const params = { [StorageParameterKeys.reconnectDelaySec]: "5", policy: "p1" };
    const publish = { [PUBLISHED_HOST_NQN_KEY]: HOST, "storage.distort.io/attachmentId": "att-1" };
    const { deviceName } = await create("vol-c", vol, {
      modes: [AccessMode.ROX, AccessMode.RWO],
      params,
      publish,
    });
    const d = await get("vol-c", deviceName);
    expect(d.accessModes).toEqual([AccessMode.RWO, AccessMode.ROX]);
    expect(d.volumeMode).toBe("Block");
    expect(d.volumeContext).toEqual(vol.context);
    expect(d.publishContext).toEqual(publish);
    expect(d.storageParameters).toEqual(params);
    expect(await codeOf(get("vol-none", deviceName))).toBe(C.NOT_FOUND);
    expect(await codeOf(get("vol-c", namesFor("vol-c").fsdev))).toBe(C.NOT_FOUND);
  });

  test("DeleteDevice detaches and forgets; repeated and unknown deletes are OK", async () => {
    const vol = await newVolume();
    const { deviceName } = await create("vol-d", vol);
    await del("vol-d", deviceName);
    expect(ctrlrsOf("vol-d")).toEqual([]);
    expect(target.state().subsystems.find((s) => s.nqn === vol.nqn)?.controllers).toEqual([]);
    expect(await codeOf(get("vol-d", deviceName))).toBe(C.NOT_FOUND);
    await del("vol-d", deviceName);
    await del("never-created", namesFor("never-created").bdev);
    await del("vol-d", "some-other-device");
    // A new device for the same volume after the delete starts afresh.
    expect((await create("vol-d", vol)).deviceName).toBe(deviceName);
    await del("vol-d", deviceName);
  });

  test("a host NQN the subsystem does not allow is FAILED_PRECONDITION; the retry after admission continues", async () => {
    const vol = await newVolume({ allow: [OTHER_HOST] });
    const refused = await code(create("vol-e", vol));
    expect(refused).toStartWith(`${C.PRECONDITION}:`);
    expect(refused).toContain(`refused host ${HOST}`);
    expect(ctrlrsOf("vol-e")).toEqual([]);
    expect(await codeOf(get("vol-e", namesFor("vol-e").bdev))).toBe(C.NOT_FOUND);
    expect((await list(0)).entries.map((e) => e.volumeId)).not.toContain("vol-e");
    await tm.nvmfSubsystemAddHost({ nqn: vol.nqn, host: HOST });
    expect((await create("vol-e", vol)).deviceName).toBe(namesFor("vol-e").bdev);
    await del("vol-e", namesFor("vol-e").bdev);
  });

  test("publish context for another host is FAILED_PRECONDITION before SNAP is touched", async () => {
    const vol = await newVolume();
    const before = recorder?.calls.length ?? 0;
    const r = await code(create("vol-f", vol, { publish: { [PUBLISHED_HOST_NQN_KEY]: OTHER_HOST } }));
    expect(r).toStartWith(`${C.PRECONDITION}:`);
    expect(r).toContain(`published to host ${OTHER_HOST}`);
    expect(recorder?.calls.slice(before).filter((c) => c.method.startsWith("bdev_nvme"))).toEqual([]);
  });

  test("nothing listening at the portal is UNAVAILABLE", async () => {
    const vol = await newVolume();
    expect(await codeOf(create("vol-g", vol, { context: { [VolumeContextKeys.portalPort]: "4999" } }))).toBe(
      C.UNAVAILABLE,
    );
    await del("vol-g", namesFor("vol-g").bdev);
  });

  test("a namespace whose UUID is not the volume's is refused and detached again", async () => {
    const vol = await newVolume();
    const r = await code(
      create("vol-h", vol, {
        context: { [VolumeContextKeys.namespaceUUID]: "0f1e2d3c-4b5a-4978-8a1b-2c3d4e5f6a7b" },
      }),
    );
    expect(r).toStartWith(`${C.PRECONDITION}:`);
    expect(ctrlrsOf("vol-h")).toEqual([]);
    await del("vol-h", namesFor("vol-h").bdev);
  });

  test("an IPv6 portal is attached with adrfam ipv6", async () => {
    const vol = await newVolume({
      listeners: [{ trtype: "TCP", adrfam: "ipv6", traddr: "fd00:50::10", trsvcid: "4420" }],
    });
    const { deviceName } = await create("vol-v6", vol);
    const attach = recorder?.paramsOf("bdev_nvme_attach_controller").at(-1) as Record<string, unknown>;
    expect(attach.adrfam).toBe("ipv6");
    expect(attach.traddr).toBe("fd00:50::10");
    const [ctrl] =
      (await new SpdkMethods(recorder as RecordingRpc).bdevNvmeGetControllers(
        namesFor("vol-v6").controller,
      )) ?? [];
    expect(ctrl?.ctrlrs[0]?.trid.adrfam).toBe("IPv6");
    expect(ctrl?.ctrlrs[0]?.trid.traddr).toBe("fd00:50::10");
    await snap.bdev(deviceName).write(0, Buffer.from("v6"));
    await del("vol-v6", deviceName);
  });

  test("several portals become paths of one controller (multipath)", async () => {
    const vol = await newVolume({
      listeners: [
        { trtype: "RDMA", adrfam: "ipv4", traddr: "10.10.0.1", trsvcid: "4420" },
        { trtype: "RDMA", adrfam: "ipv6", traddr: "fd00:10::1", trsvcid: "4420" },
      ],
      transport: "rdma",
    });
    const before = recorder?.paramsOf("bdev_nvme_attach_controller").length ?? 0;
    const { deviceName } = await create("vol-mp", vol, {
      context: { [ALTERNATE_PORTALS_KEY]: "[fd00:10::1]:4420" },
    });
    const attaches = recorder?.paramsOf("bdev_nvme_attach_controller").slice(before) as Record<
      string,
      unknown
    >[];
    expect(attaches.map((a) => [a.traddr, a.adrfam, a.multipath, a.trtype])).toEqual([
      ["10.10.0.1", "ipv4", "multipath", "RDMA"],
      ["fd00:10::1", "ipv6", "multipath", "RDMA"],
    ]);
    const ctrl = (
      await new SpdkMethods(recorder as RecordingRpc).bdevNvmeGetControllers(namesFor("vol-mp").controller)
    )[0];
    expect(ctrl?.ctrlrs.map((c) => c.trid.traddr)).toEqual(["10.10.0.1", "fd00:10::1"]);
    // A repeat adds nothing; both paths are known.
    await create("vol-mp", vol, { context: { [ALTERNATE_PORTALS_KEY]: "[fd00:10::1]:4420" } });
    expect(recorder?.paramsOf("bdev_nvme_attach_controller").length).toBe(before + 2);
    await del("vol-mp", deviceName);
    expect(ctrlrsOf("vol-mp")).toEqual([]);
  });

  test("with one portal down the device comes up on the other; the retry adds the missing path", async () => {
    const vol = await newVolume({
      listeners: [{ trtype: "TCP", adrfam: "ipv4", traddr: "10.20.0.1", trsvcid: "4420" }],
    });
    const ctx = { [ALTERNATE_PORTALS_KEY]: "10.20.0.2" };
    const { deviceName } = await create("vol-mp2", vol, { context: ctx });
    expect(ctrlrsOf("vol-mp2")).toHaveLength(1);
    await tm.nvmfSubsystemAddListener({
      nqn: vol.nqn,
      listen_address: { trtype: "TCP", adrfam: "ipv4", traddr: "10.20.0.2", trsvcid: "4420" },
    });
    expect((await create("vol-mp2", vol, { context: ctx })).deviceName).toBe(deviceName);
    const ctrl = (
      await new SpdkMethods(recorder as RecordingRpc).bdevNvmeGetControllers(namesFor("vol-mp2").controller)
    )[0];
    expect(ctrl?.ctrlrs.map((c) => c.trid.traddr)).toEqual(["10.20.0.1", "10.20.0.2"]);
    await del("vol-mp2", deviceName);
  });
});

describe("DH-HMAC-CHAP", () => {
  test("the Secret named by storage parameters is installed in SNAP's keyring and used for the attach", async () => {
    const keyPath = join(root, "target-key");
    writeFileSync(keyPath, SECRET, { mode: 0o600 });
    await tm.keyringFileAddKey({ name: "tkey", path: keyPath });
    const vol = await newVolume({ dhchapKey: "tkey" });
    const params = {
      [StorageParameterKeys.dhchapSecretName]: "dpu-chap",
      [StorageParameterKeys.dhchapSecretKey]: "secret",
    };
    expect(await code(create("vol-chap", vol, { params }))).toContain(
      `Secret ${NS}/dpu-chap has no key secret`,
    );
    secrets.set(`${NS}/dpu-chap/secret`, "not-a-dhchap-secret");
    expect(await code(create("vol-chap", vol, { params }))).toStartWith(`${C.PRECONDITION}:`);
    secrets.set(`${NS}/dpu-chap/secret`, `${SECRET}\n`);
    const { deviceName } = await create("vol-chap", vol, { params });
    const names = namesFor("vol-chap");
    const key = snap.state().keys.find((k) => k.name === names.key);
    expect(key?.path).toBe(join(root, "keys", names.key));
    expect(await readFile(key?.path as string, "utf8")).toBe(SECRET);
    expect(statSync(key?.path as string).mode & 0o777).toBe(0o600);
    const attach = recorder?.paramsOf("bdev_nvme_attach_controller").at(-1) as Record<string, unknown>;
    expect(attach.dhchap_key).toBe(names.key);
    expect(ctrlrsOf("vol-chap")).toHaveLength(1);
    // Repeated: the key is not added twice.
    await create("vol-chap", vol, { params });
    expect(
      recorder?.paramsOf("keyring_file_add_key").filter((p) => (p as { name: string }).name === names.key),
    ).toHaveLength(1);
    await del("vol-chap", deviceName);
    expect(snap.state().keys.map((k) => k.name)).not.toContain(names.key);
    expect(await Bun.file(join(root, "keys", names.key)).exists()).toBe(false);
  });
});

describe("listing and state", () => {
  test("ListDevices pages in a stable order while devices are added, and rejects foreign tokens", async () => {
    const ids = ["list-1", "list-3", "list-5", "list-7", "list-9"];
    for (const id of ids) await create(id, await newVolume());
    const seen: string[] = [];
    let token = "";
    let pages = 0;
    let added = false;
    do {
      const page = await list(2, token);
      expect(page.entries.length).toBeLessThanOrEqual(2);
      seen.push(...page.entries.map((e) => e.volumeId));
      for (const e of page.entries) expect(e.deviceName).toBe(namesFor(e.volumeId).bdev);
      token = page.nextToken;
      pages++;
      if (!added) {
        // Added behind and ahead of the cursor between pages.
        await create("list-0", await newVolume());
        await create("list-8", await newVolume());
        added = true;
      }
    } while (token !== "");
    const listed = seen.filter((id) => id.startsWith("list-"));
    expect(new Set(seen).size).toBe(seen.length);
    for (const id of ids) expect(listed).toContain(id);
    expect(listed).toContain("list-8");
    expect(listed).not.toContain("list-0");
    expect(pages).toBeGreaterThan(3);
    expect(seen).toEqual([...seen].sort());
    const all = (await list(0)).entries.map((e) => e.volumeId);
    expect(all).toEqual([...all].sort());
    expect(all).toContain("list-0");
    expect(await codeOf(list(2, "bm90LWEtdG9rZW4"))).toBe(C.ABORTED);
    expect(await codeOf(list(2, "%%%"))).toBe(C.ABORTED);
  });

  test("a restarted plugin reports the same devices from SNAP state and its records", async () => {
    const vol = await newVolume();
    const publish = { "storage.distort.io/attachmentId": "att-restart" };
    const { deviceName } = await create("vol-r", vol, { modes: [AccessMode.RWOP], publish });
    const before = (await list(0)).entries;
    await stopPlugin();
    await startPlugin();
    expect((await list(0)).entries).toEqual(before);
    const d = await get("vol-r", deviceName);
    expect(d.accessModes).toEqual([AccessMode.RWOP]);
    expect(d.publishContext).toEqual(publish);
    expect(d.volumeContext).toEqual(vol.context);
  });

  test("a device SNAP lost (SNAP restart) is NOT_FOUND until CreateDevice repairs it", async () => {
    const vol = await newVolume();
    const { deviceName } = await create("vol-s", vol);
    await snap.crash();
    await snap.restart();
    await waitReady();
    expect(await code(get("vol-s", deviceName))).toContain("is gone from SNAP");
    expect((await list(0)).entries.map((e) => e.volumeId)).not.toContain("vol-s");
    expect((await create("vol-s", vol)).deviceName).toBe(deviceName);
    expect((await get("vol-s", deviceName)).volumeMode).toBe("Block");
  });

  test("DeleteDevice refuses while SNAP still exposes the bdev, and succeeds once it stopped", async () => {
    const vol = await newVolume();
    const { deviceName } = await create("vol-busy", vol);
    const snapRpc = new SpdkMethods(recorder as RecordingRpc);
    const exposeNqn = "nqn.2022-10.io.nvda.nvme:dpf-test";
    await snapRpc.nvmfCreateSubsystem({ nqn: exposeNqn });
    await snapRpc.nvmfSubsystemAddNs({ nqn: exposeNqn, namespace: { bdev_name: deviceName } });
    const r = await code(del("vol-busy", deviceName));
    expect(r).toStartWith(`${C.PRECONDITION}:`);
    expect(r).toContain("still in use in SNAP");
    expect(ctrlrsOf("vol-busy")).toHaveLength(1);
    await snapRpc.nvmfDeleteSubsystem(exposeNqn);
    await del("vol-busy", deviceName);
    expect(ctrlrsOf("vol-busy")).toEqual([]);
  });

  test("concurrent calls for one volume: one runs, the other is ABORTED", async () => {
    const vol = await newVolume();
    const results = await Promise.all([code(create("vol-cc", vol)), code(create("vol-cc", vol))]);
    expect(results.filter((r) => r === "OK")).toHaveLength(1);
    expect(results.filter((r) => r.startsWith(`${C.ABORTED}:`))).toHaveLength(1);
    expect(ctrlrsOf("vol-cc")).toHaveLength(1);
  });
});

test("the plugin logs carry no DH-HMAC-CHAP secret", async () => {
  const lines: string[] = [];
  await stopPlugin();
  plugin = await runDpu(parseDpuConfig(env()), createLogger({ level: "debug", sink: (l) => lines.push(l) }), {
    kube: null,
    secrets: mapSecretReader(secrets),
  });
  await plugin.initialised;
  client = new GrpcJsClient(plugin.address);
  const keyPath = join(root, "target-key2");
  writeFileSync(keyPath, SECRET, { mode: 0o600 });
  await tm.keyringFileAddKey({ name: "tkey2", path: keyPath });
  const vol = await newVolume({ dhchapKey: "tkey2" });
  secrets.set(`${NS}/chap2/k`, SECRET);
  const params = {
    [StorageParameterKeys.dhchapSecretName]: "chap2",
    [StorageParameterKeys.dhchapSecretKey]: "k",
  };
  await create("vol-log", vol, { params });
  await del("vol-log", namesFor("vol-log").bdev);
  expect(lines.length).toBeGreaterThan(0);
  expect(lines.join("\n")).not.toContain(SECRET.slice(10, 40));
});
