// The initiator's Keep Alive, against a bare target that answers CONNECT and then delays or ignores
// Keep Alive: a reply that comes late but within kato keeps the controller (the kernel gives each
// Keep Alive command kato to complete), one that never comes loses it, no sooner than kato.
import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  connectController,
  createFabric,
  type FabricListener,
  type FabricServerConnection,
} from "./fabric.ts";

const ADDR = { trtype: "TCP", traddr: "10.7.0.1", trsvcid: "4420" };
const dirs: string[] = [];
const listeners: FabricListener[] = [];

afterEach(async () => {
  for (const l of listeners.splice(0)) await l.close();
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** A target whose Keep Alive answer waits `delayMs` (never when undefined); resolves its fabric and KA log. */
async function bareTarget(delayMs: number | undefined) {
  const dir = mkdtempSync(join(tmpdir(), "ka-"));
  dirs.push(dir);
  const fabric = createFabric(join(dir, "f"));
  const answered: number[] = [];
  const received: number[] = [];
  listeners.push(
    await fabric.listen(ADDR, (conn: FabricServerConnection) => {
      conn.onFrame((msg) => {
        if (msg.op === "connect") {
          conn.send({
            op: "connected",
            tag: msg.tag,
            ctrlr: {
              cntlid: 1,
              vendorId: "0x8086",
              modelNumber: "bare",
              serialNumber: "S1",
              firmwareRevision: "1",
              subnqn: msg.subnqn,
              nvmeVersion: "1.3",
            },
            namespaces: [],
          });
        } else if (msg.op === "keep_alive") {
          received.push(Date.now());
          if (delayMs === undefined) return;
          setTimeout(() => {
            answered.push(Date.now());
            conn.send({ op: "ok", tag: msg.tag });
          }, delayMs);
        }
      });
    }),
  );
  return { fabric, answered, received };
}

const connectOpts = (kato: number) => ({
  ...ADDR,
  subnqn: "nqn.2026-01.io.distort:ka",
  hostnqn: "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555",
  hostid: "11111111-2222-3333-4444-555555555555",
  kato,
});

async function until(what: string, ms: number, ok: () => boolean): Promise<void> {
  const end = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > end) throw new Error(`${what} not within ${ms} ms`);
    await Bun.sleep(20);
  }
}

test("a Keep Alive answered late, but within kato, keeps the controller", async () => {
  const kato = 2000;
  const t = await bareTarget(1300);
  const c = await connectController(t.fabric, connectOpts(kato));
  let closed = false;
  c.onClose(() => {
    closed = true;
  });
  await until("two late Keep Alive answers", 20_000, () => t.answered.length >= 2 || closed);
  expect(closed).toBe(false);
  // One at a time: the second was sent only after the first was answered.
  expect(t.received[1] as number).toBeGreaterThanOrEqual(t.answered[0] as number);
  c.close();
}, 30_000);

test("a Keep Alive never answered loses the controller, no sooner than kato after it was sent", async () => {
  const kato = 600;
  const t = await bareTarget(undefined);
  const c = await connectController(t.fabric, connectOpts(kato));
  let closedAt: number | undefined;
  c.onClose(() => {
    closedAt = Date.now();
  });
  await until("the controller lost", 20_000, () => closedAt !== undefined);
  expect(t.received.length).toBe(1);
  expect((closedAt as number) - (t.received[0] as number)).toBeGreaterThanOrEqual(kato - 50);
  expect(c.closed).toBe(true);
}, 30_000);
