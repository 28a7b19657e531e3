// The Node service on the wire: a grpc-js client over the real unix socket (serveGrpc), the lab's
// NVMe-oF host daemon (every block a command over the fabric) against an emulated nvmf_tgt
// exporting sparse files, both processes of their own, real loop devices, real blkid/mkfs/mount. Stage -> publish -> write -> unpublish -> unstage -> stage again keeps the data
// (ext4 and XFS); a different filesystem is refused untouched; read-only publish; raw block;
// stats and health (including the target dropping the host); online expansion after the target
// grows the namespace. Needs root, util-linux, e2fsprogs, xfsprogs.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { open } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code } from "@connectrpc/connect";
import {
  VolumeCapability_AccessMode_Mode as Mode,
  Node,
  VolumeHealthErrorType,
  VolumeUsage_Unit,
} from "../../gen/csi/v1/csi_pb.ts";
import type { HostControlInitiator } from "../../lab/sim/fabric/host-control.ts";
import {
  type ExportSpec,
  startTestTargetProcess,
  type TestTargetProcess,
} from "../../lab/sim/fabric/test-target.ts";
import { realClock } from "../../lib/clock.ts";
import { hostExec, runChecked } from "../../lib/exec.ts";
import { hostFs } from "../../lib/fs.ts";
import { GrpcCallError, GrpcJsClient } from "../../lib/grpc/grpc-js-client.ts";
import { type GrpcServer, register, serveGrpc } from "../../lib/grpc/server.ts";
import { silentLogger } from "../../lib/log.ts";
import { PublishContextKeys, VolumeContextKeys } from "../../lib/volume-context.ts";
import { externalIdFor, nqnFor } from "../../lib/volume-identity.ts";
import { HostMounter } from "../host/mounter.ts";
import { createNodeService } from "../node.ts";
import { fileStateStore } from "./state-store.ts";

const MIB = 1024 * 1024;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:5d3a1c2b-0e4f-4a6b-8c7d-9e0f1a2b3c4d";
const sh = (...argv: string[]) => runChecked(hostExec, argv, { timeoutMs: 60_000 });

let root: string;
let target: TestTargetProcess;
let initiator: HostControlInitiator;
let server: GrpcServer;
let client: GrpcJsClient;
const files: string[] = [];

beforeAll(async () => {
  if (process.getuid?.() !== 0) throw new Error("the node wire test needs root (losetup, mkfs, mount)");
  for (const tool of [
    "losetup",
    "blkid",
    "mkfs.ext4",
    "mkfs.xfs",
    "resize2fs",
    "xfs_growfs",
    "mount",
    "dd",
    "blockdev",
  ]) {
    if ((await hostExec.run(["sh", "-c", `command -v ${tool}`])).code !== 0) {
      throw new Error(
        `${tool} is missing; on Debian: apt-get install -y util-linux e2fsprogs xfsprogs coreutils`,
      );
    }
  }
  root = mkdtempSync(join(tmpdir(), "node-wire-"));
  target = await startTestTargetProcess();
  initiator = await target.startHost("worker-a");
  const service = createNodeService({
    nodeId: "worker-a",
    hostNqn: HOST,
    topology: { "topology.storage.distort.io/node": "worker-a" },
    maxVolumesPerNode: 32,
    initiator,
    mounter: new HostMounter({ exec: hostExec, fs: hostFs("/") }),
    fs: hostFs("/"),
    state: fileStateStore(join(root, "state")),
    clock: realClock,
    logger: silentLogger,
    deviceWaitMs: 10_000,
  });
  server = await serveGrpc({
    socketPath: join(root, "csi.sock"),
    services: [register(Node, service)],
    logger: silentLogger,
  });
  client = new GrpcJsClient(server.address);
});

afterAll(async () => {
  // Whatever a failed test left: unmount everything under root; the host daemon's shutdown then
  // detaches its loop devices.
  try {
    const mounts = readFileSync("/proc/self/mountinfo", "utf8")
      .split("\n")
      .map((l) => l.split(" ")[4])
      .filter((m): m is string => m?.startsWith(root ?? "/nonexistent") === true)
      .reverse();
    for (const m of mounts) await hostExec.run(["umount", "-l", m]);
  } finally {
    client?.close();
    await server?.close();
    await target?.close();
    if (root) rmSync(root, { recursive: true, force: true });
  }
});

/** Waits for `fn` to hold, with a deadline (the machine may be loaded). */
async function until(what: string, fn: () => Promise<boolean>, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(50);
  }
}

let seq = 0;
/** A fresh exported volume and the kubelet-style paths for it. */
async function volume(sizeBytes = 64 * MIB, over: Partial<ExportSpec> = {}) {
  const n = ++seq;
  const uid = `00000000-0000-4000-9000-${String(n).padStart(12, "0")}`;
  const spec: ExportSpec = {
    nqn: nqnFor(externalIdFor(uid)),
    sizeBytes,
    hosts: [HOST],
    uuid: `00000000-0000-4000-8000-${String(n).padStart(12, "0")}`,
    trsvcid: String(4420 + n),
    ...over,
  };
  files.push(await target.exportFile(spec));
  const staging = join(root, "plugins", `v${n}`, "globalmount");
  mkdirSync(staging, { recursive: true });
  const pods = join(root, "pods", `v${n}`);
  mkdirSync(pods, { recursive: true });
  return {
    spec,
    volumeId: `default/pvc-${n}/${uid}`,
    staging,
    target: join(pods, "mount"),
    target2: join(pods, "mount-ro"),
    volumeContext: {
      [VolumeContextKeys.nqn]: spec.nqn,
      [VolumeContextKeys.portalIP]: spec.traddr ?? "127.0.0.1",
      [VolumeContextKeys.portalPort]: spec.trsvcid ?? "4420",
      [VolumeContextKeys.transport]: spec.transport ?? "tcp",
      [VolumeContextKeys.namespaceUUID]: spec.uuid,
      [VolumeContextKeys.reconnectDelay]: "1",
    },
    publishContext: { [PublishContextKeys.hostNQN]: HOST, [PublishContextKeys.attachmentId]: `att-${n}` },
  };
}
type Vol = Awaited<ReturnType<typeof volume>>;

const mountCap = (fsType: string) => ({
  accessType: { case: "mount" as const, value: { fsType, mountFlags: [] } },
  accessMode: { mode: Mode.SINGLE_NODE_WRITER },
});
const blockCap = {
  accessType: { case: "block" as const, value: {} },
  accessMode: { mode: Mode.SINGLE_NODE_WRITER },
};
type CapInit = ReturnType<typeof mountCap> | typeof blockCap;

const stage = (v: Vol, cap: CapInit) =>
  client.unary(
    Node.method.nodeStageVolume,
    {
      volumeId: v.volumeId,
      stagingTargetPath: v.staging,
      volumeCapability: cap,
      volumeContext: v.volumeContext,
      publishContext: v.publishContext,
    },
    { timeoutMs: 60_000 },
  );
const unstage = (v: Vol) =>
  client.unary(Node.method.nodeUnstageVolume, { volumeId: v.volumeId, stagingTargetPath: v.staging });
const publish = (v: Vol, cap: CapInit, targetPath: string, readonly = false) =>
  client.unary(Node.method.nodePublishVolume, {
    volumeId: v.volumeId,
    stagingTargetPath: v.staging,
    targetPath,
    volumeCapability: cap,
    readonly,
  });
const unpublish = (v: Vol, targetPath: string) =>
  client.unary(Node.method.nodeUnpublishVolume, { volumeId: v.volumeId, targetPath });
const health = async (v: Vol, volumePublishPath = "") =>
  (
    await client.unary(Node.method.nodeGetVolumeHealth, { volumeId: v.volumeId, volumePublishPath })
  ).volumeHealth?.healthStatuses.map((h) => [VolumeHealthErrorType[h.status], h.reason]);

async function codeOf(p: Promise<unknown>): Promise<number | "ok"> {
  try {
    await p;
    return "ok";
  } catch (err) {
    if (err instanceof GrpcCallError) return err.code;
    throw err;
  }
}

async function blkidType(path: string): Promise<string | undefined> {
  const r = await hostExec.run(["blkid", "-p", "-o", "value", "-s", "TYPE", path]);
  return r.code === 0 ? r.stdout.trim() : undefined;
}

/** ext4 online resize (EXT4_IOC_RESIZE_FS) needs CAP_SYS_RESOURCE, which some test sandboxes drop. */
const hasCapSysResource = (() => {
  const eff = /^CapEff:\s*([0-9a-f]+)$/m.exec(readFileSync("/proc/self/status", "utf8"))?.[1];
  return eff !== undefined && (BigInt(`0x${eff}`) & (1n << 24n)) !== 0n;
})();

const isMounted = (path: string) =>
  readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .some((l) => l.split(" ")[4] === path);

describe.each([
  ["ext4", 64 * MIB],
  ["xfs", 320 * MIB],
])("%s volume", (fsType, size) => {
  test("stage, publish, write, unpublish, unstage, stage again: the data is still there", async () => {
    const v = await volume(size);
    const cap = mountCap(fsType);
    await stage(v, cap);
    await stage(v, cap); // idempotent
    expect(await blkidType(files.at(-1) as string)).toBe(fsType);
    await publish(v, cap, v.target);
    await publish(v, cap, v.target); // idempotent
    writeFileSync(join(v.target, "hello.txt"), `written through ${fsType}\n`);
    await unpublish(v, v.target);
    await unpublish(v, v.target);
    expect(isMounted(v.target)).toBe(false);
    await unstage(v);
    await unstage(v);
    expect(isMounted(v.staging)).toBe(false);
    expect(await initiator.list()).not.toContainEqual(expect.objectContaining({ nqn: v.spec.nqn }));
    expect(await target.rpc.call("nvmf_subsystem_get_controllers", { nqn: v.spec.nqn })).toEqual([]);

    await stage(v, cap);
    await publish(v, cap, v.target);
    expect(readFileSync(join(v.target, "hello.txt"), "utf8")).toBe(`written through ${fsType}\n`);

    // Read-only publish beside the read-write one: reads work, writes fail.
    await publish(v, cap, v.target2, true);
    expect(readFileSync(join(v.target2, "hello.txt"), "utf8")).toBe(`written through ${fsType}\n`);
    expect(() => writeFileSync(join(v.target2, "nope.txt"), "x")).toThrow(/EROFS|read-only/);
    expect(await codeOf(publish(v, cap, v.target2, false))).toBe(Code.AlreadyExists);

    const stats = await client.unary(Node.method.nodeGetVolumeStats, {
      volumeId: v.volumeId,
      volumePath: v.target,
    });
    const bytes = stats.usage.find((u) => u.unit === VolumeUsage_Unit.BYTES);
    const inodes = stats.usage.find((u) => u.unit === VolumeUsage_Unit.INODES);
    // XFS keeps its log inside the data device: a 320 MiB filesystem shows about 256 MiB.
    expect(Number(bytes?.total)).toBeGreaterThan(size * 0.7);
    expect(Number(bytes?.total)).toBeLessThanOrEqual(size);
    expect(bytes?.used).toBeGreaterThan(0n);
    expect(inodes?.total).toBeGreaterThan(0n);
    expect(
      await codeOf(
        client.unary(Node.method.nodeGetVolumeStats, {
          volumeId: v.volumeId,
          volumePath: join(root, "elsewhere"),
        }),
      ),
    ).toBe(Code.NotFound);
    expect(await health(v, v.target)).toEqual([]);

    await unpublish(v, v.target2);
    await unpublish(v, v.target);
    await unstage(v);
  });

  test.skipIf(fsType === "ext4" && !hasCapSysResource)(
    "online expansion after the target grows the namespace",
    async () => {
      const v = await volume(size);
      const cap = mountCap(fsType);
      await stage(v, cap);
      await publish(v, cap, v.target);
      writeFileSync(join(v.target, "keep.txt"), "kept");
      const before = await client.unary(Node.method.nodeGetVolumeStats, {
        volumeId: v.volumeId,
        volumePath: v.target,
      });
      await target.growFile(v.spec, size * 2);
      const r = await client.unary(
        Node.method.nodeExpandVolume,
        {
          volumeId: v.volumeId,
          volumePath: v.target,
          capacityRange: { requiredBytes: BigInt(size * 2) },
        },
        { timeoutMs: 60_000 },
      );
      expect(r.capacityBytes).toBe(BigInt(size * 2));
      const after = await client.unary(Node.method.nodeGetVolumeStats, {
        volumeId: v.volumeId,
        volumePath: v.target,
      });
      const total = (s: typeof before) =>
        Number(s.usage.find((u) => u.unit === VolumeUsage_Unit.BYTES)?.total);
      expect(total(after)).toBeGreaterThan(total(before) * 1.8);
      expect(readFileSync(join(v.target, "keep.txt"), "utf8")).toBe("kept");
      await unpublish(v, v.target);
      await unstage(v);
    },
  );
});

test("a device holding another filesystem is refused with FAILED_PRECONDITION and left untouched", async () => {
  const v = await volume(320 * MIB);
  const file = files.at(-1) as string;
  await sh("mkfs.xfs", "-q", file);
  expect(await codeOf(stage(v, mountCap("ext4")))).toBe(Code.FailedPrecondition);
  expect(await blkidType(file)).toBe("xfs");
  expect(isMounted(v.staging)).toBe(false);
  await unstage(v);
  expect(await initiator.list()).not.toContainEqual(expect.objectContaining({ nqn: v.spec.nqn }));
  // The matching filesystem is kept and mounted.
  await stage(v, mountCap("xfs"));
  expect(isMounted(v.staging)).toBe(true);
  await unstage(v);
});

test("a host the target does not allow cannot stage", async () => {
  const v = await volume(64 * MIB, { hosts: [] });
  expect(await codeOf(stage(v, mountCap("ext4")))).toBe(Code.Unavailable);
  expect(await blkidType(files.at(-1) as string)).toBeUndefined();
  await unstage(v);
});

test("raw block: the device file at the target, read-write and read-only", async () => {
  const v = await volume(32 * MIB);
  await stage(v, blockCap);
  expect(isMounted(v.staging)).toBe(false);
  const blockTarget = join(root, "pods", "block-dev");
  await publish(v, blockCap, blockTarget);
  const fh = await open(blockTarget, "r+");
  try {
    await fh.write(Buffer.from("raw block bytes"), 0, 15, 4096);
    await fh.sync();
  } finally {
    await fh.close();
  }
  // The bytes landed in the namespace's backing file.
  const img = await open(files.at(-1) as string, "r");
  const buf = Buffer.alloc(15);
  await img.read(buf, 0, 15, 4096);
  await img.close();
  expect(buf.toString()).toBe("raw block bytes");
  const stats = await client.unary(Node.method.nodeGetVolumeStats, {
    volumeId: v.volumeId,
    volumePath: blockTarget,
  });
  expect(stats.usage.map((u) => [u.unit, u.total])).toEqual([[VolumeUsage_Unit.BYTES, BigInt(32 * MIB)]]);

  const roTarget = join(root, "pods", "block-dev-ro");
  await publish(v, blockCap, roTarget, true);
  const ro = await open(roTarget, "r");
  const got = Buffer.alloc(15);
  await ro.read(got, 0, 15, 4096);
  await ro.close();
  expect(got.toString()).toBe("raw block bytes");
  // A device node can be opened for writing even on a read-only mount; the read-only view is what refuses.
  const w = await open(roTarget, "r+");
  const wrote = await w.write(Buffer.from("overwrite"), 0, 9, 4096).then(
    () => "written",
    (e: NodeJS.ErrnoException) => e.code,
  );
  await w.close();
  expect(wrote).toMatch(/EPERM|EROFS|EACCES/);

  await unpublish(v, roTarget);
  await unpublish(v, blockTarget);
  await unstage(v);
  expect(await initiator.findNamespaceDevice(v.spec.nqn)).toBeUndefined();
  expect(await target.rpc.call("nvmf_subsystem_get_controllers", { nqn: v.spec.nqn })).toEqual([]);
});

/** The source device of the visible mount at `path`, from the kernel's mount table. */
function mountSource(path: string): { source: string; readonly: boolean } | undefined {
  const line = readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .filter((l) => l.split(" ")[4] === path)
    .at(-1);
  if (line === undefined) return undefined;
  const [left, right] = line.split(" - ") as [string, string];
  return {
    source: right.split(" ")[1] as string,
    readonly: (left.split(" ")[5] ?? "").split(",").includes("ro"),
  };
}

async function writeErrno(path: string, position: number): Promise<string> {
  try {
    const fh = await open(path, "r+");
    try {
      await fh.write(Buffer.from("overwrite"), 0, 9, position);
      await fh.sync();
      return "written";
    } finally {
      await fh.close();
    }
  } catch (e) {
    return (e as NodeJS.ErrnoException).code ?? String(e);
  }
}

test("reader-only modes: the device is read-only in the kernel, mounts are ro, writes fail; a writer stage later writes again", async () => {
  const v = await volume(64 * MIB);
  const rw = mountCap("ext4");
  const rox = { ...rw, accessMode: { mode: Mode.MULTI_NODE_READER_ONLY } };
  const blank = await volume(64 * MIB);
  expect(await codeOf(stage(blank, rox))).toBe(Code.FailedPrecondition);
  expect(await blkidType(files.at(-1) as string)).toBeUndefined();

  await stage(v, rw);
  await publish(v, rw, v.target);
  writeFileSync(join(v.target, "seed"), "written by the writer");
  await unpublish(v, v.target);
  await unstage(v);

  await stage(v, rox);
  const staged = mountSource(v.staging);
  expect(staged?.readonly).toBe(true);
  const device = staged?.source as string;
  expect((await sh("blockdev", "--getro", device)).trim()).toBe("1");
  // Not asked read-only, published read-only all the same.
  await publish(v, rox, v.target, false);
  expect(mountSource(v.target)?.readonly).toBe(true);
  expect(readFileSync(join(v.target, "seed"), "utf8")).toBe("written by the writer");
  let fileErr = "written";
  try {
    writeFileSync(join(v.target, "new"), "x");
  } catch (e) {
    fileErr = (e as NodeJS.ErrnoException).code ?? String(e);
  }
  expect(fileErr).toBe("EROFS");
  // Nor can anything on the node write the device underneath the filesystem.
  expect(await writeErrno(device, 0)).toMatch(/EPERM|EROFS|EACCES/);
  await unpublish(v, v.target);
  await unstage(v);

  const blockRox = { ...blockCap, accessMode: { mode: Mode.SINGLE_NODE_READER_ONLY } };
  await stage(v, blockRox);
  const blockTarget = join(root, "pods", "block-rox");
  await publish(v, blockRox, blockTarget, false);
  expect(await writeErrno(blockTarget, 4096)).toMatch(/EPERM|EROFS|EACCES/);
  await unpublish(v, blockTarget);
  await unstage(v);

  // The read-only flag went with the reader stage: a writer stage writes again.
  await stage(v, rw);
  await publish(v, rw, v.target);
  writeFileSync(join(v.target, "after"), "writer again");
  expect(readFileSync(join(v.target, "seed"), "utf8")).toBe("written by the writer");
  await unpublish(v, v.target);
  await unstage(v);
});

test("volume_mount_group: the filesystem tree belongs to the group, set-group-ID, for ext4 and xfs", async () => {
  for (const [fsType, size] of [
    ["ext4", 64 * MIB],
    ["xfs", 320 * MIB],
  ] as const) {
    const v = await volume(size);
    const plain = mountCap(fsType);
    await stage(v, plain);
    await publish(v, plain, v.target);
    mkdirSync(join(v.target, "old-dir"));
    writeFileSync(join(v.target, "old-dir", "old-file"), "before the group");
    await unpublish(v, v.target);
    const grouped = {
      ...plain,
      accessType: { case: "mount" as const, value: { fsType, mountFlags: [], volumeMountGroup: "4321" } },
    };
    await publish(v, grouped, v.target);
    const st = (p: string) => sh("stat", "-c", "%g %A", p).then((o) => o.trim());
    expect(await st(v.target)).toMatch(/^4321 drwxrwsr-x$/);
    expect(await st(join(v.target, "old-dir"))).toMatch(/^4321 drwxrwsr-x$/);
    expect(await st(join(v.target, "old-dir", "old-file"))).toMatch(/^4321 -rw-rw-r--$/);
    // A new entry inherits the group through set-group-ID.
    writeFileSync(join(v.target, "new-file"), "after");
    expect((await st(join(v.target, "new-file"))).split(" ")[0]).toBe("4321");
    await unpublish(v, v.target);
    await unstage(v);
  }
});

test("mkfsOptions from the volume context shape the real filesystem", async () => {
  const v = await volume(64 * MIB);
  const withOpts = {
    ...v,
    volumeContext: { ...v.volumeContext, [VolumeContextKeys.mkfsOptions]: "-b 1024 -I 128" },
  };
  await stage(withOpts, mountCap("ext4"));
  const device = mountSource(v.staging)?.source as string;
  const sb = await sh("dumpe2fs", "-h", device);
  expect(sb).toMatch(/^Block size:\s+1024$/m);
  expect(sb).toMatch(/^Inode size:\s+128$/m);
  await unstage(v);
  const x = await volume(320 * MIB);
  const refused = { ...x, volumeContext: { ...x.volumeContext, [VolumeContextKeys.mkfsOptions]: "-f" } };
  expect(await codeOf(stage(refused, mountCap("xfs")))).toBe(Code.InvalidArgument);
  expect(await blkidType(files.at(-1) as string)).toBeUndefined();
});

test("health turns INACCESSIBLE when the target drops the host, and recovers", async () => {
  const v = await volume(64 * MIB);
  const cap = mountCap("ext4");
  await stage(v, cap);
  expect(await health(v)).toEqual([]);
  // SPDK disconnects a removed host's controllers at once; the host then reconnects every second.
  await target.rpc.call("nvmf_subsystem_remove_host", { nqn: v.spec.nqn, host: HOST });
  await until("health INACCESSIBLE", async () => (await health(v))?.length === 1);
  expect(await health(v)).toEqual([["INACCESSIBLE", "ControllerNotLive"]]);
  await target.rpc.call("nvmf_subsystem_add_host", { nqn: v.spec.nqn, host: HOST });
  await until("health recovered", async () => (await health(v))?.length === 0);
  expect(await health(v)).toEqual([]);
  await unstage(v);
});
