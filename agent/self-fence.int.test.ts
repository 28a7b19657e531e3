// Self-fencing of a serving node cut off from the API server, shown by I/O. Node A serves a
// replicated volume (two copies, A's local, B's over NVMe-oF) and a consumer writes through A. A's
// agent reaches the API server through a TCP proxy the test cuts: its heartbeats stop going
// through while its target and the consumer's path stay up. Within the volume's failover bound
// (failoverAfterSeconds 5; the manager would move it after that) A's own agent turns the export
// standby: the consumer's next write through A fails, so nothing A's target acknowledges can land
// on A's local copy alone once another node may serve. The proxy back, a heartbeat goes through,
// the volume still names A, and the consumer's writes are served again.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { Socket, TCPSocketListener } from "bun";
import { eventually } from "../lab/cluster/test-support.ts";
import {
  type ReplicatedLab,
  serveReplicatedVolume,
  startReplicatedLab,
} from "../lab/harness/replicated-lab.ts";
import { connectController } from "../lab/sim/spdk/fabric.ts";
import { externalIdFor, nqnFor } from "./partitions/identity.ts";

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;
const A = "127.0.53.1";
const B = "127.0.53.2";
const PORT = 37000 + Math.floor(Math.random() * 3000);
const NODE_A = "sf-a";
const NODE_B = "sf-b";
const CONSUMER_ID = randomUUID();
const CONSUMER = `nqn.2014-08.org.nvmexpress:uuid:${CONSUMER_ID}`;
const FAILOVER_AFTER_S = 5;

/** A TCP proxy to the API server that the test can cut (every connection dropped, new ones refused) and restore. */
class ApiProxy {
  #listener: TCPSocketListener<{ up?: Socket<unknown> }> | undefined;
  readonly #open = new Set<Socket<{ up?: Socket<unknown> }>>();
  port = 0;
  constructor(
    private readonly host: string,
    private readonly upstreamPort: number,
  ) {}
  start(port = 0): void {
    const open = this.#open;
    const { host, upstreamPort } = this;
    this.#listener = Bun.listen<{ up?: Socket<unknown>; pending?: Uint8Array[] }>({
      hostname: "127.0.0.1",
      port,
      socket: {
        async open(s) {
          open.add(s);
          s.data = { pending: [] };
          try {
            s.data.up = await Bun.connect({
              hostname: host,
              port: upstreamPort,
              socket: {
                data: (_u, d) => void s.write(d),
                close: () => {
                  s.end();
                },
                error: () => {
                  s.end();
                },
              },
            });
            for (const d of s.data.pending ?? []) s.data.up.write(d);
            s.data.pending = undefined;
          } catch {
            s.end();
          }
        },
        data(s, d) {
          if (s.data.up) s.data.up.write(d);
          else s.data.pending?.push(new Uint8Array(d));
        },
        close(s) {
          open.delete(s);
          s.data.up?.end();
        },
        error(s) {
          s.data.up?.end();
        },
      },
    });
    this.port = this.#listener.port;
  }
  cut(): void {
    this.#listener?.stop(true);
    this.#listener = undefined;
    for (const s of this.#open) {
      s.data.up?.terminate();
      s.terminate();
    }
    this.#open.clear();
  }
}

let lab: ReplicatedLab | undefined;
let proxy: ApiProxy | undefined;
let kubeconfigA = "";

beforeAll(async () => {
  lab = await startReplicatedLab({
    namespacePrefix: "selffence",
    nodes: [
      {
        name: NODE_A,
        address: A,
        drives: [{ serial: "SIMSFA01", pciAddress: "0000:3c:00.0", sizeBytes: 4 * GiB }],
      },
      {
        name: NODE_B,
        address: B,
        drives: [{ serial: "SIMSFB01", pciAddress: "0000:3c:00.0", sizeBytes: 4 * GiB }],
      },
    ],
    port: PORT,
    agentEnv: { DISTORT_HEARTBEAT_PERIOD_MS: "500", DISTORT_REBUILDS_PER_NODE: "0" },
    kubeconfigFor: (node) => {
      if (node !== NODE_A) return undefined;
      if (!kubeconfigA) throw new Error("the proxy's kubeconfig is written before node A's agent starts");
      return kubeconfigA;
    },
    beforeNodes: (tc) => {
      const text = readFileSync(tc.kubeconfigPath, "utf8");
      const m = /server:\s*https:\/\/([0-9.]+):(\d+)/.exec(text);
      if (!m) throw new Error(`no https server in ${tc.kubeconfigPath}`);
      proxy = new ApiProxy(m[1] as string, Number(m[2]));
      proxy.start();
      kubeconfigA = join(mkdtempSync(join(tmpdir(), "distort-selffence-")), "kubeconfig");
      writeFileSync(kubeconfigA, text.replace(`${m[1]}:${m[2]}`, `127.0.0.1:${proxy.port}`));
    },
  });
}, 300_000);

afterAll(async () => {
  proxy?.cut();
  await lab?.close();
  if (kubeconfigA) rmSync(dirname(kubeconfigA), { recursive: true, force: true });
});

test("a serving node cut off from the API server stops serving within the failover bound (a write through it fails), and serves again once its heartbeat goes through", async () => {
  const l = lab as ReplicatedLab;
  const { fabric } = l;
  const { uid: volUid } = await serveReplicatedVolume(l, {
    name: "vol",
    sizeBytes: 64 * MiB,
    copies: [
      ["SIMSFA01", "vol-r0"],
      ["SIMSFB01", "vol-r1"],
    ],
    servingNode: NODE_A,
    spec: { failoverAfterSeconds: FAILOVER_AFTER_S },
    consumer: { hostNQN: CONSUMER, nodeId: `consumer-1/${CONSUMER}` },
  });
  const consumer = await connectController(fabric, {
    trtype: "TCP",
    traddr: A,
    trsvcid: String(PORT),
    subnqn: nqnFor(externalIdFor(volUid)),
    hostnqn: CONSUMER,
    hostid: CONSUMER_ID,
  });
  const block = (v: number) => Buffer.alloc(64 * 1024, v);
  const tryWrite = (v: number) =>
    Promise.race([
      consumer.write(1, 8 * MiB, block(v)).then(
        () => "ok",
        (err: Error) => `failed: ${err.message}`,
      ),
      Bun.sleep(5_000).then(() => "no answer"),
    ]);
  try {
    expect(await tryWrite(1)).toBe("ok");

    // A's agent loses the API server; its target and the consumer's path stay up.
    (proxy as ApiProxy).cut();
    const cutAt = Date.now();
    const fenced = await eventually(
      async () => {
        const r = await tryWrite(2);
        return r === "ok" ? undefined : r;
      },
      20_000,
      "a write through A refused",
    );
    const fencedAfterMs = Date.now() - cutAt;
    process.stdout.write(
      `self-fence: a write through A refused ${fencedAfterMs} ms after its API server was cut (${fenced})\n`,
    );
    expect(fenced).toStartWith("failed");
    // Before the manager's bound from the last heartbeat (cut + at most one heartbeat period),
    // with room for a loaded machine's check period.
    expect(fencedAfterMs).toBeLessThan(FAILOVER_AFTER_S * 1000 + 1500);

    // The API server back (same port, A's agent reconnects): a heartbeat goes through, the volume
    // still names A, and writes are served again.
    (proxy as ApiProxy).start((proxy as ApiProxy).port);
    await eventually(
      async () => ((await tryWrite(3)) === "ok" ? true : undefined),
      60_000,
      "writes through A again",
    );
    const back = await consumer.read(1, 8 * MiB, 64 * 1024);
    expect(back.equals(block(3))).toBe(true);
  } finally {
    consumer.close();
  }
}, 240_000);
