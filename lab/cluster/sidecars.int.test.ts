// The CSI sidecars and snapshot-controller built from the Go module proxy run and report their
// pinned versions, and the VolumeSnapshot CRDs install idempotently and serve their API.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { installSnapshotCrds } from "./snapshot-crds.ts";
import { eventually, type TestCluster, testCluster } from "./test-support.ts";
import { ensureSidecars, SIDECAR_VERSIONS, type SidecarPaths } from "./tools.ts";

let tc: TestCluster;
let bins: SidecarPaths;
beforeAll(async () => {
  // Cold, this compiles five Go programs; cached, it is a handful of stat calls.
  bins = await ensureSidecars();
  tc = await testCluster();
}, 1_800_000);
afterAll(async () => {
  await tc?.stop();
});

const SNAPSHOT_API = "/apis/snapshot.storage.k8s.io/v1";

test("the VolumeSnapshot CRDs install twice and their API serves lists and objects", async () => {
  const first = await installSnapshotCrds(tc.conn);
  const second = await installSnapshotCrds(tc.conn);
  const plurals = ["volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots"];
  const expected = [
    ...plurals.map((p) => `${p}.snapshot.storage.k8s.io`),
    ...plurals.map((p) => `${p.replace("volume", "volumegroup")}.groupsnapshot.storage.k8s.io`),
  ].sort();
  expect([...first].sort()).toEqual(expected);
  expect([...second].sort()).toEqual(expected);

  // What `kubectl get volumesnapshots -A` and friends ask for.
  for (const [plural, kind] of [
    ["volumesnapshotclasses", "VolumeSnapshotClassList"],
    ["volumesnapshotcontents", "VolumeSnapshotContentList"],
    ["volumesnapshots", "VolumeSnapshotList"],
  ] as const) {
    const res = await tc.conn.request(`${SNAPSHOT_API}/${plural}`);
    expect(res.status).toBe(200);
    expect(((await res.json()) as { kind: string }).kind).toBe(kind);
  }

  // The schema accepts what the chart's VolumeSnapshotClass looks like and rejects a bad policy.
  const name = `vsc-${randomBytes(4).toString("hex")}`;
  const json = { method: "POST", contentType: "application/json" };
  const cls = { apiVersion: "snapshot.storage.k8s.io/v1", kind: "VolumeSnapshotClass", metadata: { name } };
  const created = await tc.conn.request(`${SNAPSHOT_API}/volumesnapshotclasses`, {
    ...json,
    body: JSON.stringify({ ...cls, driver: "distort.example.io", deletionPolicy: "Delete" }),
  });
  expect(created.status).toBe(201);
  const bad = await tc.conn.request(`${SNAPSHOT_API}/volumesnapshotclasses`, {
    ...json,
    body: JSON.stringify({ ...cls, metadata: { name: `${name}-bad` }, driver: "d", deletionPolicy: "Keep" }),
  });
  expect(bad.status).toBe(422);
  const list = (await (await tc.conn.request(`${SNAPSHOT_API}/volumesnapshotclasses`)).json()) as {
    items: { metadata: { name: string }; driver: string }[];
  };
  expect(list.items.find((x) => x.metadata.name === name)?.driver).toBe("distort.example.io");
  const del = await tc.conn.request(`${SNAPSHOT_API}/volumesnapshotclasses/${name}`, { method: "DELETE" });
  expect(del.ok).toBe(true);
});

test.each([
  ["csi-provisioner", SIDECAR_VERSIONS.provisioner, "provisioner"],
  ["csi-attacher", SIDECAR_VERSIONS.attacher, "attacher"],
  ["csi-resizer", SIDECAR_VERSIONS.resizer, "resizer"],
  ["csi-snapshotter", SIDECAR_VERSIONS.snapshotter, "snapshotter"],
  ["snapshot-controller", SIDECAR_VERSIONS.snapshotter, "snapshotController"],
  ["csi-snapshot-metadata", SIDECAR_VERSIONS.snapshotMetadata, "snapshotMetadata"],
] as const)("%s --version reports %s", (_name, version, key) => {
  const p = Bun.spawnSync([bins[key], "--version"], { stdout: "pipe", stderr: "pipe" });
  expect(p.exitCode).toBe(0);
  expect(`${p.stdout.toString()}${p.stderr.toString()}`).toContain(version);
});

test("snapshot-controller runs against the control plane, reconciles and stays up", async () => {
  await installSnapshotCrds(tc.conn);
  const ns = await tc.namespace("snap");
  const started = Date.now();
  // setpriv's parent-death signal: the controller dies with this test runner even if it crashes.
  const proc = Bun.spawn(
    [
      "setpriv",
      "--pdeathsig",
      "KILL",
      "--",
      bins.snapshotController,
      `--kubeconfig=${tc.kubeconfigPath}`,
      "--leader-election=false",
      "--v=2",
    ],
    { stdout: "pipe", stderr: "pipe", stdin: "ignore" },
  );
  const output = Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text()]).then(
    ([o, e]) => o + e,
  );
  const exited = async () => `snapshot-controller exited ${proc.exitCode}:\n${await output}`;
  try {
    // A snapshot of an unknown class: the controller's only possible answer is an error status,
    // which proves its informers sync and its writes reach the API server.
    const path = `${SNAPSHOT_API}/namespaces/${ns}/volumesnapshots`;
    const created = await tc.conn.request(path, {
      method: "POST",
      contentType: "application/json",
      body: JSON.stringify({
        apiVersion: "snapshot.storage.k8s.io/v1",
        kind: "VolumeSnapshot",
        metadata: { name: "s" },
        spec: {
          volumeSnapshotClassName: "no-such-class",
          source: { persistentVolumeClaimName: "no-such-pvc" },
        },
      }),
    });
    expect(created.status).toBe(201);
    const message = await eventually(
      async () => {
        if (proc.exitCode !== null) throw new Error(await exited());
        const snap = (await (await tc.conn.request(`${path}/s`)).json()) as {
          status?: { error?: { message?: string } };
        };
        return snap.status?.error?.message;
      },
      15_000,
      "snapshot-controller to report the missing class",
    );
    expect(message).toContain("no-such-class");
    // A bad flag or an unreachable API server makes it exit within a second or two.
    await Bun.sleep(Math.max(0, 2_500 - (Date.now() - started)));
    if (proc.exitCode !== null) throw new Error(await exited());
  } finally {
    proc.kill("SIGTERM");
    await Promise.race([proc.exited, Bun.sleep(5_000)]);
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
    await proc.exited;
  }
  expect(await output).toContain("Starting snapshot controller");
}, 30_000);
