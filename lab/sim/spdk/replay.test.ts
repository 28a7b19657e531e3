// Replays every request of the captured SPDK v25.05.1 transcripts against emulators (target A,
// initiators B and C, a second target D), in capture order, and compares each reply with the
// real one: byte for byte where possible, otherwise by shape under the rules listed below.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { createFabric } from "./fabric.ts";
import type { JsonValue } from "./json-stream.ts";
import { RawRpcConnection } from "./raw-rpc-client.ts";

interface TranscriptRecord {
  seq: number;
  method: string;
  app: string;
  client?: string;
  request: unknown;
  response: unknown;
  note?: string | null;
  raw_request: string;
  raw_response: string;
  raw_request_chunks?: string[];
  server_closed_connection?: boolean;
  unparsed_tail?: string;
}

const RECORDS: TranscriptRecord[] = readFileSync(
  join(import.meta.dir, "../../../testdata/spdk-v25.05.1.jsonl"),
  "utf8",
)
  .split("\n")
  .filter((l) => l.trim() !== "")
  .map((l) => JSON.parse(l) as TranscriptRecord);

/** Records not replayed, and why. */
const SKIPPED: Readonly<Record<number, string>> = {
  18: "iobuf_get_stats is not emulated (its per-module buffer counters have nothing to count in a simulation)",
  109: "perform_tests is bdevperf's own RPC; its effect (a verify job writing every block of Nvme0n1) is reproduced through the emulator's bdev I/O instead",
  110: "bdev_get_iostat counters come from the bdevperf run (its reply shapes are pinned in io-stat.test.ts)",
};

/**
 * Fields compared by type only, per record, with the reason they legitimately differ. Paths are
 * matched against "result.a[0].b" style paths of a reply. UUIDs everywhere (and NGUIDs, which are
 * UUIDs without dashes) are compared through one consistent bijection instead: random per run.
 */
const SHAPE_RULES: readonly { seqs: readonly number[]; path: RegExp; reason: string }[] = [
  { seqs: [17, 144], path: /^result\.(tick_rate|pid)$/, reason: "the host's TSC rate and the process id" },
  {
    seqs: [17, 144],
    path: /^result\.reactors\[\d+\]\.(tid|busy|idle|irq|sys|usr)$/,
    reason: "thread id and CPU time counters of the running process",
  },
  {
    seqs: [17, 144],
    path: /^result\.reactors\[\d+\]\.lw_threads\[\d+\]\.elapsed$/,
    reason: "ticks since the thread started",
  },
  { seqs: [97], path: /^result\.tick_rate$/, reason: "the host's TSC rate" },
  {
    seqs: [97],
    path: /^result\.poll_groups\[\d+\]\.(admin_qpairs|io_qpairs|current_admin_qpairs|current_io_qpairs|completed_nvme_io)$/,
    reason:
      "qpair and I/O counters follow when the initiator's bdev layer opens I/O channels, which is not simulated",
  },
  {
    seqs: [94, 104],
    path: /^result\[\d+\]\.num_io_qpairs$/,
    reason:
      "I/O qpairs per controller follow the initiator's I/O channels (the capture shows 1 and 2 for identical attaches)",
  },
  {
    seqs: [95],
    path: /^result\[\d+\]\.peer_address\.trsvcid$/,
    reason: "the initiator's ephemeral source port",
  },
  {
    seqs: [111],
    path: /^result\[\d+\]\.ctrlrs\[\d+\]\.cntlid$/,
    reason: "the captured target had handed controller IDs 3-4 to connections outside the transcript",
  },
];

/** Records whose whole result is compared by a custom rule, with the reason. */
const CUSTOM: Readonly<Record<number, string>> = {
  3: "rpc_get_methods: the emulator lists the methods it implements, in the real registration order (a subsequence of the real list)",
  4: "rpc_get_methods current (STARTUP): the implemented methods callable before init are exactly the real ones",
  16: "rpc_get_methods current (RUNTIME): the implemented methods callable after init are exactly the real ones",
  121: "id-less bdev_get_bdevs: the cut-off fragment starts mid-object at a writer-chunk boundary that depends on the reply's length; checked as an unterminated tail ending like the real one",
};

// The capture created its AIO file at this path; the replay uses a temp file with a path of
// the same length, so reply lengths (and thus cut-off fragments) stay comparable.
const CAPTURED_AIO = "/var/lib/sim/spdk-aio.img";
const CAPTURED_MISSING = "/var/lib/sim/does-not-exist.img";

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const NGUID_RE = /^[0-9A-F]{32}$/;

/** Transcript UUID ⇄ emulator UUID, learned on first sight and then enforced both ways. */
class UuidBijection {
  readonly #fwd = new Map<string, string>();
  readonly #back = new Map<string, string>();

  match(expected: string, actual: string): boolean {
    const e = expected.toLowerCase();
    const a = actual.toLowerCase();
    const known = this.#fwd.get(e);
    if (known !== undefined) return known === a;
    if (this.#back.has(a)) return false;
    this.#fwd.set(e, a);
    this.#back.set(a, e);
    return true;
  }
}

function toUuid(nguid: string): string {
  const x = nguid.toLowerCase();
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
}

/** Compares an expected and an actual reply; returns the differences (empty when equal in shape). */
function compare(seq: number, expected: unknown, actual: unknown, uuids: UuidBijection, path = ""): string[] {
  const rule = SHAPE_RULES.find((r) => r.seqs.includes(seq) && r.path.test(path));
  if (rule)
    return typeof expected === typeof actual ? [] : [`${path}: type ${typeof actual} != ${typeof expected}`];
  if (typeof expected === "string" && typeof actual === "string") {
    if (UUID_RE.test(expected))
      return uuids.match(expected, actual) ? [] : [`${path}: uuid ${actual} != ${expected}`];
    if (NGUID_RE.test(expected) && NGUID_RE.test(actual)) {
      return uuids.match(toUuid(expected), toUuid(actual)) ? [] : [`${path}: nguid ${actual} != ${expected}`];
    }
  }
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual) || actual.length !== expected.length) {
      return [
        `${path}: ${JSON.stringify(actual)?.slice(0, 200)} != ${JSON.stringify(expected).slice(0, 200)}`,
      ];
    }
    return expected.flatMap((e, i) => compare(seq, e, actual[i], uuids, `${path}[${i}]`));
  }
  if (expected !== null && typeof expected === "object") {
    if (actual === null || typeof actual !== "object" || Array.isArray(actual))
      return [`${path}: not an object`];
    const ek = Object.keys(expected);
    const ak = Object.keys(actual);
    if (ek.join() !== ak.join()) return [`${path}: keys [${ak}] != [${ek}]`];
    return ek.flatMap((k) =>
      compare(
        seq,
        (expected as Record<string, unknown>)[k],
        (actual as Record<string, unknown>)[k],
        uuids,
        path ? `${path}.${k}` : k,
      ),
    );
  }
  return Object.is(expected, actual) || expected === actual
    ? []
    : [`${path}: ${JSON.stringify(actual)} != ${JSON.stringify(expected)}`];
}

/** Texts equal once UUIDs are matched through the bijection (same layout, same other bytes). */
function sameModuloUuids(expected: string, actual: string, uuids: UuidBijection): boolean {
  const re = /([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})/;
  const e = expected.split(re);
  const a = actual.split(re);
  if (e.length !== a.length) return false;
  return e.every((part, i) => (i % 2 === 0 ? part === a[i] : uuids.match(part, a[i] as string)));
}

/** True when `sub` appears in `full` in the same order. */
function isSubsequence(sub: readonly string[], full: readonly string[]): boolean {
  let i = 0;
  for (const x of full) if (x === sub[i]) i++;
  return i === sub.length;
}

let root: string;
let aioDir: string;
const emulators: SpdkEmulator[] = [];

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "distort-replay-"));
  aioDir = mkdtempSync("/tmp/r");
  if (
    join(aioDir, "spdk-aio.img").length !== CAPTURED_AIO.length ||
    join(aioDir, "does-not-exist.img").length !== CAPTURED_MISSING.length
  ) {
    throw new Error(`unexpected temp path ${aioDir}`);
  }
});

afterAll(async () => {
  for (const e of emulators) await e.close();
  rmSync(root, { recursive: true, force: true });
  rmSync(aioDir, { recursive: true, force: true });
});

test("replays the v25.05.1 transcripts: every reply matches exactly or by its listed shape rules", async () => {
  const aioPath = join(aioDir, "spdk-aio.img");
  const missingPath = join(aioDir, "does-not-exist.img");
  // 256 MiB sparse, like the captured file.
  writeFileSync(aioPath, "");
  truncateSync(aioPath, 256 * 1024 * 1024);

  const fabric = createFabric(join(root, "fab"));
  const start = (name: string, extra: Partial<Parameters<typeof startSpdkEmulator>[0]> = {}) =>
    startSpdkEmulator({
      socketPath: join(root, `${name}.sock`),
      dataDir: join(root, name),
      fabric,
      transports: ["TCP"], // the captured build had no RDMA
      // Replies, not timing: answered on arrival (rpc-clock.test.ts covers SPDK's poller).
      rpcPollMs: 0,
      ...extra,
    }).then((e) => {
      emulators.push(e);
      return e;
    });
  const A = await start("A", { waitForRpc: true, coreMask: "0x1" });
  const B = await start("B");
  const C = await start("C");
  const D = await start("D", { fabric: createFabric(join(root, "fab-d")) });
  const route = (app: string): SpdkEmulator => {
    if (app.startsWith("nvmf_tgt(A)")) return A;
    if (app.startsWith("spdk_tgt(B)")) return B;
    if (app.startsWith("bdevperf(C)")) return C;
    if (app.startsWith("nvmf_tgt --no-huge")) return D;
    throw new Error(`unknown app ${app}`);
  };

  const uuids = new UuidBijection();
  const outcome = new Map<number, "exact" | "shape" | "skipped" | string>();
  const ours = (text: string) =>
    text.replaceAll(CAPTURED_AIO, aioPath).replaceAll(CAPTURED_MISSING, missingPath);
  const theirs = (text: string) =>
    text.replaceAll(aioPath, CAPTURED_AIO).replaceAll(missingPath, CAPTURED_MISSING);
  const methodsSeen: Record<number, string[]> = {};

  for (const rec of RECORDS) {
    if (SKIPPED[rec.seq]) {
      outcome.set(rec.seq, "skipped");
      if (rec.seq === 109) await bdevperfVerify(C, "Nvme0n1");
      continue;
    }
    const emu = route(rec.app);
    const conn = await RawRpcConnection.connect(emu.socketPath);
    try {
      if (rec.raw_request_chunks) {
        for (const [i, chunk] of rec.raw_request_chunks.entries()) {
          if (i > 0) await Bun.sleep(50); // the capture paused 500 ms between the halves
          conn.send(chunk);
        }
      } else {
        conn.send(ours(rec.raw_request));
      }
      let received: string;
      if (rec.server_closed_connection) {
        await conn.waitClosed(1500);
        received = conn.received;
      } else if (rec.unparsed_tail !== undefined) {
        received = await conn.settle(30);
      } else {
        const n = Array.isArray(rec.response) ? rec.response.length : 1;
        await conn.replies(n);
        received = conn.received;
      }
      // No field is cut out: every reply carries exactly what real SPDK printed (an lvol's or AIO
      // bdev's driver_specific included), or the record fails.
      received = theirs(received);
      if (received === rec.raw_response && (!rec.server_closed_connection || conn.closed)) {
        outcome.set(rec.seq, "exact");
        recordMethods(rec, received, methodsSeen);
        continue;
      }
      const diffs = judge(rec, received, conn.closed, uuids, methodsSeen);
      outcome.set(rec.seq, diffs.length === 0 ? "shape" : `#${rec.seq} ${rec.method}: ${diffs.join("; ")}`);
    } finally {
      conn.close();
    }
  }

  const failures = [...outcome.values()].filter((o) => o !== "exact" && o !== "shape" && o !== "skipped");
  const count = (k: string) => [...outcome.values()].filter((o) => o === k).length;
  console.log(
    `transcript replay: ${RECORDS.length} records, ${count("exact")} exact, ${count("shape")} by shape, ` +
      `${count("skipped")} skipped, ${failures.length} failed`,
  );
  expect(failures).toEqual([]);
  expect(outcome.size).toBe(RECORDS.length);
  expect(RECORDS.length).toBe(189);
});

/** What bdevperf's verify job did: write every block of `bdev`, then read it back. */
async function bdevperfVerify(emu: SpdkEmulator, bdev: string): Promise<void> {
  const b = emu.bdev(bdev);
  const chunk = 1024 * 1024;
  const total = b.numBlocks * b.blockSize;
  for (let off = 0; off < total; off += chunk) {
    const data = Buffer.alloc(Math.min(chunk, total - off), off / chunk + 1);
    await b.write(off, data);
    expect((await b.read(off, data.length)).equals(data)).toBe(true);
  }
}

/** Remembers the method lists rpc_get_methods returned, for the cross-record checks. */
function recordMethods(rec: TranscriptRecord, received: string, seen: Record<number, string[]>): void {
  if (rec.method !== "rpc_get_methods") return;
  const r = JSON.parse(received.trim()) as { result: string[] };
  seen[rec.seq] = r.result;
}

/** Shape comparison of one record; returns the differences. */
function judge(
  rec: TranscriptRecord,
  received: string,
  closed: boolean,
  uuids: UuidBijection,
  methodsSeen: Record<number, string[]>,
): string[] {
  if (rec.server_closed_connection) {
    return closed && received === ""
      ? []
      : [`expected no bytes and a closed connection, got ${JSON.stringify(received)}`];
  }
  if (CUSTOM[rec.seq] !== undefined && rec.method === "(raw)") {
    // Align both fragments at their ends (UUIDs have fixed length) and drop a margin at the front
    // so neither starts inside a UUID; the rest must match with UUIDs through the bijection.
    const n = Math.min(received.length, rec.raw_response.length) - 40;
    const ok =
      received.length > 0 &&
      !received.endsWith("\n") &&
      !received.startsWith('{"jsonrpc"') &&
      n > 1000 &&
      sameModuloUuids(rec.raw_response.slice(-n), received.slice(-n), uuids);
    return ok
      ? []
      : [`fragment ${JSON.stringify(received.slice(0, 80))}... does not end like the captured one`];
  }
  if (rec.unparsed_tail !== undefined)
    return [`raw ${JSON.stringify(received)} != ${JSON.stringify(rec.raw_response)}`];
  const lines = received.split("\n");
  if (lines.pop() !== "") return [`reply not newline-terminated: ${JSON.stringify(received.slice(-80))}`];
  const replies = lines.map((l) => JSON.parse(l) as JsonValue);
  const expected = (
    Array.isArray(rec.response) && rec.method === "(raw)" ? rec.response : [rec.response]
  ) as JsonValue[];
  if (replies.length !== expected.length) return [`${replies.length} replies, expected ${expected.length}`];
  if (CUSTOM[rec.seq] !== undefined) return judgeMethods(rec, replies[0], methodsSeen);
  return expected.flatMap((e, i) => compare(rec.seq, e, replies[i], uuids));
}

function judgeMethods(
  rec: TranscriptRecord,
  reply: JsonValue | undefined,
  seen: Record<number, string[]>,
): string[] {
  const got = (reply as { result?: string[] } | undefined)?.result;
  const real = (rec.response as { result: string[] }).result;
  if (!Array.isArray(got)) return ["no method list"];
  seen[rec.seq] = got;
  if (!isSubsequence(got, real)) return ["not a subsequence of the real method list in its order"];
  const all = seen[3] ?? got;
  if (rec.seq === 3) {
    const required = [
      "spdk_get_version",
      "rpc_get_methods",
      "framework_get_reactors",
      "framework_start_init",
      "framework_wait_init",
      "framework_get_subsystems",
      "iobuf_set_options",
      "bdev_get_bdevs",
      "bdev_nvme_attach_controller",
      "bdev_nvme_detach_controller",
      "bdev_nvme_get_controllers",
      "bdev_malloc_create",
      "bdev_malloc_delete",
      "bdev_aio_create",
      "bdev_aio_delete",
      "bdev_lvol_create_lvstore",
      "bdev_lvol_get_lvstores",
      "bdev_lvol_delete_lvstore",
      "bdev_lvol_create",
      "bdev_lvol_get_lvols",
      "bdev_lvol_delete",
      "bdev_lvol_resize",
      "bdev_lvol_snapshot",
      "bdev_lvol_clone",
      "nvmf_create_transport",
      "nvmf_get_transports",
      "nvmf_create_subsystem",
      "nvmf_delete_subsystem",
      "nvmf_get_subsystems",
      "nvmf_subsystem_add_ns",
      "nvmf_subsystem_remove_ns",
      "nvmf_subsystem_add_listener",
      "nvmf_subsystem_remove_listener",
      "nvmf_subsystem_get_listeners",
      "nvmf_subsystem_add_host",
      "nvmf_subsystem_remove_host",
      "nvmf_subsystem_allow_any_host",
      "nvmf_subsystem_get_controllers",
      "nvmf_get_stats",
      "keyring_file_add_key",
      "keyring_file_remove_key",
      "keyring_get_keys",
      "fsdev_aio_create",
      "fsdev_aio_delete",
      "spdk_kill_instance",
    ];
    const missing = required.filter((m) => !got.includes(m));
    return missing.length === 0 ? [] : [`missing ${missing.join(", ")}`];
  }
  const expected = all.filter((m) => real.includes(m));
  return got.join() === expected.join() ? [] : [`current methods ${got.join()} != ${expected.join()}`];
}
