// NexusAssembler against two emulated nvmf_tgt processes on one simulated fabric: a "copies" target
// exporting three volumes as the copies' agents would (each under a namespace UUID of its own,
// admitting only the nexus host), and the serving node's target, which attaches them, builds the
// raid1, finds it again after its own crash (re-assembled from the superblocks), takes out a
// member that is no longer current, and tears it all down.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "../../lab/sim/spdk/emulator.ts";
import { createFabric } from "../../lab/sim/spdk/fabric.ts";
import { StorageError } from "../../lib/errors.ts";
import { dirKeyFiles } from "../../lib/key-files.ts";
import { silentLogger } from "../../lib/log.ts";
import { SpdkClient } from "../../lib/spdk/client.ts";
import { SpdkMethods } from "../../lib/spdk/methods.ts";
import { nexusBdevFor, nexusHostNqnFor } from "../../lib/volume-identity.ts";
import { SpdkTarget } from "../backends/spdk/target.ts";
import { externalIdFor, nqnFor, serialNumberFor } from "../partitions/identity.ts";
import { NexusAssembler } from "./assembler.ts";
import type { CopyEndpoint, NexusPlan } from "./decide.ts";
import { nexusControllerNameFor, nexusRaidUuidFor, replicaNamespaceUuidFor } from "./identity.ts";

const MiB = 1024 * 1024;
const HOST = nexusHostNqnFor("node-n");
const VUID = "9d2c6c4e-0f53-4b7e-9f0e-3f7f3c0a1b2c";
const uidOf = (i: number) => `copy-uid-${i}`;

let root: string;
let copiesEmu: SpdkEmulator;
let nexusEmu: SpdkEmulator;
const clients: SpdkClient[] = [];
let copyMethods: SpdkMethods;
let copyTarget: SpdkTarget;
let nexusMethods: SpdkMethods;
let nexus: NexusAssembler;

function client(emu: SpdkEmulator): SpdkClient {
  const c = new SpdkClient({ socketPath: emu.socketPath, logger: silentLogger });
  clients.push(c);
  return c;
}

/** Runs `fn` again while the target is unreachable (the first call after a crash fails). */
async function retrying<T>(fn: () => Promise<T>): Promise<T> {
  for (let i = 0; ; i++) {
    try {
      return await fn();
    } catch (err) {
      if (i >= 20 || !(err instanceof StorageError && err.kind === "unavailable")) throw err;
      await Bun.sleep(50);
    }
  }
}

function member(i: number): CopyEndpoint {
  const ext = externalIdFor(uidOf(i));
  return {
    name: `vol-r${i}`,
    uid: uidOf(i),
    controller: nexusControllerNameFor(uidOf(i)),
    trtype: "TCP",
    adrfam: "IPv4",
    traddr: "127.0.0.1",
    trsvcid: "4420",
    subnqn: nqnFor(ext),
    serialNumber: serialNumberFor(ext),
  };
}

function plan(members: number[]): NexusPlan {
  const ext = externalIdFor(VUID);
  return {
    externalId: ext,
    nqn: nqnFor(ext),
    raidBdev: nexusBdevFor(ext),
    raidUuid: nexusRaidUuidFor(VUID),
    hostNqn: HOST,
    members: members.map(member),
    transport: "tcp",
    sizeBytes: 8 * MiB,
    qos: { rwIosPerSec: 0, rwMBytesPerSec: 0, rMBytesPerSec: 0, wMBytesPerSec: 0 },
  };
}

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "nexus-"));
  const fabric = createFabric(join(root, "f"));
  copiesEmu = await startSpdkEmulator({ socketPath: join(root, "c.sock"), dataDir: join(root, "c"), fabric });
  nexusEmu = await startSpdkEmulator({ socketPath: join(root, "n.sock"), dataDir: join(root, "n"), fabric });
  const c = client(copiesEmu);
  copyMethods = new SpdkMethods(c);
  const target = new SpdkTarget({
    methods: copyMethods,
    rpc: c,
    binder: { bind: async () => {} },
    keyFiles: dirKeyFiles(join(root, "keys")),
    logger: silentLogger,
  });
  copyTarget = target;
  // Four copies as their agents export them; copy 3 admits nobody.
  for (const i of [0, 1, 2, 3]) {
    await c.call("bdev_malloc_create", { name: `m${i}`, num_blocks: (8 * MiB) / 512, block_size: 512 });
    const ext = externalIdFor(uidOf(i));
    await target.ensureExport({
      nqn: nqnFor(ext),
      volume: { externalId: ext, backendPath: `m${i}`, sizeBytes: 8 * MiB },
      transport: "tcp",
      address: "127.0.0.1",
      port: 4420,
      serialNumber: serialNumberFor(ext),
      namespaceUuid: replicaNamespaceUuidFor(uidOf(i)),
    });
    if (i !== 3) await target.setHosts(nqnFor(ext), [HOST]);
  }
  nexusMethods = new SpdkMethods(client(nexusEmu));
  nexus = new NexusAssembler(nexusMethods, silentLogger);
});

afterAll(async () => {
  for (const c of clients) await c.close();
  await nexusEmu?.close();
  await copiesEmu?.close();
  rmSync(root, { recursive: true, force: true });
});

test("a copy is exported under its own namespace UUID, not its bdev's", async () => {
  const [s] = await copyMethods.nvmfGetSubsystems(nqnFor(externalIdFor(uidOf(0))));
  const [bdev] = await copyMethods.bdevGetBdevs({ name: "m0" });
  expect(s?.namespaces?.[0]?.uuid).toBe(replicaNamespaceUuidFor(uidOf(0)));
  expect(s?.namespaces?.[0]?.uuid).not.toBe(bdev?.uuid);
});

test("an export whose namespace carries another UUID is repaired to the asked one, once", async () => {
  const c = client(copiesEmu);
  await c.call("bdev_malloc_create", { name: "m9", num_blocks: 2048, block_size: 512 });
  const ext = externalIdFor(uidOf(9));
  const spec = {
    nqn: nqnFor(ext),
    volume: { externalId: ext, backendPath: "m9", sizeBytes: MiB },
    transport: "tcp" as const,
    address: "127.0.0.1",
    port: 4420,
    serialNumber: serialNumberFor(ext),
  };
  await copyTarget.ensureExport(spec);
  const want = replicaNamespaceUuidFor(uidOf(9));
  expect(await copyTarget.ensureExport({ ...spec, namespaceUuid: want })).toEqual(["namespace"]);
  const [s] = await copyMethods.nvmfGetSubsystems(spec.nqn);
  expect(s?.namespaces?.map((n) => [n.nsid, n.uuid])).toEqual([[1, want]]);
  expect(await copyTarget.ensureExport({ ...spec, namespaceUuid: want })).toEqual([]);
  await copyTarget.removeExport(spec.nqn);
});

test("a copy that does not admit the nexus host keeps the raid from being built, and says so", async () => {
  const err = await nexus.ensureRaid(plan([0, 3])).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).kind).toBe("unavailable");
  expect((err as StorageError).message).toContain("refused this node's host");
  expect(await nexusMethods.bdevRaidGetBdevs("all")).toEqual([]);
  await nexus.teardown({
    nqn: plan([]).nqn,
    raidBdev: plan([]).raidBdev,
    controllers: [member(0).controller],
  });
  expect(await nexusMethods.bdevNvmeGetControllers()).toEqual([]);
});

test("builds the raid1 once, mirrors writes into every copy, and a second pass changes nothing", async () => {
  const p = plan([0, 1]);
  const first = await nexus.ensureRaid(p);
  expect(first.repaired).toEqual(["controller:vol-r0", "controller:vol-r1", "raid"]);
  expect(first.raid).toMatchObject({ state: "online", superblock: true, num_base_bdevs: 2 });
  expect(first.raid.uuid).toBe(p.raidUuid);
  // raid1 with a superblock keeps the first MiB of every member.
  expect(first.sizeBytes).toBe(7 * MiB);
  const again = await nexus.ensureRaid(p);
  expect(again.repaired).toEqual([]);

  const data = Buffer.alloc(64 * 1024, 0x5a);
  await nexusEmu.bdev(p.raidBdev).write(2 * MiB, data);
  for (const m of ["m0", "m1"])
    expect((await copiesEmu.bdev(m).read(3 * MiB, data.length)).equals(data)).toBe(true);
  expect((await copiesEmu.bdev("m2").read(3 * MiB, data.length)).equals(data)).toBe(false);
});

test("after its target crashed, the raid re-assembled from the superblocks is kept, not made again", async () => {
  const p = plan([0, 1]);
  await nexusEmu.crash();
  await nexusEmu.restart();
  const r = await retrying(() => nexus.ensureRaid(p));
  expect(r.repaired).toEqual(["controller:vol-r0", "controller:vol-r1"]);
  expect(r.raid.state).toBe("online");
  expect(r.raid.uuid).toBe(p.raidUuid);
  const data = Buffer.alloc(64 * 1024, 0x5a);
  expect((await nexusEmu.bdev(p.raidBdev).read(2 * MiB, data.length)).equals(data)).toBe(true);
});

test("a member that is no longer current is taken out of the raid", async () => {
  // Copy 1 fell behind; copy 2 is current now (it would join through a rebuild, not built yet).
  const r = await nexus.ensureRaid(plan([0, 2]));
  expect(r.repaired).toEqual(["controller:vol-r2", `removed-member:${member(1).controller}n1`]);
  const names = r.raid.base_bdevs_list.filter((b) => b.is_configured).map((b) => b.name);
  expect(names).toEqual([`${member(0).controller}n1`]);
  // Writes now reach copy 0 only: copy 1 is never written (nor read) again.
  const data = Buffer.alloc(4096, 0x77);
  await nexusEmu.bdev(plan([]).raidBdev).write(0, data);
  expect((await copiesEmu.bdev("m0").read(MiB, 4096)).equals(data)).toBe(true);
  expect((await copiesEmu.bdev("m1").read(MiB, 4096)).equals(data)).toBe(false);
});

test("a raid re-assembling for a member that is not current is not served, and says why", async () => {
  // Copy 1's superblock (from before it was taken out) names copies 0 and 1; examine assembles
  // from it and waits for copy 0, which this plan does not name.
  await nexusEmu.crash();
  await nexusEmu.restart();
  const err = await retrying(() => nexus.ensureRaid(plan([1, 2]))).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).kind).toBe("precondition");
  expect((err as StorageError).message).toContain(replicaNamespaceUuidFor(uidOf(0)));
  expect((err as StorageError).message).toContain("not current copies");
});

test("teardown deletes the raid and detaches every controller, and repeats as a no-op", async () => {
  const p = plan([]);
  const t = { nqn: p.nqn, raidBdev: p.raidBdev, controllers: [0, 1, 2].map((i) => member(i).controller) };
  const detached = await nexus.teardown(t);
  expect(detached.sort()).toEqual([member(1).controller, member(2).controller].sort());
  expect(await nexusMethods.bdevRaidGetBdevs("all")).toEqual([]);
  expect(await nexusMethods.bdevNvmeGetControllers()).toEqual([]);
  expect(await nexus.teardown(t)).toEqual([]);
});

test("a raid made from fewer current copies than the volume has keeps a slot for each other copy, which joins later", async () => {
  // A volume of its own, with three fresh copies (4, 5, 6): 4 and 5 current, 6 behind.
  const uid = "5b0e2d4a-6c1f-4e3b-8a9d-7f2e1c0b3a4d";
  for (const i of [4, 5, 6]) {
    await (clients[0] as SpdkClient).call("bdev_malloc_create", {
      name: `m${i}`,
      num_blocks: (8 * MiB) / 512,
      block_size: 512,
    });
    const ext = externalIdFor(uidOf(i));
    await copyTarget.ensureExport({
      nqn: nqnFor(ext),
      volume: { externalId: ext, backendPath: `m${i}`, sizeBytes: 8 * MiB },
      transport: "tcp",
      address: "127.0.0.1",
      port: 4420,
      serialNumber: serialNumberFor(ext),
      namespaceUuid: replicaNamespaceUuidFor(uidOf(i)),
    });
    await copyTarget.setHosts(nqnFor(ext), [HOST]);
  }
  const ext = externalIdFor(uid);
  const p: NexusPlan = {
    ...plan([4, 5]),
    externalId: ext,
    nqn: nqnFor(ext),
    raidBdev: nexusBdevFor(ext),
    raidUuid: nexusRaidUuidFor(uid),
    slots: 3,
  };
  const made = await nexus.ensureRaid(p);
  expect(made.repaired).toEqual(["controller:vol-r4", "controller:vol-r5", "raid-degraded"]);
  expect(made.raid).toMatchObject({ state: "online", num_base_bdevs: 3, num_base_bdevs_discovered: 2 });
  expect(made.raid.base_bdevs_list.filter((b) => b.is_configured).map((b) => b.name)).toEqual(
    [4, 5].map((i) => `${member(i).controller}n1`),
  );
  // No stand-in left behind.
  expect((await nexusMethods.bdevGetBdevs()).some((b) => b.name.includes("-standin"))).toBe(false);
  // Written degraded, then copy 6 joins through a rebuild into the slot kept for it.
  const data = Buffer.alloc(64 * 1024, 0x3d);
  await nexusEmu.bdev(p.raidBdev).write(MiB, data);
  const bdev = await nexus.attachCopy(member(6), HOST);
  await nexus.addMember(p.raidBdev, bdev);
  const deadline = Date.now() + 10_000;
  let raid = await nexus.raid(p.raidBdev);
  while (raid?.process && Date.now() < deadline) {
    await Bun.sleep(50);
    raid = await nexus.raid(p.raidBdev);
  }
  expect(raid).toMatchObject({ num_base_bdevs: 3, num_base_bdevs_discovered: 3 });
  expect(raid?.process).toBeUndefined();
  for (const m of ["m4", "m5", "m6"])
    expect((await copiesEmu.bdev(m).read(2 * MiB, data.length)).equals(data)).toBe(true);
  const t = { nqn: p.nqn, raidBdev: p.raidBdev, controllers: [4, 5, 6].map((i) => member(i).controller) };
  await nexus.teardown(t);
});
