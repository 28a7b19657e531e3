// bdev_set_qos_limit on the emulator against real SPDK v25.05.1 (testdata/spdk-v25.05.1-qos.jsonl,
// scenario 3 of the ha-qos-tls capture): every request replayed in order on a malloc bdev like
// the captured m0, each reply compared with SPDK's, and the limits read back from bdev_get_bdevs.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { call, rpc } from "./raw-rpc-client.ts";

interface QosRecord {
  seq: number;
  method: string;
  request: { params?: unknown };
  response: { result?: unknown; error?: { code: number; message: string } };
}

const RECORDS: QosRecord[] = readFileSync(
  join(import.meta.dir, "../../../testdata/spdk-v25.05.1-qos.jsonl"),
  "utf8",
)
  .split("\n")
  .filter((l) => l.trim() !== "")
  .map((l) => JSON.parse(l) as QosRecord);

const root = mkdtempSync(join(tmpdir(), "distort-sim-qos-"));
let emu: SpdkEmulator;

beforeAll(async () => {
  // What is answered, not when: rpc-clock.test.ts covers the poller.
  emu = await startSpdkEmulator({ rpcPollMs: 0, socketPath: join(root, "t.sock"), dataDir: join(root, "t") });
  // The capture's m0: 16384 blocks of 4 KiB.
  await call(emu.socketPath, "bdev_malloc_create", { name: "m0", num_blocks: 16384, block_size: 4096 });
});
afterAll(async () => {
  await emu.close();
  rmSync(root, { recursive: true, force: true });
});

test("the capture holds the QoS calls it is used for", () => {
  expect(RECORDS.filter((r) => r.method === "bdev_set_qos_limit").length).toBe(13);
  expect(RECORDS.filter((r) => r.method === "bdev_get_bdevs").length).toBe(6);
});

test("every bdev_set_qos_limit reply and every assigned_rate_limits read back matches SPDK's", async () => {
  for (const r of RECORDS) {
    const got = await rpc(emu.socketPath, r.method, r.request.params);
    if (r.method === "bdev_set_qos_limit") {
      expect({ seq: r.seq, result: got.result, error: got.error }).toEqual({
        seq: r.seq,
        result: r.response.result,
        error: r.response.error,
      });
    } else {
      const want = (r.response.result as { assigned_rate_limits: unknown }[])[0]?.assigned_rate_limits;
      const have = (got.result as { assigned_rate_limits: unknown }[])[0]?.assigned_rate_limits;
      expect({ seq: r.seq, limits: have }).toEqual({ seq: r.seq, limits: want });
    }
  }
});

test("assigned_rate_limits sits between uuid and claimed, as SPDK prints it", async () => {
  const [b] = (await call(emu.socketPath, "bdev_get_bdevs", { name: "m0" })) as Record<string, unknown>[];
  const keys = Object.keys(b ?? {});
  expect(keys.slice(keys.indexOf("uuid"), keys.indexOf("uuid") + 3)).toEqual([
    "uuid",
    "assigned_rate_limits",
    "claimed",
  ]);
});

test("an unknown bdev is refused before a request without limits is", async () => {
  const r = await rpc(emu.socketPath, "bdev_set_qos_limit", { name: "nope" });
  expect(r.error).toEqual({ code: -19, message: "No such device" });
});
