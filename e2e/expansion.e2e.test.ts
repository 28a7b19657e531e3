// Online expansion end to end: a claim grown while a Pod holds it is grown by the resizer on the
// target (the lvol), then by the kubelet on the node (the mounted filesystem), the claim reports
// the new capacity with no resize left pending, and the data written before is intact.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { readFileSync, statfsSync } from "node:fs";
import * as k8s from "@kubernetes/client-node";
import { kinds } from "../api/index.ts";
import { kubeError, ResourceClient } from "../lib/kube/resource.ts";
import { publishPath } from "./kubelet/naming.ts";
import { bdevBytes, targetRpc, type VolumeTarget, volumeTarget } from "./storage-target.ts";
import { createPvc, deletePod, type E2eLab, e2eLab, runWorkload, until, workloadPod } from "./support.ts";
import { waitHeld } from "./user-steps.ts";

const GiB = 1024 ** 3;
const BYTES = 16 * 1024 * 1024;
/** CAP_SYS_RESOURCE: EXT4_IOC_RESIZE_FS (resize2fs on a mounted ext4) is refused without it. */
const CAP_SYS_RESOURCE = 24n;
/** Claim conditions of a resize in progress or failed; none may remain once it is done. */
const RESIZE_CONDITIONS = ["Resizing", "FileSystemResizePending", "ControllerResizeError", "NodeResizeError"];

let lab: E2eLab;
beforeAll(async () => {
  lab = await e2eLab();
}, 120_000);
afterAll(() => lab.stop());

/** True when `pid` may grow a mounted ext4: its effective set holds CAP_SYS_RESOURCE. */
function canGrowExt4(pid: number): boolean {
  const line = readFileSync(`/proc/${pid}/status`, "utf8")
    .split("\n")
    .find((l) => l.startsWith("CapEff:"));
  return line !== undefined && ((BigInt(`0x${line.slice(7).trim()}`) >> CAP_SYS_RESOURCE) & 1n) === 1n;
}

/** Bytes of the filesystem mounted at `path`. */
function fsBytes(path: string): number {
  const s = statfsSync(path);
  return s.blocks * s.bsize;
}

describe("online expansion", () => {
  test("a held 1Gi volume grows to 2Gi on the target and on the node; the data stays intact", async () => {
    const [nodeA, nodeB] = lab.consumers;
    if (!nodeA || !nodeB) throw new Error("the lab needs two consumer nodes");
    const ns = await lab.newNamespace("expand");
    const storage = lab.storageApi;
    // The node plugin runs the grow tool; ext4 needs a capability this sandbox may not grant, and
    // then a class like the default one but with xfs, which grows with what the plugin has.
    const csiPid = lab.pid(nodeA.csi);
    if (csiPid === undefined) throw new Error(`${nodeA.csi} is not running`);
    let storageClass = "distort-lab";
    if (!canGrowExt4(csiPid)) {
      storageClass = `e2e-xfs-${randomBytes(3).toString("hex")}`;
      const base = await storage.readStorageClass({ name: "distort-lab" });
      await storage.createStorageClass({
        body: {
          metadata: { name: storageClass },
          provisioner: base.provisioner,
          parameters: { ...base.parameters, "csi.storage.k8s.io/fstype": "xfs" },
          reclaimPolicy: base.reclaimPolicy,
          volumeBindingMode: base.volumeBindingMode,
          allowVolumeExpansion: true,
        },
      });
    }
    let t: VolumeTarget | undefined;
    try {
      await createPvc(lab, ns, "data", { storageClass, size: "1Gi" });
      await lab.core.createNamespacedPod({
        namespace: ns,
        body: workloadPod("holder", nodeA.name, "data", [
          "write",
          `--bytes=${BYTES}`,
          `--seed=${ns}`,
          "--then-hold",
        ]),
      });
      const written = await waitHeld(lab, ns, "holder", 180_000);
      const holder = await lab.core.readNamespacedPod({ name: "holder", namespace: ns });
      expect(written).toMatchObject({ mode: "write", bytes: BYTES, ok: true });
      t = await volumeTarget(lab, ns, "data");
      const pvName = await pvOf(ns);
      const mount = publishPath(nodeA.kubeletRoot, {
        podUID: holder.metadata?.uid as string,
        pvName,
        mode: "Filesystem",
      });
      const target = targetRpc(t.spdkSocket);
      try {
        expect(await bdevBytes(target.rpc, t.bdev)).toBe(GiB);
        const fsBefore = fsBytes(mount);
        expect(fsBefore).toBeLessThanOrEqual(GiB);

        await lab.core.patchNamespacedPersistentVolumeClaim(
          { name: "data", namespace: ns, body: { spec: { resources: { requests: { storage: "2Gi" } } } } },
          k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
        );
        // The resizer's ControllerExpandVolume grows the lvol in place.
        await until(
          "the lvol grown to 2Gi on the target",
          async () => (await bdevBytes(target.rpc, t?.bdev as string)) === 2 * GiB,
        );
        // The kubelet's NodeExpandVolume grows the filesystem, then it records the new capacity.
        const pvc = await until(
          "claim capacity 2Gi",
          async () => {
            const c = await lab.core.readNamespacedPersistentVolumeClaim({ name: "data", namespace: ns });
            return c.status?.capacity?.storage === "2Gi" ? c : undefined;
          },
          180_000,
        );
        expect(pvc.status?.allocatedResourceStatuses?.storage).toBeUndefined();
        expect((pvc.status?.conditions ?? []).filter((c) => RESIZE_CONDITIONS.includes(c.type))).toEqual([]);
        expect(pvc.status?.allocatedResources?.storage).toBe("2Gi");
        expect((await lab.core.readPersistentVolume({ name: pvName })).spec?.capacity?.storage).toBe("2Gi");
        const fsAfter = fsBytes(mount);
        expect(fsAfter).toBeGreaterThan(GiB);
        expect(fsAfter).toBeLessThanOrEqual(2 * GiB);
        const p = await new ResourceClient(lab.conn, kinds.NVMePartition).get(
          t.partition.metadata.name,
          t.partition.metadata.namespace,
        );
        expect(p?.spec.sizeBytes).toBe(2 * GiB);
      } finally {
        await target.close();
      }

      // The grown volume on another node: the data written before the growth reads back intact.
      await deletePod(lab, ns, "holder", 180_000);
      const read = await runWorkload(
        lab,
        ns,
        "reader",
        nodeB.name,
        "data",
        ["verify", `--bytes=${BYTES}`, `--seed=${ns}`],
        240_000,
      );
      expect(read).toMatchObject({ mode: "verify", bytes: BYTES, ok: true, sha256: written.sha256 });
    } finally {
      await cleanUp(ns, t, storageClass === "distort-lab" ? undefined : storageClass);
    }
  }, 600_000);
});

/** Deletes the test's Pods, claim, class and namespace; waits until the volume is gone from the target. */
async function cleanUp(
  ns: string,
  t: VolumeTarget | undefined,
  storageClass: string | undefined,
): Promise<void> {
  for (const pod of ["holder", "reader"]) await deletePod(lab, ns, pod, 180_000);
  try {
    await lab.core.deleteNamespacedPersistentVolumeClaim({ name: "data", namespace: ns });
  } catch (err) {
    if (kubeError(err, "delete").kind !== "not-found") throw err;
  }
  if (t) {
    const parts = new ResourceClient(lab.conn, kinds.NVMePartition);
    const { name, namespace } = t.partition.metadata;
    await until(`partition ${name} deleted`, async () => !(await parts.get(name, namespace)), 180_000);
  }
  if (storageClass) await lab.storageApi.deleteStorageClass({ name: storageClass });
  await lab.core.deleteNamespace({ name: ns });
}

/** The PV bound to claim "data". */
async function pvOf(ns: string): Promise<string> {
  const pvc = await lab.core.readNamespacedPersistentVolumeClaim({ name: "data", namespace: ns });
  if (!pvc.spec?.volumeName) throw new Error(`claim ${ns}/data is not bound`);
  return pvc.spec.volumeName;
}
