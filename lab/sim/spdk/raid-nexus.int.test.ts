// A replicated volume's nexus across two emulator processes on the TCP fabric: replica node B
// exports an lvol, nexus node A mirrors it with a local lvol in a raid1 and exports the raid; a
// host writes through A. B is killed (SIGKILL) while the host writes: with ctrlr_loss_timeout_sec
// -1 the write is not acknowledged while B is down, A's controller reads resetting or
// reconnect_is_delayed, the raid stays 2/2; B is started again over the same drive and
// configured again, A reconnects, and the held write completes on both replicas. On the way, B's
// examine finds the nexus raid's superblock on its replica and assembles that raid on B.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { connectController, createTcpFabric } from "./fabric.ts";
import { call } from "./raw-rpc-client.ts";

const MIB = 1024 * 1024;
const REPLICA_NQN = "nqn.2016-06.io.spdk:replica-b";
const EXPORT_NQN = "nqn.2016-06.io.spdk:raid-export";
const HOST_A = "nqn.2016-06.io.spdk:host-a";
// A port of our own on 127.0.0.0/8 (every address there is local), away from 4420.
const PORT = String(20000 + (process.pid % 20000));
const B_ADDR = { trtype: "TCP", adrfam: "IPv4", traddr: "127.0.0.201", trsvcid: PORT };
const A_ADDR = { trtype: "TCP", adrfam: "IPv4", traddr: "127.0.0.200", trsvcid: PORT };

let root: string;
const procs = new Map<string, Subprocess>();

function drives(name: string, pci: string): string {
  const f = join(root, `${name}-drives.json`);
  writeFileSync(
    f,
    JSON.stringify([{ pciAddress: pci, serial: `S-${name}`, model: "Sim", sizeBytes: 256 * MIB }]),
  );
  return f;
}

/** Starts node `name` as its own nvmf_tgt stand-in process; resolves with its RPC socket. */
async function start(name: string, pci: string): Promise<string> {
  const sock = join(root, `${name}.sock`);
  const proc = Bun.spawn(
    [
      process.execPath,
      join(import.meta.dir, "nvmf-tgt.ts"),
      "-r",
      sock,
      "--sim-data-dir",
      join(root, name),
      "--sim-drives",
      drives(name, pci),
      "--sim-fabric",
      "tcp",
      "--sim-host-nqn",
      name === "a" ? HOST_A : `nqn.2016-06.io.spdk:host-${name}`,
      "--sim-rpc-poll-ms",
      "0",
    ],
    { stdout: "ignore", stderr: "pipe" },
  );
  procs.set(name, proc);
  for (let i = 0; i < 500; i++) {
    if (
      await call(sock, "spdk_get_version").then(
        () => true,
        () => false,
      )
    )
      return sock;
    await Bun.sleep(10);
  }
  proc.kill("SIGKILL");
  throw new Error(`node ${name} did not come up: ${await new Response(proc.stderr).text()}`);
}

/** B's export of its replica lvol (the lvstore and lvol persist on B's drive across restarts). */
async function configureB(sock: string, first: boolean): Promise<void> {
  await call(sock, "bdev_nvme_attach_controller", { name: "NvmeB", trtype: "PCIe", traddr: "0000:b0:00.0" });
  if (first) {
    await call(sock, "bdev_lvol_create_lvstore", { bdev_name: "NvmeBn1", lvs_name: "lvsB", cluster_sz: MIB });
    await call(sock, "bdev_lvol_create", { lvs_name: "lvsB", lvol_name: "rB", size_in_mib: 64 });
  } else {
    // The replica carries the nexus raid's superblock (A wrote it through the fabric), so B's
    // examine assembles that raid on B, configuring 1/2, and claims the replica: it could not be
    // exported again. Deleting that raid releases the replica and leaves its superblock alone.
    await call(sock, "bdev_wait_for_examine");
    const raids = (await call(sock, "bdev_raid_get_bdevs", { category: "all" })) as {
      name: string;
      state: string;
      num_base_bdevs_discovered: number;
    }[];
    expect(raids).toMatchObject([{ name: "r1", state: "configuring", num_base_bdevs_discovered: 1 }]);
    expect(await call(sock, "bdev_raid_delete", { name: "r1" })).toBe(true);
  }
  await call(sock, "nvmf_create_transport", { trtype: "TCP" });
  await call(sock, "nvmf_create_subsystem", { nqn: REPLICA_NQN, allow_any_host: false });
  await call(sock, "nvmf_subsystem_add_ns", { nqn: REPLICA_NQN, namespace: { bdev_name: "lvsB/rB" } });
  await call(sock, "nvmf_subsystem_add_listener", { nqn: REPLICA_NQN, listen_address: B_ADDR });
  await call(sock, "nvmf_subsystem_add_host", { nqn: REPLICA_NQN, host: HOST_A });
}

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "distort-nexus-"));
});

afterAll(async () => {
  for (const p of procs.values()) {
    p.kill("SIGKILL");
    await p.exited;
  }
  rmSync(root, { recursive: true, force: true });
});

test("the nexus holds a write while its remote replica's node is down and completes it on both after the node returns", async () => {
  let b = await start("b", "0000:b0:00.0");
  await configureB(b, true);
  const a = await start("a", "0000:a0:00.0");
  await call(a, "bdev_nvme_attach_controller", { name: "NvmeA", trtype: "PCIe", traddr: "0000:a0:00.0" });
  await call(a, "bdev_lvol_create_lvstore", { bdev_name: "NvmeAn1", lvs_name: "lvsA", cluster_sz: MIB });
  await call(a, "bdev_lvol_create", { lvs_name: "lvsA", lvol_name: "l1", size_in_mib: 64 });
  expect(
    await call(a, "bdev_nvme_attach_controller", {
      name: "rb",
      trtype: "tcp",
      adrfam: "ipv4",
      traddr: B_ADDR.traddr,
      trsvcid: B_ADDR.trsvcid,
      subnqn: REPLICA_NQN,
      hostnqn: HOST_A,
      ctrlr_loss_timeout_sec: -1,
      reconnect_delay_sec: 1,
    }),
  ).toEqual(["rbn1"]);
  await call(a, "bdev_raid_create", {
    name: "r1",
    raid_level: "raid1",
    base_bdevs: ["lvsA/l1", "rbn1"],
    superblock: true,
  });
  await call(a, "nvmf_create_transport", { trtype: "TCP" });
  await call(a, "nvmf_create_subsystem", { nqn: EXPORT_NQN, allow_any_host: true });
  await call(a, "nvmf_subsystem_add_ns", { nqn: EXPORT_NQN, namespace: { bdev_name: "r1" } });
  await call(a, "nvmf_subsystem_add_listener", { nqn: EXPORT_NQN, listen_address: A_ADDR });

  const fabric = createTcpFabric();
  const host = await connectController(fabric, {
    trtype: "TCP",
    traddr: A_ADDR.traddr,
    trsvcid: A_ADDR.trsvcid,
    subnqn: EXPORT_NQN,
    hostnqn: "nqn.2016-06.io.spdk:consumer",
    hostid: "0e2b0c0a-1111-4222-8333-444455556666",
  });
  try {
    await host.write(1, 0, Buffer.alloc(4096, 1));

    procs.get("b")?.kill("SIGKILL");
    await procs.get("b")?.exited;
    let acked = false;
    let failed: unknown;
    const w = host.write(1, 4096, Buffer.alloc(4096, 2)).then(
      () => {
        acked = true;
      },
      (err) => {
        failed = err;
      },
    );
    await Bun.sleep(2500);
    expect(acked).toBe(false);
    const [ctrl] = (await call(a, "bdev_nvme_get_controllers", { name: "rb" })) as {
      ctrlrs: { state: string }[];
    }[];
    expect(["resetting", "reconnect_is_delayed"]).toContain(ctrl?.ctrlrs[0]?.state as string);
    const [r1] = (await call(a, "bdev_raid_get_bdevs", { category: "all" })) as {
      num_base_bdevs_discovered: number;
    }[];
    expect(r1?.num_base_bdevs_discovered).toBe(2);

    b = await start("b", "0000:b0:00.0");
    await configureB(b, false);
    await Promise.race([w, Bun.sleep(5000)]);
    expect({ acked, failed }).toEqual({ acked: true, failed: undefined });
    // Both replicas hold the write, past the raid's 256-block superblock area.
    const replica = await connectController(fabric, {
      trtype: "TCP",
      traddr: B_ADDR.traddr,
      trsvcid: B_ADDR.trsvcid,
      subnqn: REPLICA_NQN,
      hostnqn: HOST_A,
      hostid: "0e2b0c0a-1111-4222-8333-444455556667",
    });
    try {
      expect((await replica.read(1, 256 * 4096 + 4096, 4096)).equals(Buffer.alloc(4096, 2))).toBe(true);
    } finally {
      replica.close();
    }
    expect((await host.read(1, 4096, 4096)).equals(Buffer.alloc(4096, 2))).toBe(true);
  } finally {
    host.close();
  }
});
