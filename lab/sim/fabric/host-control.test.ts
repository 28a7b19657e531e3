// The host control channel carries a connect's DH-HMAC-CHAP secrets to the host daemon's
// initiator intact (as nvme-cli writes them to /dev/nvme-fabrics), and nothing else changes them.
import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { ConnectedSubsystem, ConnectParams, NvmeInitiator } from "../../../csi/host/nvme-initiator.ts";
import { generateDhchapSecret } from "../../../lib/nvme/dhchap.ts";
import { HostControlInitiator, serveHostControl } from "./host-control.ts";

/** An initiator that records connects and refuses one without a key, like a keyed target. */
class RecordingInitiator implements NvmeInitiator {
  readonly connects: ConnectParams[] = [];
  async connect(p: ConnectParams): Promise<void> {
    this.connects.push(p);
    if (!p.dhchap) throw new Error("the target requires DH-HMAC-CHAP and no key was given");
  }
  async disconnect(): Promise<void> {}
  async list(): Promise<ConnectedSubsystem[]> {
    return [];
  }
  async findNamespaceDevice(): Promise<string | undefined> {
    return undefined;
  }
  async rescan(): Promise<void> {}
}

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

test("connect passes host and controller secrets through the control socket", async () => {
  const dir = mkdtempSync(join(tmpdir(), "host-control-"));
  dirs.push(dir);
  const sock = join(dir, "control.sock");
  const rec = new RecordingInitiator();
  const server = await serveHostControl(sock, rec);
  try {
    const client = new HostControlInitiator(sock, 10_000);
    const base: ConnectParams = {
      transport: "tcp",
      address: "127.0.0.1",
      port: 4420,
      nqn: "nqn.2026-01.io.distort:vol-a",
      hostNqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001",
    };
    const dhchap = {
      secret: generateDhchapSecret({ hash: 1 }),
      ctrlSecret: generateDhchapSecret({ hash: 1 }),
    };
    await client.connect({ ...base, dhchap });
    expect(rec.connects[0]?.dhchap).toEqual(dhchap);
    await client.connect({ ...base, dhchap: { secret: dhchap.secret } });
    expect(rec.connects[1]?.dhchap).toEqual({ secret: dhchap.secret });
    // Without a key the daemon's refusal comes back as the error of the call.
    await expect(client.connect(base)).rejects.toThrow("no key was given");
  } finally {
    await server.close();
  }
});
