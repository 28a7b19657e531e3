// The distort-csi binary as a process: flags, the CSI socket, /healthz /readyz /metrics, and a
// SIGTERM that lets an in-flight call finish its grace period and answer before the process exits;
// node mode's host NQN registration and topology.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import {
  Controller,
  Identity,
  VolumeCapability_AccessMode_Mode as Mode,
  Node,
} from "../gen/csi/v1/csi_pb.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { formatNodeId } from "../lib/csi-node-id.ts";
import { GrpcCallError, GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { LEGACY_HOST_NQN_ANNOTATION } from "../lib/kube/node-directory.ts";
import pkg from "../package.json" with { type: "json" };

async function code(p: Promise<unknown>): Promise<number> {
  try {
    await p;
    return 0;
  } catch (err) {
    if (err instanceof GrpcCallError) return err.code;
    throw err;
  }
}

const MAIN = join(import.meta.dir, "main.ts");
const BUN = process.execPath;

let tc: TestCluster;
let root: string;
beforeAll(async () => {
  tc = await testCluster();
  root = await mkdtemp(join(tmpdir(), "distort-csi-main-"));
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
  await tc?.stop();
});

/** A child process with its stderr collected line by line. */
function spawn(args: string[]) {
  const proc = Bun.spawn([BUN, MAIN, ...args], {
    stdout: "ignore",
    stderr: "pipe",
    env: { PATH: process.env.PATH ?? "" },
  });
  const lines: string[] = [];
  void (async () => {
    const dec = new TextDecoder();
    let buf = "";
    for await (const chunk of proc.stderr) {
      buf += dec.decode(chunk, { stream: true });
      let nl = buf.indexOf("\n");
      while (nl >= 0) {
        lines.push(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
        nl = buf.indexOf("\n");
      }
    }
    if (buf) lines.push(buf);
  })();
  return { proc, lines };
}

test("controller mode serves CSI and probes, and drains on SIGTERM", async () => {
  const ns = await tc.namespace("csimain");
  const sock = join(root, "ctl", "csi.sock");
  const { proc, lines } = spawn([
    "--mode=controller",
    `--endpoint=unix://${sock}`,
    `--kubeconfig=${tc.kubeconfigPath}`,
    `--namespace=${ns}`,
    "--health-host=127.0.0.1",
    "--health-port=0",
    "--shutdown-grace-ms=1500",
  ]);
  try {
    const started = await eventually(
      () =>
        lines
          .map((l) => JSON.parse(l) as { msg: string; port?: number })
          .find((l) => l.msg === "health server listening"),
      120_000,
      "health server",
    );
    const health = `http://127.0.0.1:${started.port}`;
    const client = new GrpcJsClient(`unix://${sock}`);
    try {
      expect((await client.unary(Identity.method.getPluginInfo, {})).vendorVersion).toBe(pkg.version);
      await eventually(
        async () => (await client.unary(Identity.method.probe, {})).ready === true,
        120_000,
        "Probe ready",
      );
      expect((await fetch(`${health}/healthz`)).status).toBe(200);
      expect((await fetch(`${health}/readyz`)).status).toBe(200);
      const metrics = await fetch(`${health}/metrics`);
      expect(metrics.status).toBe(200);
      expect(await metrics.text()).toContain('distort_csi_calls_total{method="probe",code="OK"}');
      // A call that waits (nobody places the partition) is in flight when SIGTERM arrives.
      const t0 = performance.now();
      const inFlight = client
        .unary(
          Controller.method.createVolume,
          {
            name: "pvc-shutdown",
            volumeCapabilities: [
              { accessType: { case: "block", value: {} }, accessMode: { mode: Mode.SINGLE_NODE_WRITER } },
            ],
          },
          { timeoutMs: 30_000 },
        )
        .then(
          () => 0,
          (e: unknown) => (e instanceof GrpcCallError ? e.code : -1),
        );
      // In flight for sure once it has created its partition (and is waiting for the export).
      await eventually(() => lines.some((l) => l.includes('"volume requested"')), 60_000, "call in flight");
      proc.kill("SIGTERM");
      expect(await inFlight).toBe(14); // UNAVAILABLE "server shutting down": the CO retries
      expect(await proc.exited).toBe(0);
      const took = performance.now() - t0;
      expect(took).toBeGreaterThan(1_500); // it gave the call its grace period
      expect(took).toBeLessThan(30_000); // ...and did not wait for the call's own 30 s deadline
      expect(lines.some((l) => l.includes('"grpc stopped"'))).toBe(true);
    } finally {
      client.close();
    }
  } finally {
    proc.kill("SIGKILL");
  }
});

test("node mode registers the host NQN on its Node, reports the Node's topology, and serves Node", async () => {
  const nodeName = `worker-${Math.random().toString(36).slice(2, 8)}`;
  const core = tc.conn.api(k8s.CoreV1Api);
  await core.createNode({
    body: { metadata: { name: nodeName, labels: { "topology.kubernetes.io/zone": "z7", other: "x" } } },
  });
  const hostRoot = join(root, "host");
  await mkdir(join(hostRoot, "etc", "nvme"), { recursive: true });
  const hostNqn = "nqn.2014-08.org.nvmexpress:uuid:5b5b5b5b-6c1f-4c55-9a51-1f2b3c4d5e6f";
  await writeFile(join(hostRoot, "etc", "nvme", "hostnqn"), `${hostNqn}\n`);
  const sock = join(root, "node", "csi.sock");
  const { proc, lines } = spawn([
    "--mode=node",
    `--node-id=${nodeName}`,
    `--endpoint=unix://${sock}`,
    `--kubeconfig=${tc.kubeconfigPath}`,
    `--host-root=${hostRoot}`,
    `--state-dir=${join(root, "state")}`,
    "--node-tools=",
    "--topology-keys=topology.kubernetes.io/zone",
    "--health-host=127.0.0.1",
    "--health-port=0",
  ]);
  const client = new GrpcJsClient(`unix://${sock}`);
  try {
    await eventually(() => lines.some((l) => l.includes('"csi running"')), 120_000, "node plugin start");
    const info = await client.unary(Node.method.nodeGetInfo, {});
    // The host NQN travels in the node ID (kubelet keeps it in CSINode); the Node is only read.
    expect(info.nodeId).toBe(formatNodeId(nodeName, hostNqn));
    expect(info.accessibleTopology?.segments).toEqual({ "topology.kubernetes.io/zone": "z7" });
    expect(
      (await core.readNode({ name: nodeName })).metadata?.annotations?.[LEGACY_HOST_NQN_ANNOTATION],
    ).toBeUndefined();
    expect((await client.unary(Identity.method.probe, {})).ready).toBe(true);
    const caps = await client.unary(Identity.method.getPluginCapabilities, {});
    expect(caps.capabilities.some((c) => c.type.case === "service" && c.type.value.type === 1)).toBe(false);
    expect(await code(client.unary(Controller.method.createVolume, { name: "x" }))).toBe(12); // not served here
    proc.kill("SIGTERM");
    expect(await proc.exited).toBe(0);
  } finally {
    client.close();
    proc.kill("SIGKILL");
  }
});

test("node mode refuses to start without a host NQN", async () => {
  const { proc, lines } = spawn([
    "--mode=all",
    "--node-id=worker-1",
    `--endpoint=unix://${join(root, "all", "csi.sock")}`,
    `--kubeconfig=${tc.kubeconfigPath}`,
    `--host-root=${join(root, "empty-host")}`,
    "--health-port=0",
  ]);
  expect(await proc.exited).toBe(1);
  await Bun.sleep(50);
  expect(lines.join("\n")).toContain("cannot read the host NQN from /etc/nvme/hostnqn");
  expect(existsSync(join(root, "all", "csi.sock"))).toBe(false);
});

test("a bad flag exits 2 with the usage", async () => {
  const { proc, lines } = spawn(["--mode=sideways"]);
  expect(await proc.exited).toBe(2);
  await Bun.sleep(50);
  const out = lines.join("\n");
  expect(out).toContain("--mode: mode must be controller, node or all");
  expect(out).toContain("usage: distort-csi");
});
