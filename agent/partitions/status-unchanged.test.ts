// A pass's status write decided on the cached partition: skipped only when the cached object
// (conditions other than Ready dropped, as agentTransform caches it) already holds that status.
import { describe, expect, test } from "bun:test";
import { exampleNVMePartition } from "../../api/examples.ts";
import { kinds, type NVMePartition } from "../../api/index.ts";
import type { ResourceKind } from "../../lib/kube/resource.ts";
import { agentTransform } from "../caches.ts";
import { cachedStatusHolds, partitionStatusWrite } from "./status-unchanged.ts";

const NOW = new Date("2026-12-02T12:00:00Z");
const READY = { type: "Ready", status: "True" as const, reason: "Exported", message: "listening on rdma" };

/** The stored partition: Exported, Ready=True written by an agent, plus another writer's condition. */
function stored(): NVMePartition {
  const p = exampleNVMePartition();
  p.metadata.generation = 1;
  const conds = p.status?.conditions ?? [];
  conds[0] = { ...conds[0], ...READY, observedGeneration: 1 } as (typeof conds)[number];
  conds.unshift({
    type: "Placed",
    status: "True",
    lastTransitionTime: "2026-12-01T00:00:00Z",
    reason: "Placed",
    message: "by the manager",
  });
  return p;
}

const cached = (p: NVMePartition) =>
  agentTransform(kinds.NVMePartition as ResourceKind, structuredClone(p)) as NVMePartition;

/** The controller's exported-status write, for the export at `portalIP`. */
const exportedWrite = (p: NVMePartition, portalIP: string, message = READY.message) =>
  partitionStatusWrite(
    p.metadata.uid,
    (s) => {
      s.state = "Exported";
      s.portalIP = portalIP;
    },
    { ...READY, message },
    NOW,
  );

describe("cachedStatusHolds", () => {
  test("the cache keeps Ready and drops the other conditions", () => {
    expect(cached(stored()).status?.conditions?.map((c) => c.type)).toEqual(["Ready"]);
  });

  test("a write asking for what the stored object says needs no read", () => {
    const p = stored();
    const c = cached(p);
    expect(cachedStatusHolds(c, exportedWrite(c, p.status?.portalIP as string))).toBe(true);
    // The same write on the stored object is a no-op too: the skip decides as the read would.
    const full = exportedWrite(p, p.status?.portalIP as string)(p);
    expect(full).toEqual(p.status as NonNullable<NVMePartition["status"]>);
  });

  test("a changed field, a changed Ready message or a new generation is not skipped", () => {
    const p = stored();
    const c = cached(p);
    expect(cachedStatusHolds(c, exportedWrite(c, "10.9.9.9"))).toBe(false);
    expect(cachedStatusHolds(c, exportedWrite(c, p.status?.portalIP as string, "listening on tcp"))).toBe(
      false,
    );
    const newer = { ...c, metadata: { ...c.metadata, generation: 2 } };
    expect(cachedStatusHolds(newer, exportedWrite(newer, p.status?.portalIP as string))).toBe(false);
  });

  test("a cached object without Ready, without status, or of another UID is not skipped", () => {
    const p = stored();
    const noReady = cached(p);
    if (noReady.status) Reflect.deleteProperty(noReady.status, "conditions");
    expect(cachedStatusHolds(noReady, exportedWrite(noReady, p.status?.portalIP as string))).toBe(false);
    const noStatus = cached(p);
    Reflect.deleteProperty(noStatus, "status");
    expect(cachedStatusHolds(noStatus, exportedWrite(noStatus, "192.168.100.10"))).toBe(false);
    const c = cached(p);
    const other = partitionStatusWrite("another-uid", (s) => void s, READY, NOW);
    expect(cachedStatusHolds(c, other)).toBe(false);
  });
});
