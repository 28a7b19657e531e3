// A Node's volume status as the staging sweep reads it, against a real kube-apiserver: the
// attach/detach controller's volumesAttached and kubelet's volumesInUse, this driver's entries
// only; a Node that does not exist is an error, never "nothing attached".
import { afterAll, beforeAll, expect, test } from "bun:test";
import * as k8s from "@kubernetes/client-node";
import { type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { nodeVolumeClaims } from "./node-directory.ts";

let tc: TestCluster;
beforeAll(async () => {
  tc = await testCluster();
}, 300_000);
afterAll(async () => {
  await tc?.stop();
});

test("volumesAttached and volumesInUse give this driver's handles; other drivers' are left out", async () => {
  const core = tc.conn.api(k8s.CoreV1Api);
  const name = `sweep-${Math.random().toString(36).slice(2, 8)}`;
  await core.createNode({ body: { metadata: { name } } });
  try {
    const ours = (h: string) => `kubernetes.io/csi/storage.distort.io^${h}`;
    const res = await tc.conn.request(`/api/v1/nodes/${name}/status`, {
      method: "PATCH",
      contentType: "application/merge-patch+json",
      body: JSON.stringify({
        status: {
          volumesAttached: [
            { name: ours("distort-system/pvc-a/u1"), devicePath: "" },
            { name: "kubernetes.io/csi/other.example.com^distort-system/pvc-x/u9", devicePath: "" },
          ],
          volumesInUse: [
            ours("distort-system/pvc-a/u1"),
            ours("distort-system/pvc-b/u2"),
            "kubernetes.io/aws-ebs/vol-1",
          ],
        },
      }),
    });
    expect(res.status).toBe(200);
    const claims = await nodeVolumeClaims(tc.conn, name, "storage.distort.io");
    expect([...claims.attached]).toEqual(["distort-system/pvc-a/u1"]);
    expect([...claims.inUse].sort()).toEqual(["distort-system/pvc-a/u1", "distort-system/pvc-b/u2"]);
    expect(claims.uid).toMatch(/^[0-9a-f-]{36}$/);
  } finally {
    await core.deleteNode({ name });
  }
  await expect(nodeVolumeClaims(tc.conn, name, "storage.distort.io")).rejects.toThrow(/read node/);
});
