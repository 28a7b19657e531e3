// The `[2 multipath]` records of SPDK v25.05.1 (testdata/spdk-v25.05.1-multipath.jsonl, copied
// from the shared ha transcript): target T with an ana_reporting subsystem on two listeners and
// its per-listener ANA states (112-135), initiator I attaching both paths under one name, its
// io_paths per poll group, multipath policies and ANA as the initiator sees it (136-161), and a
// listener removed under a live path (211-221). Two emulators on one SimFabric; every request is
// sent as recorded and every reply compared byte for byte (UUIDs mapped by order of appearance),
// except the records in WALKED.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { createFabric } from "./fabric.ts";
import { RawRpcConnection } from "./raw-rpc-client.ts";

interface Rec {
  seq: number;
  app: string;
  raw_request: string;
  raw_response: string;
}
const RECORDS = readFileSync(join(import.meta.dir, "../../../testdata/spdk-v25.05.1-multipath.jsonl"), "utf8")
  .split("\n")
  .filter((l) => l.trim() !== "")
  .map((l) => JSON.parse(l) as Rec);

/** Records not compared byte for byte, and why. */
const WALKED: Readonly<Record<number, string>> = {
  216: "num_io_qpairs follows the initiator's I/O channels (2 in the capture for one poll group); compared without it",
};

const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|"[0-9A-F]{32}"/g;
/** Replaces each UUID (and NGUID, the same UUID in upper-case hex) by its order of appearance. */
function normalise(text: string): string {
  const seen = new Map<string, string>();
  return text.replace(UUID, (m) => {
    const nguid = m.startsWith('"');
    const u = nguid ? m.slice(1, -1).toLowerCase() : m.replaceAll("-", "");
    if (!seen.has(u)) seen.set(u, `<uuid${seen.size}>`);
    return nguid ? `"${seen.get(u)}"` : (seen.get(u) as string);
  });
}

let root: string;
let t: SpdkEmulator;
let i: SpdkEmulator;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-mp-"));
  const fabric = createFabric(join(root, "f"));
  // T ran with -m 0x1, I (spdk_tgt) with -m 0x2: one poll group each.
  t = await startSpdkEmulator({
    socketPath: join(root, "t.sock"),
    dataDir: join(root, "t"),
    fabric,
    rpcPollMs: 0,
  });
  i = await startSpdkEmulator({
    socketPath: join(root, "i.sock"),
    dataDir: join(root, "i"),
    fabric,
    coreMask: "0x2",
    rpcPollMs: 0,
  });
});

afterAll(async () => {
  await i?.close();
  await t?.close();
  rmSync(root, { recursive: true, force: true });
});

async function send(rec: Rec): Promise<string> {
  const c = await RawRpcConnection.connect((rec.app.startsWith("nvmf_tgt(T)") ? t : i).socketPath);
  try {
    c.send(rec.raw_request);
    await c.replies(1, 5000);
    return c.received;
  } finally {
    c.close();
  }
}

async function replay(from: number, to: number): Promise<void> {
  for (const rec of RECORDS.filter((r) => r.seq >= from && r.seq <= to)) {
    const got = await send(rec);
    if (WALKED[rec.seq]) {
      const strip = (s: string) => normalise(s).replace(/"num_io_qpairs":\d+/g, '"num_io_qpairs":N');
      expect({ seq: rec.seq, reply: strip(got) }).toEqual({ seq: rec.seq, reply: strip(rec.raw_response) });
      continue;
    }
    expect({ seq: rec.seq, reply: normalise(got) }).toEqual({
      seq: rec.seq,
      reply: normalise(rec.raw_response),
    });
    // The initiator learns ANA changes from the target's notice (the capture waited 2 s).
    if (rec.app.startsWith("nvmf_tgt(T)")) await Bun.sleep(5);
  }
}

test("seq 112-135: ANA states per listener and group, and the refusals", async () => {
  await replay(112, 135);
});

test("seq 136-157: two paths under one name, io_paths once a channel is held, multipath policies", async () => {
  await replay(136, 157);
});

test("seq 158-161: an inaccessible path reads accessible false on the initiator, and true again", async () => {
  await replay(158, 161);
});

test("seq 211-221: a listener removed under a live path: that path fails and stays listed; detach by path, then all", async () => {
  await replay(211, 212);
  await Bun.sleep(20);
  await replay(213, 221);
});
