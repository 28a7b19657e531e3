// QoS on the emulated target's data path: with rw_ios_per_sec 1000 (one I/O per 1 ms timeslice)
// and the target on a ManualClock, reads over the fabric complete one per timeslice the clock
// moves, and lifting the limit lets the rest through. No timing: the clock only moves when told.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { ManualClock } from "../../../lib/clock.ts";
import { startTestTarget, type TestTarget } from "../fabric/test-target.ts";
import { connectController } from "./fabric.ts";

const MIB = 1024 * 1024;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:5b0c8d4e-2f1a-4e6b-9c3d-7a8b9c0d1e2f";
const NQN = "nqn.2026-01.io.distort:vol-qos-1";
const addr = { trtype: "TCP", traddr: "10.2.0.9", trsvcid: "4420" };
const clock = new ManualClock(1_000_000);
let target: TestTarget;
let bdev: string;

beforeAll(async () => {
  // What is answered, not when: rpc-clock.test.ts covers the poller.
  target = await startTestTarget({ clock, rpcPollMs: 0 });
  await target.exportFile({
    nqn: NQN,
    sizeBytes: 4 * MIB,
    hosts: [HOST],
    uuid: "3e1f2a4b-5c6d-4e7f-8a9b-0c1d2e3f4a5b",
    traddr: addr.traddr,
    trsvcid: addr.trsvcid,
  });
  const [sub] = (await target.rpc.call("nvmf_get_subsystems", { nqn: NQN })) as {
    namespaces: { bdev_name: string }[];
  }[];
  bdev = sub?.namespaces[0]?.bdev_name as string;
});
afterAll(() => target.close());

async function until(what: string, fn: () => boolean): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!fn()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(10);
  }
}

test("reads over the fabric wait for their timeslice; lifting the limit releases them", async () => {
  const c = await connectController(target.fabric, { ...addr, subnqn: NQN, hostnqn: HOST, hostid: "h-q" });
  try {
    await target.rpc.call("bdev_set_qos_limit", { name: bdev, rw_ios_per_sec: 1000 });
    let done = 0;
    const reads = Array.from({ length: 4 }, (_, i) => c.read(1, i * 4096, 4096).then(() => done++));
    await until("the first read", () => done >= 1);
    // The clock stands still, so the other three are held (unthrottled, all four are done by the
    // time until() sees the first: checked by removing the admission from the target).
    expect(done).toBe(1);
    await clock.advanceAsync(1);
    await until("the second read", () => done >= 2);
    expect(done).toBe(2);
    await target.rpc.call("bdev_set_qos_limit", { name: bdev, rw_ios_per_sec: 0 });
    await Promise.all(reads);
    expect(done).toBe(4);
  } finally {
    c.close();
  }
});
