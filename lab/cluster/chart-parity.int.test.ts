// chartParity against a real release on the real API server: `helm install` of the chart with the
// lab's values file and a tag shows no difference; an upgrade with one more --set shows both the
// value and the object it changed; a release helm cannot read is an error, not "no difference".
import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import { CHART_DIR, runHelm } from "../../helm/chart-support.ts";
import { chartParity, formatDifferences, LAB_CLUSTER_VALUES } from "./chart-parity.ts";
import { ensureHelm } from "./helm-tool.ts";
import { installSnapshotCrds } from "./snapshot-crds.ts";
import { type TestCluster, testCluster } from "./test-support.ts";

const TAG = "0123456";
let helm: string;
let tc: TestCluster;
let namespace: string;
const release = `parity-${process.pid}`;
const cluster = () => ["--kubeconfig", tc.kubeconfigPath, "--namespace", namespace];

beforeAll(async () => {
  helm = await ensureHelm();
  tc = await testCluster();
  // The lab values enable snapshots: the VolumeSnapshotClass needs its CRD, as in the lab.
  await installSnapshotCrds(tc.conn);
  namespace = await tc.namespace("parity");
  const r = await runHelm(helm, [
    "install",
    release,
    CHART_DIR,
    ...cluster(),
    "-f",
    join(CHART_DIR, LAB_CLUSTER_VALUES),
    "--set-string",
    `images.tag=${TAG}`,
  ]);
  if (r.code !== 0) throw new Error(`helm install failed: ${r.stderr}`);
}, 600_000);

afterAll(async () => {
  if (tc && namespace) await runHelm(helm, ["uninstall", release, ...cluster()]);
  await tc?.stop();
});

const parity = () => chartParity({ helm, kubeconfig: tc.kubeconfigPath, release, namespace, tag: TAG });

test("the chart installed with the lab's values file and tag: no difference", async () => {
  const diffs = await parity();
  expect(formatDifferences(diffs)).toBe("");
});

test("another tag than the installed one: every DISTORT image differs", async () => {
  const diffs = await chartParity({ helm, kubeconfig: tc.kubeconfigPath, release, namespace, tag: "other" });
  expect(diffs).toContainEqual({ kind: "value", path: "images.tag", installed: TAG, expected: "other" });
  expect(diffs.filter((d) => d.kind === "changed" && d.path.endsWith(".image")).length).toBeGreaterThan(5);
});

test("one more --set at upgrade: the value and the object it changed", async () => {
  const r = await runHelm(helm, [
    "upgrade",
    release,
    CHART_DIR,
    ...cluster(),
    "--reuse-values",
    "--set",
    "manager.replicas=3",
  ]);
  expect(r.stderr).toBe("");
  expect(r.code).toBe(0);
  const diffs = await parity();
  expect(diffs).toEqual([
    {
      kind: "changed",
      object: `apps/v1 Deployment ${namespace}/${release}-distort-manager`,
      path: "spec.replicas",
      installed: 3,
      expected: 2,
    },
    // The values file asks for 2.
    { kind: "value", path: "manager.replicas", installed: 3, expected: 2 },
  ]);
});

test("a release helm cannot find is an error", async () => {
  await expect(
    chartParity({ helm, kubeconfig: tc.kubeconfigPath, release: "no-such-release", namespace, tag: TAG }),
  ).rejects.toThrow(/helm get (manifest|values) failed .*not found/);
});
