// csi-snapshot-metadata, built from the Go module proxy, between e2e/snapshot-metadata-client.ts
// and a stand-in CSI driver on a unix socket, against a real API server: the client's TLS (CA and
// server name from the SnapshotMetadataService), its audience-bound token (TokenRequest, reviewed by
// the sidecar), the sidecar's translation of snapshot names into CSI snapshot ids, and paging
// parameters passed through to the driver.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import {
  blocksOf,
  readSnapshotMetadataService,
  SnapshotMetadataClient,
  SnapshotMetadataError,
  serviceAccountToken,
  snapshotHandle,
} from "../../e2e/snapshot-metadata-client.ts";
import {
  SnapshotMetadata as CsiSnapshotMetadata,
  Identity,
  PluginCapability_Service_Type,
} from "../../gen/csi/v1/csi_pb.ts";
import { type GrpcServer, register, serveGrpc } from "../../lib/grpc/server.ts";
import { silentLogger } from "../../lib/log.ts";
import { freePort } from "./control-plane.ts";
import { installSnapshotCrds, installSnapshotMetadataCrd } from "./snapshot-crds.ts";
import { type TestCluster, testCluster } from "./test-support.ts";
import { ensureSidecars } from "./tools.ts";

const DRIVER = "smd.distort.test";
const AUDIENCE = "smd-test-audience";
const MiB = 1024n * 1024n;
const BLOCK = 4n * MiB;
const SNAP = "snapshot.storage.k8s.io";

let tc: TestCluster;
let ns: string;
let dir: string;
let driver: GrpcServer;
let sidecar: ReturnType<typeof Bun.spawn> | undefined;
let client: SnapshotMetadataClient;
let token: string;
/** What the stand-in driver was asked, in order. */
const asked: { method: string; snapshot: string; base?: string; start: bigint; max: number }[] = [];
const cleanup: string[] = [];

/** Clusters each snapshot id owns, and the delta from base "h-a" to "h-b". */
const ALLOCATED: Record<string, bigint[]> = { "h-a": [0n, 1n, 2n, 3n], "h-b": [0n, 1n, 2n, 3n, 5n, 9n] };
const DELTA = [2n, 5n, 9n];

function sh(argv: string[], cwd: string): void {
  const p = Bun.spawnSync(argv, { cwd, stdout: "pipe", stderr: "pipe" });
  if (p.exitCode !== 0) throw new Error(`${argv.join(" ")}: ${p.stderr.toString()}`);
}

/** A CA and a serving certificate for `names` (openssl), as the chart's genCA/genSignedCert make them. */
function certificates(at: string, names: string[]): void {
  sh(
    ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=smd-ca"].concat([
      "-keyout",
      "ca.key",
      "-out",
      "ca.crt",
    ]),
    at,
  );
  sh(
    [
      "openssl",
      "req",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-subj",
      `/CN=${names[0]}`,
      "-keyout",
      "tls.key",
      "-out",
      "tls.csr",
    ],
    at,
  );
  Bun.write(join(at, "ext.cnf"), `subjectAltName=${names.map((n) => `DNS:${n}`).join(",")}\n`);
  sh(
    [
      "openssl",
      "x509",
      "-req",
      "-in",
      "tls.csr",
      "-CA",
      "ca.crt",
      "-CAkey",
      "ca.key",
      "-CAcreateserial",
    ].concat(["-days", "1", "-extfile", "ext.cnf", "-out", "tls.crt"]),
    at,
  );
}

async function createCluster(path: string, body: unknown): Promise<void> {
  const res = await tc.conn.request(path, {
    method: "POST",
    contentType: "application/json",
    body: JSON.stringify(body),
  });
  if (res.status !== 201) throw new Error(`POST ${path}: ${res.status} ${await res.text()}`);
}

async function patchStatus(path: string, status: unknown): Promise<void> {
  const res = await tc.conn.request(`${path}/status`, {
    method: "PATCH",
    contentType: "application/merge-patch+json",
    body: JSON.stringify({ status }),
  });
  if (!res.ok) throw new Error(`PATCH ${path}/status: ${res.status} ${await res.text()}`);
}

/** A ready VolumeSnapshot `name` bound to a content whose CSI snapshot id is `handle`. */
async function readySnapshot(name: string, handle: string): Promise<void> {
  const content = `smd-${ns}-${name}`;
  await createCluster(`/apis/${SNAP}/v1/volumesnapshotcontents`, {
    apiVersion: `${SNAP}/v1`,
    kind: "VolumeSnapshotContent",
    metadata: { name: content },
    spec: {
      driver: DRIVER,
      deletionPolicy: "Retain",
      source: { snapshotHandle: handle },
      volumeSnapshotRef: { name, namespace: ns },
    },
  });
  cleanup.push(`/apis/${SNAP}/v1/volumesnapshotcontents/${content}`);
  await patchStatus(`/apis/${SNAP}/v1/volumesnapshotcontents/${content}`, {
    readyToUse: true,
    snapshotHandle: handle,
  });
  await createCluster(`/apis/${SNAP}/v1/namespaces/${ns}/volumesnapshots`, {
    apiVersion: `${SNAP}/v1`,
    kind: "VolumeSnapshot",
    metadata: { name },
    spec: { volumeSnapshotClassName: "smd-class", source: { volumeSnapshotContentName: content } },
  });
  await patchStatus(`/apis/${SNAP}/v1/namespaces/${ns}/volumesnapshots/${name}`, {
    readyToUse: true,
    boundVolumeSnapshotContentName: content,
  });
}

const blocks = (clusters: bigint[], start: bigint, max: number) => {
  const from = clusters.filter((c) => (c + 1n) * BLOCK > start);
  const per = max > 0 ? max : 100;
  const out = [];
  for (let i = 0; i < from.length; i += per)
    out.push(from.slice(i, i + per).map((c) => ({ byteOffset: c * BLOCK, sizeBytes: BLOCK })));
  return out;
};

beforeAll(async () => {
  const bins = await ensureSidecars();
  tc = await testCluster();
  await installSnapshotCrds(tc.conn);
  await installSnapshotMetadataCrd(tc.conn);
  ns = await tc.namespace("smd");
  dir = mkdtempSync(join(tmpdir(), "distort-smd-"));

  driver = await serveGrpc({
    socketPath: join(dir, "csi.sock"),
    logger: silentLogger,
    services: [
      register(Identity, {
        getPluginInfo: () => ({ name: DRIVER, vendorVersion: "test" }),
        getPluginCapabilities: () => ({
          capabilities: [
            {
              type: {
                case: "service" as const,
                value: { type: PluginCapability_Service_Type.SNAPSHOT_METADATA_SERVICE },
              },
            },
          ],
        }),
        probe: () => ({ ready: true }),
      }),
      register(CsiSnapshotMetadata, {
        async *getMetadataAllocated(req) {
          asked.push({
            method: "allocated",
            snapshot: req.snapshotId,
            start: req.startingOffset,
            max: req.maxResults,
          });
          for (const page of blocks(ALLOCATED[req.snapshotId] ?? [], req.startingOffset, req.maxResults))
            yield { blockMetadataType: 1, volumeCapacityBytes: 64n * MiB, blockMetadata: page };
        },
        async *getMetadataDelta(req) {
          asked.push({
            method: "delta",
            snapshot: req.targetSnapshotId,
            base: req.baseSnapshotId,
            start: req.startingOffset,
            max: req.maxResults,
          });
          for (const page of blocks(DELTA, req.startingOffset, req.maxResults))
            yield { blockMetadataType: 1, volumeCapacityBytes: 64n * MiB, blockMetadata: page };
        },
      }),
    ],
  });

  const svcHost = `smd-svc.${ns}`;
  certificates(dir, [svcHost, `${svcHost}.svc`]);
  const port = await freePort();
  const httpPort = await freePort();
  // The SnapshotMetadataService a chart would install; its address names a Service the test dials
  // on loopback instead (the certificate is checked for the address's host all the same).
  await createCluster("/apis/cbt.storage.k8s.io/v1beta1/snapshotmetadataservices", {
    apiVersion: "cbt.storage.k8s.io/v1beta1",
    kind: "SnapshotMetadataService",
    metadata: { name: DRIVER },
    spec: {
      address: `${svcHost}:${port}`,
      caCert: readFileSync(join(dir, "ca.crt")).toString("base64"),
      audience: AUDIENCE,
    },
  });
  cleanup.push(`/apis/cbt.storage.k8s.io/v1beta1/snapshotmetadataservices/${DRIVER}`);
  await createCluster(`/apis/${SNAP}/v1/volumesnapshotclasses`, {
    apiVersion: `${SNAP}/v1`,
    kind: "VolumeSnapshotClass",
    metadata: { name: "smd-class" },
    driver: DRIVER,
    deletionPolicy: "Retain",
  });
  cleanup.push(`/apis/${SNAP}/v1/volumesnapshotclasses/smd-class`);
  await readySnapshot("a", "h-a");
  await readySnapshot("b", "h-b");

  sidecar = Bun.spawn(
    [
      bins.snapshotMetadata,
      `--kubeconfig=${tc.kubeconfigPath}`,
      `--csi-address=${join(dir, "csi.sock")}`,
      `--tls-cert=${join(dir, "tls.crt")}`,
      `--tls-key=${join(dir, "tls.key")}`,
      `--port=${port}`,
      `--http-endpoint=127.0.0.1:${httpPort}`,
      `--audience=${AUDIENCE}`,
    ],
    { stdout: "ignore", stderr: Bun.file(join(dir, "sidecar.log")) },
  );
  const deadline = Date.now() + 60_000;
  for (;;) {
    const ok = await fetch(`http://127.0.0.1:${httpPort}/health`).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) break;
    if (sidecar.exitCode !== null || Date.now() > deadline)
      throw new Error(
        `csi-snapshot-metadata not healthy:\n${readFileSync(join(dir, "sidecar.log"), "utf8")}`,
      );
    await Bun.sleep(100);
  }

  // The backup client: a ServiceAccount that may get VolumeSnapshots in the namespace.
  const core = tc.conn.api(k8s.CoreV1Api);
  const rbac = tc.conn.api(k8s.RbacAuthorizationV1Api);
  await core.createNamespacedServiceAccount({ namespace: ns, body: { metadata: { name: "backup" } } });
  await rbac.createNamespacedRole({
    namespace: ns,
    body: {
      metadata: { name: "backup" },
      rules: [{ apiGroups: [SNAP], resources: ["volumesnapshots"], verbs: ["get"] }],
    },
  });
  await rbac.createNamespacedRoleBinding({
    namespace: ns,
    body: {
      metadata: { name: "backup" },
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: "backup" },
      subjects: [{ kind: "ServiceAccount", name: "backup", namespace: ns }],
    },
  });
  const service = await readSnapshotMetadataService(tc.conn, DRIVER);
  token = await serviceAccountToken(tc.conn, ns, "backup", service.audience);
  client = new SnapshotMetadataClient(service, `127.0.0.1:${port}`);
}, 600_000);

afterAll(async () => {
  client?.close();
  sidecar?.kill();
  await sidecar?.exited;
  await driver?.close();
  for (const path of cleanup) await tc?.conn.request(path, { method: "DELETE" });
  if (dir) rmSync(dir, { recursive: true, force: true });
  await tc?.stop();
});

test("GetMetadataAllocated over TLS: the snapshot's CSI id reaches the driver, every range comes back", async () => {
  const a = await client.getMetadataAllocated({ token, namespace: ns, snapshotName: "a" });
  expect(blocksOf(a.ranges, BLOCK)).toEqual([0, 1, 2, 3]);
  expect(a.volumeCapacityBytes).toBe(64n * MiB);
  const paged = await client.getMetadataAllocated({
    token,
    namespace: ns,
    snapshotName: "b",
    startingOffset: 2n * BLOCK + 4096n,
    maxResults: 1,
  });
  expect(blocksOf(paged.ranges, BLOCK)).toEqual([2, 3, 5, 9]);
  expect([paged.messages, paged.largestMessage]).toEqual([4, 1]);
  expect(asked.slice(-2)).toEqual([
    { method: "allocated", snapshot: "h-a", start: 0n, max: 0 },
    { method: "allocated", snapshot: "h-b", start: 2n * BLOCK + 4096n, max: 1 },
  ]);
}, 60_000);

test("GetMetadataDelta: the base by CSI id, the target by name", async () => {
  const base = await snapshotHandle(tc.conn, ns, "a");
  expect(base).toBe("h-a");
  const d = await client.getMetadataDelta({
    token,
    namespace: ns,
    baseSnapshotId: base,
    targetSnapshotName: "b",
  });
  expect(blocksOf(d.ranges, BLOCK)).toEqual([2, 5, 9]);
  expect(asked.at(-1)).toEqual({ method: "delta", snapshot: "h-b", base: "h-a", start: 0n, max: 0 });
}, 60_000);

test("a token of another audience is UNAUTHENTICATED; an identity without get on VolumeSnapshots PERMISSION_DENIED", async () => {
  const other = await serviceAccountToken(tc.conn, ns, "backup", `${AUDIENCE}-other`);
  const e1 = await client
    .getMetadataAllocated({ token: other, namespace: ns, snapshotName: "a" })
    .catch((e) => e);
  expect(e1).toBeInstanceOf(SnapshotMetadataError);
  expect((e1 as SnapshotMetadataError).code).toBe(16);
  await tc.conn
    .api(k8s.CoreV1Api)
    .createNamespacedServiceAccount({ namespace: ns, body: { metadata: { name: "nobody" } } });
  const nobody = await serviceAccountToken(tc.conn, ns, "nobody", AUDIENCE);
  const e2 = await client
    .getMetadataAllocated({ token: nobody, namespace: ns, snapshotName: "a" })
    .catch((e) => e);
  expect((e2 as SnapshotMetadataError).code).toBe(7);
}, 60_000);
