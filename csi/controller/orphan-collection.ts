// One sweep of orphan collection: the imperative side of orphans.ts. It gathers the facts (the
// partition and its claim as the API server has them now, the PersistentVolumes, the attachments)
// and deletes what decideOrphan condemns through the normal deletion path.
import * as k8s from "@kubernetes/client-node";
import type { NVMePartition } from "../../api/index.ts";
import { errorMessage, StorageError } from "../../lib/errors.ts";
import { kubeError } from "../../lib/kube/resource.ts";
import { type ClaimState, claimOf, decideOrphan, preliminaryVerdict, pvNameOf } from "./orphans.ts";
import type { ControllerState } from "./state.ts";
import { parseVolumeId } from "./volume-id.ts";

/**
 * Deletes every cached partition decideOrphan condemns (claim annotations, older than `graceMs`,
 * no PV, no attachment, claim gone or replaced); finalizers let the manager and agent release
 * storage. Records an "OrphanCollected" Event on each and returns the names deleted; nothing
 * before the caches synced. One LIST of PersistentVolumes per sweep; a partition a PV or an
 * attachment holds costs no request, and only a collectable one is re-read (with its claim). Idempotent and safe across replicas: each deletion re-reads the
 * partition and carries its uid as a precondition, and a partition with an operation in flight
 * in this process is left for the next sweep. Throws when the PersistentVolumes cannot be
 * listed; a failed claim lookup or deletion only skips that partition (logged).
 */
export async function collectOrphans(c: ControllerState, graceMs: number): Promise<string[]> {
  if (!c.synced) return [];
  const now = c.o.clock.now();
  const candidates = c.partitions.list().filter((p) => !preliminaryVerdict(p, now, graceMs));
  if (candidates.length === 0) return [];
  const core = c.o.conn.api(k8s.CoreV1Api);
  const pvs = await core.listPersistentVolume().catch((err) => {
    throw kubeError(err, "list PersistentVolumes");
  });
  const pvNames = new Set<string>();
  const handled = new Set<string>();
  for (const pv of pvs.items) {
    if (pv.metadata?.name) pvNames.add(pv.metadata.name);
    const ref = parseVolumeId(pv.spec?.csi?.volumeHandle ?? "");
    // Any incarnation of the name counts: doubt keeps the partition.
    if (ref?.namespace === c.ns) handled.add(ref.name);
  }
  const hasPv = (p: NVMePartition) => {
    const pvName = pvNameOf(p);
    return handled.has(p.metadata.name) || (pvName !== undefined && pvNames.has(pvName));
  };
  const isAttached = (p: NVMePartition) =>
    c.attachments.list().some((a) => a.spec.partitionUID === p.metadata.uid);
  const deleted: string[] = [];
  for (const cached of candidates) {
    const name = cached.metadata.name;
    // A PV or an attachment keeps a partition whatever the API server says of it: such a live
    // volume is judged from the PV list and the caches, with no GET. Only a partition that looks
    // collectable is re-read, and its claim looked up.
    if (hasPv(cached) || isAttached(cached)) continue;
    try {
      const gone = await c.inFlight.run(c.key(name), "orphan collection", async () => {
        // The cache may lag: judge the partition as the API server has it now.
        const p = await c.partClient.get(name, c.ns);
        if (!p || p.metadata.uid !== cached.metadata.uid) return false;
        const claim = claimOf(p);
        if (!claim) return false;
        // Judged again on the fresh copy before the claim is looked up.
        if (hasPv(p) || isAttached(p)) return false;
        const verdict = decideOrphan(p, {
          claim: await claimState(core, claim.namespace, claim.name),
          hasPersistentVolume: hasPv(p),
          attached: isAttached(p),
          now: c.o.clock.now(),
          graceMs,
        });
        if (verdict.action === "keep") return false;
        try {
          if (!(await c.partClient.delete(name, c.ns, { uid: p.metadata.uid as string }))) return false;
        } catch (err) {
          // The uid precondition failed: this incarnation is already gone.
          if (err instanceof StorageError && err.kind === "conflict") return false;
          throw err;
        }
        c.log.info("orphaned volume deleted", { partition: c.key(name), reason: verdict.reason });
        await c.o.events?.record(
          p,
          "Normal",
          "OrphanCollected",
          "Delete",
          `deleted: ${verdict.reason} and no PersistentVolume was ever created for it`,
        );
        return true;
      });
      if (gone) deleted.push(name);
    } catch (err) {
      c.log.warn("orphan check skipped", { partition: c.key(name), err: errorMessage(err) });
    }
  }
  return deleted;
}

/** The claim as the API server has it now; throws (skipping the partition) on anything but 404. */
async function claimState(core: k8s.CoreV1Api, namespace: string, name: string): Promise<ClaimState> {
  try {
    const claim = await core.readNamespacedPersistentVolumeClaim({ name, namespace });
    return { exists: true, uid: claim.metadata?.uid ?? "", deleting: !!claim.metadata?.deletionTimestamp };
  } catch (err) {
    const e = kubeError(err, `get PersistentVolumeClaim ${namespace}/${name}`);
    if (e.kind === "not-found") return { exists: false };
    throw e;
  }
}
