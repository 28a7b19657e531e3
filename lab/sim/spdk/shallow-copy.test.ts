// bdev_lvol_start_shallow_copy / bdev_lvol_check_shallow_copy on the emulator, replaying section 6
// of the ha-qos-tls capture (testdata/spdk-v25.05.1-lvol-delta.jsonl): a snapshot's copy writes
// exactly its own clusters into a sparse AIO file (read back with SEEK_DATA/SEEK_HOLE), the replies
// and errors equal the real ones, ids count up as SPDK's do, and a copy whose source or
// destination goes away ends in an error.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, ftruncateSync, mkdtempSync, openSync, readFileSync, readSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { allocatedRanges } from "../../../lib/fs/allocated-ranges.ts";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { call, RawRpcConnection, rpc } from "./raw-rpc-client.ts";

const MIB = 1024 * 1024;
const CS = MIB;
const KIB4 = 4096;

interface TranscriptRecord {
  seq: number;
  method: string;
  request: { params?: unknown };
  response: { result?: unknown; error?: { code: number; message: string } };
}

const RECORDS: TranscriptRecord[] = readFileSync(
  join(import.meta.dir, "../../../testdata/spdk-v25.05.1-lvol-delta.jsonl"),
  "utf8",
)
  .split("\n")
  .filter((l) => l.trim() !== "")
  .map((l) => JSON.parse(l) as TranscriptRecord);

/** The reply of record `seq` without the envelope: `{result}` or `{error}`. */
function recorded(seq: number): Reply {
  const rec = RECORDS.find((r) => r.seq === seq);
  if (!rec) throw new Error(`record ${seq} is missing from the testdata`);
  const { result, error } = rec.response;
  return error !== undefined ? { error } : { result };
}

/** The params of record `seq`, as sent. */
function paramsOf(seq: number): unknown {
  const rec = RECORDS.find((r) => r.seq === seq);
  if (!rec) throw new Error(`record ${seq} is missing from the testdata`);
  return rec.request.params;
}

let root: string;
let emu: SpdkEmulator;
let s: string;

/** An empty sparse file of `bytes`. */
function sparseFile(name: string, bytes: number): string {
  const path = join(root, name);
  const fd = openSync(path, "w");
  try {
    ftruncateSync(fd, bytes);
  } finally {
    closeSync(fd);
  }
  return path;
}

/** The clusters (1 MiB) holding data in `path`; asserts every range is whole clusters. */
function clustersOf(path: string): number[] {
  const out: number[] = [];
  for (const r of allocatedRanges(path)) {
    expect(r.offset % CS).toBe(0);
    expect(r.length % CS).toBe(0);
    for (let c = r.offset / CS; c < (r.offset + r.length) / CS; c++) out.push(c);
  }
  return out;
}

function readAt(path: string, offset: number, length: number): Buffer {
  const fd = openSync(path, "r");
  try {
    const out = Buffer.alloc(length);
    readSync(fd, out, 0, length, offset);
    return out;
  } finally {
    closeSync(fd);
  }
}

/** A recognisable block: `tag` then its offset, repeated. */
function pattern(tag: number, offset: number, length: number): Buffer {
  const b = Buffer.alloc(length);
  for (let i = 0; i < length; i += 8) {
    b.writeUInt32LE(tag, i);
    b.writeUInt32LE((offset + i) >>> 0, i + 4);
  }
  return b;
}

/** A reply without its envelope, as recorded() gives it. */
type Reply = { result?: unknown; error?: unknown };
const reply = async (method: string, params: unknown): Promise<Reply> => {
  const r = await rpc(s, method, params);
  return r.error !== undefined ? { error: r.error } : { result: r.result };
};
const start = (src: string, dst: string) =>
  reply("bdev_lvol_start_shallow_copy", { src_lvol_name: src, dst_bdev_name: dst });
const check = (id: number) => reply("bdev_lvol_check_shallow_copy", { operation_id: id });

type Status = { copied_clusters: number; total_clusters: number; state: string; error?: string };
/** Checks `id` until a terminal state; returns every status seen, the terminal one last. */
async function pollUntilDone(id: number): Promise<Status[]> {
  const seen: Status[] = [];
  for (let i = 0; i < 2000; i++) {
    const r = await check(id);
    if (r.error) throw new Error(`check ${id}: ${JSON.stringify(r.error)}`);
    const st = r.result as Status;
    seen.push(st);
    if (st.state !== "in progress") return seen;
    await Bun.sleep(1);
  }
  throw new Error(`copy ${id} never ended`);
}

const writes: { offset: number; data: Buffer }[] = [];
const write = async (offset: number, length: number, tag: number) => {
  const data = pattern(tag, offset, length);
  await emu.bdev("lvs6/vol").write(offset, data);
  writes.push({ offset, data });
};
/** What `file` must hold at cluster `c`: the content the lvol had there when snapshotted. */
let snap1Bytes: Map<number, Buffer>;
let snap2Bytes: Map<number, Buffer>;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-shallow-copy-"));
  emu = await startSpdkEmulator({
    rpcPollMs: 0,
    socketPath: join(root, "spdk.sock"),
    dataDir: join(root, "data"),
  });
  s = emu.socketPath;
  // Section 6's setup: seq 358-360 (the files are ours, with the recorded names and sizes).
  const lvsFile = sparseFile("lvs.img", 256 * MIB);
  await call(s, "bdev_aio_create", { filename: lvsFile, name: "aio6", block_size: 4096 });
  await call(s, "bdev_lvol_create_lvstore", paramsOf(359));
  await call(s, "bdev_lvol_create", paramsOf(360));
  // Step 2: clusters 0-3 in full.
  await write(0, 4 * CS, 1);
  await call(s, "bdev_lvol_snapshot", paramsOf(366));
  snap1Bytes = new Map([0, 1, 2, 3].map((c) => [c, pattern(1, c * CS, CS)]));
  // Step 4: 4 KiB in cluster 2 (copy-on-write), 4 KiB in 5, clusters 9-10 in full, 4 KiB in 20.
  await write(2 * CS + 8 * KIB4, KIB4, 2);
  await write(5 * CS, KIB4, 3);
  await write(9 * CS, 2 * CS, 4);
  await write(20 * CS + 100 * KIB4, KIB4, 5);
  await call(s, "bdev_lvol_snapshot", paramsOf(370));
  const vol = emu.bdev("lvs6/vol");
  snap2Bytes = new Map();
  for (const c of [2, 5, 9, 10, 20]) snap2Bytes.set(c, await vol.read(c * CS, CS));
  // The destinations of seq 373-375: 32, 32 and 16 MiB.
  for (const [name, mib] of [
    ["dst", 32],
    ["dst1", 32],
    ["small", 16],
  ] as const) {
    await call(s, "bdev_aio_create", {
      filename: sparseFile(`${name}.img`, mib * MIB),
      name,
      block_size: 4096,
    });
  }
});

afterAll(async () => {
  await emu.close();
  rmSync(root, { recursive: true, force: true });
});

describe("section 6 through the emulator", () => {
  test("the lvols own what the capture says before any copy (seq 371)", async () => {
    const lvols = (await call(s, "bdev_lvol_get_lvols", { lvs_name: "lvs6" })) as {
      name: string;
      num_allocated_clusters: number;
    }[];
    expect(Object.fromEntries(lvols.map((l) => [l.name, l.num_allocated_clusters]))).toEqual({
      vol: 0,
      snap1: 4,
      snap2: 5,
    });
  });

  test("a writable source: accepted with id 1, then error EPERM in the check, reported once (seq 376-378)", async () => {
    expect(await reply("bdev_lvol_start_shallow_copy", paramsOf(376))).toEqual(recorded(376));
    expect(await reply("bdev_lvol_check_shallow_copy", paramsOf(377))).toEqual(recorded(377));
    expect(await reply("bdev_lvol_check_shallow_copy", paramsOf(378))).toEqual(recorded(378));
  });

  test("a too small destination: accepted with id 2, then error EINVAL with the total (seq 379-380)", async () => {
    expect(await reply("bdev_lvol_start_shallow_copy", paramsOf(379))).toEqual(recorded(379));
    expect(await reply("bdev_lvol_check_shallow_copy", paramsOf(380))).toEqual(recorded(380));
    // The destination's claim went with the failed copy: it can take another.
    const [small] = (await call(s, "bdev_get_bdevs", { name: "small" })) as { claimed: boolean }[];
    expect(small?.claimed).toBe(false);
  });

  test("unknown source -19 uses no id, unknown destination -32602 uses id 3, unknown id -19 (seq 381-383)", async () => {
    expect(await reply("bdev_lvol_start_shallow_copy", paramsOf(381))).toEqual(recorded(381));
    expect(await reply("bdev_lvol_start_shallow_copy", paramsOf(382))).toEqual(recorded(382));
    expect(await reply("bdev_lvol_check_shallow_copy", paramsOf(383))).toEqual(recorded(383));
    // Id 3 was used up: nothing answers for it.
    expect(await check(3)).toEqual(recorded(383));
  });

  test("snap2 into dst: id 4, in progress while running (dst claimed), complete once, then -19 (seq 384-387)", async () => {
    const c = await RawRpcConnection.connect(s);
    try {
      // One write: the start is synchronous, so the check and the listing after it see the copy
      // running before its first cluster.
      c.send(
        [
          { jsonrpc: "2.0", method: "bdev_lvol_start_shallow_copy", id: 27, params: paramsOf(384) },
          { jsonrpc: "2.0", method: "bdev_lvol_check_shallow_copy", id: 28, params: paramsOf(385) },
          { jsonrpc: "2.0", method: "bdev_get_bdevs", id: 90, params: { name: "dst" } },
        ]
          .map((r) => JSON.stringify(r))
          .join(""),
      );
      const [started, running, listing] = (await c.replies(3)) as {
        result?: unknown;
      }[];
      expect(started as unknown).toEqual({ jsonrpc: "2.0", id: 27, ...recorded(384) });
      const st = running?.result as Status;
      expect(st.state).toBe("in progress");
      expect(st.total_clusters).toBe(5);
      expect(st.copied_clusters).toBeLessThan(st.total_clusters);
      expect(Object.keys(st)).toEqual(Object.keys(recorded(385).result as object));
      const [dst] = (listing?.result ?? []) as { claimed: boolean; claim_type?: string }[];
      expect(dst).toMatchObject({ claimed: true, claim_type: "read_many_write_one" });
    } finally {
      c.close();
    }
    const seen = await pollUntilDone(4);
    const copied = seen.map((x) => x.copied_clusters);
    expect([...copied].sort((a, b) => a - b)).toEqual(copied);
    for (const x of seen.slice(0, -1)) expect(x).toMatchObject({ state: "in progress", total_clusters: 5 });
    expect({ result: seen.at(-1) } as Reply).toEqual(recorded(386));
    expect(await reply("bdev_lvol_check_shallow_copy", paramsOf(387))).toEqual(recorded(387));
    const [dst] = (await call(s, "bdev_get_bdevs", { name: "dst" })) as { claimed: boolean }[];
    expect(dst?.claimed).toBe(false);
  });

  test("snap1 into dst1: id 5, complete with 4 of 4 (seq 388-390)", async () => {
    expect(await reply("bdev_lvol_start_shallow_copy", paramsOf(388))).toEqual(recorded(388));
    const seen = await pollUntilDone(5);
    expect({ result: seen.at(-1) } as Reply).toEqual(recorded(390));
  });

  test("after bdev_aio_delete the files hold exactly the snapshots' own clusters and their bytes (seq 386 note)", async () => {
    expect(await reply("bdev_aio_delete", { name: "dst" })).toEqual(recorded(391));
    expect(await reply("bdev_aio_delete", { name: "dst1" })).toEqual(recorded(392));
    const dstFile = join(root, "dst.img");
    const dst1File = join(root, "dst1.img");
    expect(clustersOf(dstFile)).toEqual([2, 5, 9, 10, 20]);
    expect(clustersOf(dst1File)).toEqual([0, 1, 2, 3]);
    // Everything past cluster 20 is a hole: the last extent ends where cluster 21 begins.
    const last = allocatedRanges(dstFile).at(-1);
    expect(last).toEqual({ offset: 20 * CS, length: CS });
    for (const [c, bytes] of snap2Bytes) expect(readAt(dstFile, c * CS, CS).equals(bytes)).toBe(true);
    for (const [c, bytes] of snap1Bytes) expect(readAt(dst1File, c * CS, CS).equals(bytes)).toBe(true);
    // Cluster 2 of snap2 is snap1's cluster 2 with the 4 KiB overwrite: copy-on-write kept both.
    expect(readAt(dstFile, 2 * CS, KIB4).equals(pattern(1, 2 * CS, KIB4))).toBe(true);
    expect(readAt(dstFile, 2 * CS + 8 * KIB4, KIB4).equals(pattern(2, 2 * CS + 8 * KIB4, KIB4))).toBe(true);
    // Each write landed in the copy where it was made.
    for (const w of writes.slice(1)) {
      expect(readAt(dstFile, w.offset, w.data.length).equals(w.data)).toBe(true);
    }
  });

  test("snap1 deleted (merged into its only clone snap2): snap2's copy holds both sets of clusters", async () => {
    expect(await reply("bdev_lvol_delete", { name: "lvs6/snap1" })).toEqual(recorded(408));
    const lvols = (await call(s, "bdev_lvol_get_lvols", { lvs_name: "lvs6" })) as {
      name: string;
      num_allocated_clusters: number;
    }[];
    expect(lvols.find((l) => l.name === "snap2")?.num_allocated_clusters).toBe(8);
    const file = sparseFile("merged.img", 32 * MIB);
    await call(s, "bdev_aio_create", { filename: file, name: "merged", block_size: 4096 });
    // Ids go on from 5.
    expect(await start("lvs6/snap2", "merged")).toEqual({ result: { operation_id: 6 } });
    const seen = await pollUntilDone(6);
    expect(seen.at(-1)).toEqual({ copied_clusters: 8, total_clusters: 8, state: "complete" });
    await call(s, "bdev_aio_delete", { name: "merged" });
    expect(clustersOf(file)).toEqual([0, 1, 2, 3, 5, 9, 10, 20]);
    const vol = emu.bdev("lvs6/vol");
    for (const c of [0, 1, 2, 3, 5, 9, 10, 20]) {
      expect(readAt(file, c * CS, CS).equals(await vol.read(c * CS, CS))).toBe(true);
    }
  });
});

describe("params and failures the capture does not show", () => {
  test("undecodable params fail like every lvol method: -32603 spdk_json_decode_object failed", async () => {
    const decodeFailed = await reply("bdev_lvol_delete", { name: "lvs6/vol", bogus: 1 });
    expect(decodeFailed).toEqual({ error: { code: -32603, message: "spdk_json_decode_object failed" } });
    for (const params of [
      { src_lvol_name: "lvs6/snap2", dst_bdev_name: "x", extra: true },
      { src_lvol_name: "lvs6/snap2" },
      { src_lvol_name: 7, dst_bdev_name: "x" },
      undefined,
    ]) {
      expect(await reply("bdev_lvol_start_shallow_copy", params)).toEqual(decodeFailed);
    }
    for (const params of [
      { operation_id: "4" },
      { operation_id: -1 },
      { operation_id: 1, x: 1 },
      {},
      undefined,
    ]) {
      expect(await reply("bdev_lvol_check_shallow_copy", params)).toEqual(decodeFailed);
    }
    // None of those used up an id.
    const file = sparseFile("probe.img", 32 * MIB);
    await call(s, "bdev_aio_create", { filename: file, name: "probe", block_size: 4096 });
    expect(await start("lvs6/snap2", "probe")).toEqual({ result: { operation_id: 7 } });
    await pollUntilDone(7);
    await call(s, "bdev_aio_delete", { name: "probe" });
  });

  test("a claimed destination (the lvstore's base) is refused at once with -32602, using up an id", async () => {
    expect(await start("lvs6/snap2", "aio6")).toEqual({
      error: { code: -32602, message: "Operation not permitted" },
    });
    expect(await check(8)).toEqual(recorded(383));
  });

  test("a source that is not an lvol bdev is -19", async () => {
    const file = sparseFile("plain.img", 32 * MIB);
    await call(s, "bdev_aio_create", { filename: file, name: "plain", block_size: 4096 });
    expect(await start("plain", "plain")).toEqual(recorded(381));
  });

  test("a snapshot that owns nothing copies nothing and is complete at once", async () => {
    await call(s, "bdev_lvol_create", {
      lvol_name: "empty",
      size_in_mib: 8,
      lvs_name: "lvs6",
      thin_provision: true,
    });
    await call(s, "bdev_lvol_snapshot", { lvol_name: "lvs6/empty", snapshot_name: "emptysnap" });
    const r = await start("lvs6/emptysnap", "plain");
    const id = (r.result as { operation_id: number }).operation_id;
    expect(await check(id)).toEqual({ result: { copied_clusters: 0, total_clusters: 0, state: "complete" } });
    expect(clustersOf(join(root, "plain.img"))).toEqual([]);
  });

  /** A 12-cluster snapshot `name` (every cluster written) and a 12 MiB AIO destination `dst`. */
  async function bigCopy(name: string, dst: string): Promise<string> {
    await call(s, "bdev_lvol_create", {
      lvol_name: name,
      size_in_mib: 12,
      lvs_name: "lvs6",
      thin_provision: true,
    });
    await emu.bdev(`lvs6/${name}`).write(0, Buffer.alloc(12 * CS, 0x5a));
    await call(s, "bdev_lvol_snapshot", { lvol_name: `lvs6/${name}`, snapshot_name: `${name}snap` });
    const file = sparseFile(`${dst}.img`, 12 * MIB);
    await call(s, "bdev_aio_create", { filename: file, name: dst, block_size: 4096 });
    return file;
  }

  test("a second copy of a source being copied fails in its check with EBUSY; the first completes", async () => {
    await bigCopy("busy", "busydst");
    const file2 = sparseFile("busydst2.img", 12 * MIB);
    await call(s, "bdev_aio_create", { filename: file2, name: "busydst2", block_size: 4096 });
    const c = await RawRpcConnection.connect(s);
    let first: number;
    let second: number;
    try {
      c.send(
        [
          {
            jsonrpc: "2.0",
            method: "bdev_lvol_start_shallow_copy",
            id: 1,
            params: { src_lvol_name: "lvs6/busysnap", dst_bdev_name: "busydst" },
          },
          {
            jsonrpc: "2.0",
            method: "bdev_lvol_start_shallow_copy",
            id: 2,
            params: { src_lvol_name: "lvs6/busysnap", dst_bdev_name: "busydst2" },
          },
        ]
          .map((r) => JSON.stringify(r))
          .join(""),
      );
      const [a, b] = (await c.replies(2)) as { result: { operation_id: number } }[];
      first = a?.result.operation_id as number;
      second = b?.result.operation_id as number;
    } finally {
      c.close();
    }
    expect(second).toBe(first + 1);
    expect((await pollUntilDone(second)).at(-1)).toEqual({
      copied_clusters: 0,
      total_clusters: 12,
      state: "error",
      error: "Device or resource busy",
    });
    expect((await pollUntilDone(first)).at(-1)).toEqual({
      copied_clusters: 12,
      total_clusters: 12,
      state: "complete",
    });
  });

  test("the destination deleted mid-copy: the copy ends in error EIO, short of the total", async () => {
    await bigCopy("gone", "gonedst");
    const r = await start("lvs6/gonesnap", "gonedst");
    const id = (r.result as { operation_id: number }).operation_id;
    expect(await reply("bdev_aio_delete", { name: "gonedst" })).toEqual({ result: true });
    const end = (await pollUntilDone(id)).at(-1) as Status;
    expect(end).toMatchObject({ total_clusters: 12, state: "error", error: "Input/output error" });
    expect(end.copied_clusters).toBeLessThan(12);
  });

  test("the source deleted mid-copy: the copy ends in error EIO, short of the total", async () => {
    await bigCopy("src", "srcdst");
    const r = await start("lvs6/srcsnap", "srcdst");
    const id = (r.result as { operation_id: number }).operation_id;
    // srcsnap has one clone (src): the delete merges it into src and the snapshot is gone.
    expect(await reply("bdev_lvol_delete", { name: "lvs6/srcsnap" })).toEqual({ result: true });
    const end = (await pollUntilDone(id)).at(-1) as Status;
    expect(end).toMatchObject({ total_clusters: 12, state: "error", error: "Input/output error" });
    expect(end.copied_clusters).toBeLessThan(12);
    // The destination's claim is released with the failed copy.
    const [dst] = (await call(s, "bdev_get_bdevs", { name: "srcdst" })) as { claimed: boolean }[];
    expect(dst?.claimed).toBe(false);
  });
});
