// The fabric over real TCP (the real-cluster lab's): a target listener binds its traddr, an
// initiator's controller connects through it and its block I/O lands in the target's lvol; an
// address the machine lacks fails the listen, a port nobody serves fails the connect with ENODEV.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "../../cluster/control-plane.ts";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import {
  connectController,
  createTcpFabric,
  FabricConnectError,
  TCP_FABRIC_RDMA_PORT_OFFSET,
  tcpFabricPort,
} from "./fabric.ts";
import { call } from "./raw-rpc-client.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";

const MIB = 1024 * 1024;
const NQN = "nqn.2026-02.io.distort:volume-tcp1";
const HOST = "nqn.2014-08.org.nvmexpress:uuid:0b8f54a2-9d3c-4e61-a7f0-3c2b1d0e9f8a";
const HOSTID = "0b8f54a2-9d3c-4e61-a7f0-3c2b1d0e9f8a";

let root: string;
let target: SpdkEmulator;
let port: number;
const fabric = createTcpFabric();

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-tcpfab-"));
  port = await freePort();
  target = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "t.sock"),
    dataDir: join(root, "t"),
    fabric,
    drives: [{ pciAddress: "0000:5e:00.0", serial: "S5E", model: "Sim", sizeBytes: 64 * MIB }],
  });
  const t = target.socketPath;
  await call(t, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: "0000:5e:00.0" });
  await call(t, "bdev_lvol_create_lvstore", { bdev_name: "Nvme0n1", lvs_name: "lvs0" });
  await call(t, "bdev_lvol_create", {
    lvs_name: "lvs0",
    lvol_name: "v1",
    size_in_mib: 8,
    thin_provision: true,
  });
  await call(t, "nvmf_create_transport", { trtype: "TCP" });
  await call(t, "nvmf_create_subsystem", { nqn: NQN, serial_number: "DISTORT0002" });
  await call(t, "nvmf_subsystem_add_ns", { nqn: NQN, namespace: { bdev_name: "lvs0/v1" } });
  await call(t, "nvmf_subsystem_add_listener", {
    nqn: NQN,
    listen_address: { trtype: "tcp", adrfam: "ipv4", traddr: "127.0.0.1", trsvcid: String(port) },
  });
  await call(t, "nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
});

afterAll(async () => {
  await target.close();
  rmSync(root, { recursive: true, force: true });
});

test("a controller connected over TCP writes into the target's lvol and reads it back", async () => {
  const ctrl = await connectController(fabric, {
    trtype: "TCP",
    traddr: "127.0.0.1",
    trsvcid: String(port),
    subnqn: NQN,
    hostnqn: HOST,
    hostid: HOSTID,
  });
  try {
    const data = Buffer.alloc(4096, 0x5a);
    data.write("over real TCP", 0);
    await ctrl.write(1, 4096, data);
    expect((await target.bdev("lvs0/v1").read(4096, 4096)).equals(data)).toBe(true);
    expect((await ctrl.read(1, 4096, 4096)).equals(data)).toBe(true);
  } finally {
    ctrl.close();
  }
});

test("a host the subsystem does not allow is refused over TCP as over the unix fabric", async () => {
  const err = await connectController(fabric, {
    trtype: "TCP",
    traddr: "127.0.0.1",
    trsvcid: String(port),
    subnqn: NQN,
    hostnqn: "nqn.2014-08.org.nvmexpress:uuid:someone-else",
    hostid: HOSTID,
  }).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(FabricConnectError);
  expect((err as FabricConnectError).errno).toBe(Errno.EIO);
});

test("nothing listening on the port: ENODEV", async () => {
  const other = await freePort();
  const err = await fabric
    .dial({ trtype: "TCP", traddr: "127.0.0.1", trsvcid: String(other) })
    .catch((e: unknown) => e);
  expect(err).toBeInstanceOf(FabricConnectError);
  expect((err as FabricConnectError).errno).toBe(Errno.ENODEV);
});

test("listening on an address this machine does not have fails like bind(): EADDRNOTAVAIL", async () => {
  // 192.0.2.0/24 (TEST-NET-1) is on no interface here; bind() fails locally, nothing is sent.
  const err = await fabric
    .listen({ trtype: "TCP", traddr: "192.0.2.77", trsvcid: "4420" }, () => {})
    .catch((e: unknown) => e);
  expect(err).toBeInstanceOf(ErrnoError);
  expect((err as ErrnoError).errno).toBe(Errno.EADDRNOTAVAIL);
});

test("a second listener on one address and port is EBUSY; RDMA uses the offset port", async () => {
  const err = await fabric
    .listen({ trtype: "TCP", traddr: "127.0.0.1", trsvcid: String(port) }, () => {})
    .catch((e: unknown) => e);
  expect((err as ErrnoError).errno).toBe(Errno.EBUSY);
  expect(tcpFabricPort({ trtype: "RDMA", traddr: "x", trsvcid: "4420" })).toBe(
    4420 + TCP_FABRIC_RDMA_PORT_OFFSET,
  );
  expect(() => tcpFabricPort({ trtype: "TCP", traddr: "x", trsvcid: "ninety" })).toThrow("not a TCP port");
  expect(() => tcpFabricPort({ trtype: "RDMA", traddr: "x", trsvcid: "50000" })).toThrow(
    "no TCP stand-in port",
  );
});
