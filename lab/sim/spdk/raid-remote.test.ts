// The `[1 raid1]` records of SPDK v25.05.1 that need the remote member: target B exports a
// replica lvol over NVMe/TCP (seq 1-8), target A attaches it as rbn1 (9-15), builds r1 over a
// local lvol and rbn1 (16-39), exports r1 (40-43), loses B to a kill -9 (46-58: the controller
// reads failed, the raid notices only at the next write, which fails the member and succeeds),
// cleans up (59-62) and, after a rebuild onto l3 and a restart, re-adds a former member (88-93).
// Two emulators on one SimFabric; requests are sent as recorded (AIO file names made absolute)
// and replies compared byte for byte, UUIDs mapped by order of appearance, except the records
// listed in WALKED, which are checked by what they show, with the reason.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { connectController, createFabric, type FabricController, type SimFabric } from "./fabric.ts";
import { call, RawRpcConnection } from "./raw-rpc-client.ts";

interface Rec {
  seq: number;
  method: string;
  app: string;
  request: { params?: Record<string, unknown> };
  raw_request: string;
  raw_response: string;
}
const RECORDS = new Map<number, Rec>(
  readFileSync(join(import.meta.dir, "../../../testdata/spdk-v25.05.1-raid1.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as Rec)
    .map((r) => [r.seq, r]),
);

/** Records checked by what they show rather than byte for byte, and why. */
export const WALKED: Readonly<Record<number, string>> = {
  44: "bdev_get_iostat after spdk_dd: ticks and latencies are the capture host's, op counts follow spdk_dd's 4 KiB commands; bytes written are checked",
  45: "bdev_get_iostat of rbn1: as 44 (the raid's superblock write included)",
  91: "the rebuild's progress at t=0 depends on how far the copy got before the call (2048 blocks in the capture)",
};

const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g;
const ZERO = "00000000-0000-0000-0000-000000000000";
const MIB = 1024 * 1024;

function normalise(text: string): string {
  const seen = new Map<string, string>();
  return text.replace(UUID, (u) => {
    if (u === ZERO) return u;
    if (!seen.has(u)) seen.set(u, `<uuid${seen.size}>`);
    return seen.get(u) as string;
  });
}

let root: string;
let fabric: SimFabric;
let a: SpdkEmulator;
let b: SpdkEmulator;
let files: Record<string, string>;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-raidr-"));
  fabric = createFabric(join(root, "f"));
  files = { "s1/a.img": join(root, "a.img"), "s1/b.img": join(root, "b.img") };
  for (const [f, size] of [
    [files["s1/a.img"] as string, 512 * MIB],
    [files["s1/b.img"] as string, 256 * MIB],
  ] as const) {
    writeFileSync(f, "");
    truncateSync(f, size);
  }
  // rpcPollMs 0: replies do not depend on the RPC poller's pacing, and the tier stays fast.
  const opts = { fabric, rpcPollMs: 0 };
  b = await startSpdkEmulator({ socketPath: join(root, "b.sock"), dataDir: join(root, "b"), ...opts });
  a = await startSpdkEmulator({ socketPath: join(root, "a.sock"), dataDir: join(root, "a"), ...opts });
});

afterAll(async () => {
  await a?.close();
  await b?.close();
  rmSync(root, { recursive: true, force: true });
});

/** The emulator a record ran on. */
const appOf = (r: Rec) => (r.app.startsWith("nvmf_tgt(B)") ? b : a);

/** Sends a record's request (AIO file names made absolute) and returns the raw reply line. */
async function send(seq: number): Promise<{ rec: Rec; got: string }> {
  const rec = RECORDS.get(seq) as Rec;
  let raw = rec.raw_request;
  if (rec.method === "bdev_aio_create") {
    const f = rec.request.params?.filename as string;
    raw = raw.replace(JSON.stringify(f), JSON.stringify(files[f]));
  }
  const c = await RawRpcConnection.connect(appOf(rec).socketPath);
  try {
    c.send(raw);
    await c.replies(1, 5000);
    return { rec, got: c.received };
  } finally {
    c.close();
  }
}

/** Replays records byte for byte (UUIDs mapped). */
async function replay(...seqs: number[]): Promise<void> {
  for (const seq of seqs) {
    const { rec, got } = await send(seq);
    expect({ seq, reply: normalise(got) }).toEqual({ seq, reply: normalise(rec.raw_response) });
  }
}

const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

/** spdk_dd's stand-in: a host connected to A's export of r1. */
async function exportHost(): Promise<FabricController> {
  return connectController(fabric, {
    trtype: "TCP",
    traddr: "127.0.0.200",
    trsvcid: "4420",
    subnqn: "nqn.2016-06.io.spdk:raid-export",
    hostnqn: "nqn.2016-06.io.spdk:dd",
    hostid: "5d3c2b1a-0000-4000-8000-000000000001",
  });
}

/** Writes `mib` MiB of a pattern through the export in 1 MiB commands. */
async function writeThroughExport(mib: number, fill: number): Promise<void> {
  const h = await exportHost();
  try {
    for (let i = 0; i < mib; i++) await h.write(1, i * MIB, Buffer.alloc(MIB, fill));
  } finally {
    h.close();
  }
}

test("seq 1-15: B exports its replica, A's unlisted host NQN is refused, the listed one attaches rbn1", async () => {
  await replay(...range(1, 15));
});

test("seq 16-39 with the remote member: create, categories and refusals as SPDK's", async () => {
  // 33 (bdev_get_bdevs r1) is compared whole here, with rbn1 a real NVMe-oF bdev.
  await replay(...range(16, 39));
});

test("seq 40-45: r1 exported; writes through it reach both members", async () => {
  await replay(40, 41, 42, 43);
  await writeThroughExport(16, 0x5a);
  // spdk_dd wrote 4096 blocks of 4 KiB; this writes 16 commands of 1 MiB. The byte counts are
  // the capture's: 16 MiB into r1, and into rbn1 the same plus the raid's superblock block.
  for (const [seq, name, ops] of [
    [44, "r1", 16],
    [45, "rbn1", 17],
  ] as const) {
    const rec = RECORDS.get(seq) as Rec;
    const want = JSON.parse(rec.raw_response).result.bdevs[0] as { bytes_written: number };
    const { got } = await send(seq);
    const st = JSON.parse(got).result as {
      bdevs: { name: string; bytes_written: number; num_write_ops: number }[];
    };
    expect(st.bdevs[0]).toMatchObject({ name, bytes_written: want.bytes_written, num_write_ops: ops });
  }
  // Both members hold the data: B's replica lvol, at the raid's data offset (256 blocks).
  const onB = await b.bdev("lvsB/rB").read(MIB, 4096);
  expect(onB.equals(Buffer.alloc(4096, 0x5a))).toBe(true);
});

test("seq 46-58: B killed; the controller reads failed, the raid stays 2/2 until a write fails rbn1 and succeeds", async () => {
  await b.crash();
  await Bun.sleep(20);
  // 46-53 were polls at 0.3, 1.5, 4 and 8 s: with no I/O nothing changes, so they replay as one.
  await replay(...range(46, 53));
  await writeThroughExport(1, 0x6b);
  await Bun.sleep(20);
  await replay(...range(54, 58));
});

test("seq 59-62: the failed member is no longer a member; detaching its controller leaves r1 as it is", async () => {
  await replay(59, 60, 61, 62);
});

test("seq 88-93: after a rebuild onto l3 and a restart, a removed member is re-added and rebuilt", async () => {
  // The way there (63-87), without the 8 MB/s throttle of 64: l3, a rebuild, a restart of A
  // that re-assembles r1 from the superblocks (base names now UUIDs), r1 exported again.
  await replay(63);
  await call(a.socketPath, "bdev_raid_set_options", {
    process_max_bandwidth_mb_sec: 0,
    process_window_size_kb: 16384,
  });
  await replay(65);
  await untilNoProcess();
  // A restart drops the options: the re-add (90) copies in SPDK's 1 MiB windows, unthrottled.
  await a.crash();
  await a.restart();
  await replay(79, 80, 81, 82, 83, 84, 85, 86, 87);
  await replay(88, 89, 90);
  const { got } = await send(91);
  const [r1] = JSON.parse(got).result as { process?: { type: string; target: string } }[];
  const l1 = ((await call(a.socketPath, "bdev_get_bdevs", { name: "lvsA/l1" })) as { name: string }[])[0]
    ?.name;
  expect(r1?.process).toMatchObject({ type: "rebuild", target: l1 as string });
  await untilNoProcess();
  await replay(92, 93);
});

async function untilNoProcess(): Promise<void> {
  for (let i = 0; i < 400; i++) {
    const [r] = (await call(a.socketPath, "bdev_raid_get_bdevs", { category: "all" })) as {
      process?: unknown;
    }[];
    if (!r?.process) return;
    await Bun.sleep(10);
  }
  throw new Error("rebuild did not finish");
}
