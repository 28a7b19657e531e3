// The emulated target's side of the fabric data path: flush, deallocate and write zeroes served
// from the bdev, I/O queues admitted only for a live controller of the same host, keep-alive
// timeout cutting a silent controller, remove_host cutting every queue at once, and ANA states set
// over RPC reaching connected controllers.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { connect as netConnect } from "node:net";
import { startTestTarget, type TestTarget } from "../fabric/test-target.ts";
import { connectController } from "./fabric.ts";
import { encodeFrame, FrameDecoder, type Message } from "./fabric-protocol.ts";

const MIB = 1024 * 1024;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:cb39fbf1-e515-48f8-830b-34f0b60eceb0";
const NQN = "nqn.2026-01.io.distort:vol-io-1";
const addr = { trtype: "TCP", traddr: "10.2.0.7", trsvcid: "4420" };
let target: TestTarget;
let file: string;

beforeAll(async () => {
  // What is answered, not when: rpc-clock.test.ts covers the poller.
  target = await startTestTarget({ rpcPollMs: 0 });
  file = await target.exportFile({
    nqn: NQN,
    sizeBytes: 4 * MIB,
    hosts: [HOST],
    uuid: "0d9b0e2c-6a1f-4c55-8e0b-2f4a7c9d1e33",
    traddr: addr.traddr,
    trsvcid: addr.trsvcid,
  });
});
afterAll(() => target.close());

const open = (o: { kato?: number } = {}) =>
  connectController(target.fabric, { ...addr, subnqn: NQN, hostnqn: HOST, hostid: "h-1", ...o });

async function until(what: string, fn: () => boolean): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!fn()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(20);
  }
}

test("write, flush, write zeroes and deallocate land in the bdev's bytes", async () => {
  const c = await open();
  await c.write(1, 8192, Buffer.alloc(8192, 0x5a));
  await c.flush(1);
  expect(readFileSync(file).subarray(8192, 16384).equals(Buffer.alloc(8192, 0x5a))).toBe(true);
  await c.writeZeroes(1, 8192, 4096);
  expect(readFileSync(file).subarray(8192, 12288).equals(Buffer.alloc(4096))).toBe(true);
  expect((await c.read(1, 12288, 4096)).equals(Buffer.alloc(4096, 0x5a))).toBe(true);
  // AIO bdevs do not deallocate: the command completes and the bytes stay, as SPDK's DSM does.
  await c.discard(1, 12288, 4096);
  expect((await c.read(1, 12288, 4096)).equals(Buffer.alloc(4096, 0x5a))).toBe(true);
  // A namespace that is not there fails the command.
  expect(await c.write(7, 0, Buffer.alloc(4096)).catch((e) => e.errno)).toBe(5);
  c.close();
});

/** Sends one CONNECT on a raw socket and returns the target's verdict. */
async function rawConnect(fields: Partial<Extract<Message, { op: "connect" }>>): Promise<Message> {
  const sock = netConnect(target.fabric.socketPath(addr));
  await new Promise((r) => sock.once("connect", r));
  const dec = new FrameDecoder();
  const reply = new Promise<Message>((resolve) =>
    sock.on("data", (b: Buffer) => {
      const f = dec.push(b)[0];
      if (f) resolve(f.msg);
    }),
  );
  sock.write(
    encodeFrame({
      op: "connect",
      tag: 1,
      subnqn: NQN,
      hostnqn: HOST,
      hostid: "h-1",
      peerAddress: addr.traddr,
      peerPort: "40000",
      ...fields,
    } as Message),
  );
  const m = await reply;
  sock.destroy();
  return m;
}

test("an I/O queue is admitted only for a live controller of the same host", async () => {
  const c = await open();
  const cntlid = c.ctrlr.cntlid;
  expect((await rawConnect({ qid: 1, cntlid })).op).toBe("connected");
  expect(await rawConnect({ qid: 1, cntlid: cntlid + 100 })).toMatchObject({
    op: "rejected",
    reason: `unknown controller ID ${cntlid + 100}`,
  });
  expect(await rawConnect({ qid: 1, cntlid, hostid: "someone-else" })).toMatchObject({ op: "rejected" });
  c.close();
  await until(
    "controller gone",
    () => target.emulator.state().subsystems.find((s) => s.nqn === NQN)?.controllers.length === 0,
  );
  expect(await rawConnect({ qid: 1, cntlid })).toMatchObject({ op: "rejected" });
});

test("remove_host cuts the controller's queues at once; the reconnect is refused", async () => {
  const c = await open();
  let closed = false;
  c.onClose(() => {
    closed = true;
  });
  await target.rpc.call("nvmf_subsystem_remove_host", { nqn: NQN, host: HOST });
  await until("controller closed", () => closed);
  expect(await c.write(1, 0, Buffer.alloc(4096)).catch((e) => e.errno)).toBe(5);
  expect((await open().catch((e) => e)).message).toContain(`host ${HOST} not allowed`);
  await target.rpc.call("nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
});

test("a controller that stops sending Keep Alive is disconnected after its kato", async () => {
  // Meanwhile, one that sends them (the initiator's controller, every kato/2) stays across several katos.
  const stays = (async () => {
    const c = await open({ kato: 300 });
    await Bun.sleep(900);
    expect(c.closed).toBe(false);
    c.close();
  })();
  // kato on the wire, but this raw admin queue never sends Keep Alive.
  const sock = netConnect(target.fabric.socketPath(addr));
  let closed = false;
  sock.on("close", () => {
    closed = true;
  });
  const dec = new FrameDecoder();
  const verdict = new Promise<Message>((resolve) =>
    sock.on("data", (b: Buffer) => {
      const f = dec.push(b)[0];
      if (f) resolve(f.msg);
    }),
  );
  await new Promise((r) => sock.once("connect", r));
  sock.write(
    encodeFrame({
      op: "connect",
      tag: 1,
      subnqn: NQN,
      hostnqn: HOST,
      hostid: "h-ka",
      peerAddress: addr.traddr,
      peerPort: "40001",
      qid: 0,
      kato: 300,
    }),
  );
  expect((await verdict).op).toBe("connected");
  await until("keep-alive timeout closes the admin queue", () => closed);
  await stays;
});

test("ANA: a subsystem with ana_reporting reports per-listener states and notifies its controllers", async () => {
  const ana = "nqn.2026-01.io.distort:vol-ana";
  await target.rpc.call("nvmf_create_subsystem", { nqn: ana, allow_any_host: true, ana_reporting: true });
  await target.rpc.call("bdev_malloc_create", { name: "m_ana", num_blocks: 256, block_size: 4096 });
  await target.rpc.call("nvmf_subsystem_add_ns", { nqn: ana, namespace: { bdev_name: "m_ana" } });
  const la = { trtype: "TCP", adrfam: "IPv4", traddr: "10.2.0.8", trsvcid: "4420" };
  await target.rpc.call("nvmf_subsystem_add_listener", { nqn: ana, listen_address: la });
  const listeners = (await target.rpc.call("nvmf_subsystem_get_listeners", { nqn: ana })) as {
    ana_states: { ana_group: number; ana_state: string }[];
  }[];
  expect(listeners[0]?.ana_states).toHaveLength(32);
  const c = await connectController(target.fabric, {
    ...addr,
    traddr: la.traddr,
    subnqn: ana,
    hostnqn: HOST,
    hostid: "h-1",
  });
  expect(c.anaState).toBe("optimized");
  await target.rpc.call("nvmf_subsystem_listener_set_ana_state", {
    nqn: ana,
    listen_address: la,
    ana_state: "inaccessible",
  });
  await until("ANA change", () => c.anaState === "inaccessible");
  const refused = await target.rpc
    .call("nvmf_subsystem_listener_set_ana_state", {
      nqn: NQN,
      listen_address: { ...la, traddr: addr.traddr },
      ana_state: "optimized",
    })
    .catch((e: Error) => e);
  expect((refused as Error).message).toContain("error setting ANA state: -22");
  c.close();
});
