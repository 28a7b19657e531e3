// decideGrants on plain objects: grants within the cap, oldest request first; the rest queued with
// the reason; a slot whose copy, volume or serving node is gone or moved is released, never kept.
import { describe, expect, test } from "bun:test";
import type { NVMePartition, RebuildSlot, ReplicaStatus } from "../../api/index.ts";
import { Inventory } from "../inventory.ts";
import { partition, storageNode, T0 } from "../testdata/fixtures.ts";
import {
  decideGrants,
  type GrantAction,
  grantedSlot,
  queuedMessage,
  sameRequest,
  slotProblem,
} from "./rebuild-grants.ts";

const NS = "ns";
const NOW = T0 + 3_600_000;
const at = (s: number) => new Date(T0 + s * 1000).toISOString();

interface Vol {
  name: string;
  /** Seconds after T0 the request was made; undefined: no slot. */
  asked?: number;
  granted?: boolean;
  message?: string;
  /** The copy's state (default Stale at generation 1 of 2). */
  state?: ReplicaStatus["state"];
  generation?: number;
  serving?: string;
  askedBy?: string;
  deleting?: boolean;
  /** The replica partition: present (default), absent, or being deleted. */
  copy?: "present" | "absent" | "deleting";
  /** The slot names another copy UID than the entry's. */
  strangerUid?: boolean;
}

function build(vols: Vol[]) {
  const volumes: NVMePartition[] = [];
  const copies = new Map<string, NVMePartition[]>();
  for (const o of vols) {
    const v = partition(NS, o.name, { uid: `uid-${o.name}` });
    v.spec.replicas = 2;
    v.spec.nodeName = o.serving ?? "a";
    if (o.deleting) v.metadata.deletionTimestamp = at(1);
    const entries: ReplicaStatus[] = [
      { name: `${o.name}-r0`, uid: `uid-${o.name}-r0`, nodeName: "a", state: "Online", generation: 2 },
      {
        name: `${o.name}-r1`,
        uid: `uid-${o.name}-r1`,
        nodeName: "b",
        state: o.state ?? "Stale",
        generation: o.generation ?? 1,
      },
    ];
    const slot: RebuildSlot | undefined =
      o.asked === undefined
        ? undefined
        : {
            replica: `${o.name}-r1`,
            uid: o.strangerUid ? "uid-other" : `uid-${o.name}-r1`,
            node: o.askedBy ?? "a",
            requestedAt: at(o.asked),
            ...(o.granted ? { grantedAt: at(o.asked + 1) } : {}),
            ...(o.message ? { message: o.message } : {}),
          };
    v.status = {
      state: "Exported",
      dataGeneration: 2,
      replicas: entries,
      ...(slot ? { rebuildSlot: slot } : {}),
      conditions: [],
    };
    volumes.push(v);
    const c = partition(NS, `${o.name}-r1`, { uid: `uid-${o.name}-r1` });
    if (o.copy === "deleting") c.metadata.deletionTimestamp = at(1);
    copies.set(`uid-${o.name}`, o.copy === "absent" ? [] : [c]);
  }
  return { volumes, copies };
}

function view(lostNodes: string[] = []) {
  const inv = new Inventory();
  for (const n of ["a", "b", "c"])
    inv.setNode(storageNode(n, { heartbeat: NOW - (lostNodes.includes(n) ? 600_000 : 1000) }));
  return inv;
}

/** Each action as "kind volume[: detail]". */
function run(vols: Vol[], cap: number, lost: string[] = [], pending?: Map<string, string>) {
  const { volumes, copies } = build(vols);
  const d = decideGrants({
    volumes,
    copiesOf: (uid) => copies.get(uid) ?? [],
    view: view(lost),
    nowMs: NOW,
    cap,
    ...(pending ? { pending } : {}),
  });
  const show = (a: GrantAction) =>
    a.kind === "grant"
      ? `grant ${a.key}`
      : a.kind === "queue"
        ? `queue ${a.key}: ${a.message}`
        : `release ${a.key}: ${a.why}`;
  return { actions: d.actions.map(show), granted: d.granted, queued: d.queued };
}

describe("decideGrants", () => {
  const cases: {
    name: string;
    vols: Vol[];
    cap: number;
    lost?: string[];
    pending?: [string, number][];
    actions: string[];
    granted: number;
    queued: number;
  }[] = [
    { name: "nothing asked", vols: [{ name: "v1" }], cap: 4, actions: [], granted: 0, queued: 0 },
    {
      name: "one request under the cap is granted",
      vols: [{ name: "v1", asked: 10 }],
      cap: 4,
      actions: ["grant ns/v1"],
      granted: 1,
      queued: 0,
    },
    {
      name: "cap 1: the oldest request wins, whatever the order the volumes come in",
      vols: [
        { name: "v1", asked: 30 },
        { name: "v2", asked: 10 },
        { name: "v3", asked: 20 },
      ],
      cap: 1,
      actions: [
        "grant ns/v2",
        "queue ns/v3: cluster rebuild cap 1 reached",
        "queue ns/v1: cluster rebuild cap 1 reached",
      ],
      granted: 1,
      queued: 2,
    },
    {
      name: "same request time: the volume key breaks the tie",
      vols: [
        { name: "vb", asked: 10 },
        { name: "va", asked: 10 },
      ],
      cap: 1,
      actions: ["grant ns/va", "queue ns/vb: cluster rebuild cap 1 reached"],
      granted: 1,
      queued: 1,
    },
    {
      name: "a held grant keeps its slot: a newer request waits, an older one too",
      vols: [
        { name: "v1", asked: 50, granted: true },
        { name: "v2", asked: 10 },
      ],
      cap: 1,
      actions: ["queue ns/v2: cluster rebuild cap 1 reached"],
      granted: 1,
      queued: 1,
    },
    {
      name: "a queued request already told why is not written again",
      vols: [
        { name: "v1", asked: 5, granted: true },
        { name: "v2", asked: 10, message: "cluster rebuild cap 1 reached" },
      ],
      cap: 1,
      actions: [],
      granted: 1,
      queued: 1,
    },
    {
      name: "the grant freed by a finished rebuild goes to the next oldest",
      vols: [
        { name: "v1", asked: 5, granted: true, state: "Online", generation: 2 },
        { name: "v2", asked: 20, message: "cluster rebuild cap 1 reached" },
        { name: "v3", asked: 10, message: "cluster rebuild cap 1 reached" },
      ],
      cap: 1,
      actions: ["release ns/v1: copy v1-r1 is Online at generation 2: nothing to rebuild", "grant ns/v3"],
      granted: 1,
      queued: 1,
    },
    {
      name: "cap 0: nothing is granted, and the reason says so",
      vols: [{ name: "v1", asked: 10 }],
      cap: 0,
      actions: ["queue ns/v1: cluster rebuild cap 0: no rebuild starts (DISTORT_REBUILDS_PER_CLUSTER)"],
      granted: 0,
      queued: 1,
    },
    {
      name: "a cap lowered below the running grants: they keep them, nothing new is granted",
      vols: [
        { name: "v1", asked: 1, granted: true, state: "Rebuilding" },
        { name: "v2", asked: 2, granted: true, state: "Rebuilding" },
        { name: "v3", asked: 3 },
      ],
      cap: 1,
      actions: ["queue ns/v3: cluster rebuild cap 1 reached"],
      granted: 2,
      queued: 1,
    },
    {
      name: "a grant written but not yet in the cache counts as granted",
      vols: [
        { name: "v1", asked: 1 },
        { name: "v2", asked: 2 },
      ],
      cap: 1,
      pending: [["uid-v1", 1]],
      actions: ["queue ns/v2: cluster rebuild cap 1 reached"],
      granted: 1,
      queued: 1,
    },
    {
      name: "a pending grant for an older request of the volume does not count",
      vols: [{ name: "v1", asked: 7 }],
      cap: 1,
      pending: [["uid-v1", 1]],
      actions: ["grant ns/v1"],
      granted: 1,
      queued: 0,
    },
    {
      name: "volume being deleted: released",
      vols: [{ name: "v1", asked: 1, granted: true, deleting: true }],
      cap: 1,
      actions: ["release ns/v1: the volume is being deleted"],
      granted: 0,
      queued: 0,
    },
    {
      name: "failed over: the old serving node's slot is released, a new one can be granted",
      vols: [
        { name: "v1", asked: 1, granted: true, serving: "b", askedBy: "a" },
        { name: "v2", asked: 5 },
      ],
      cap: 1,
      actions: ["release ns/v1: asked by a, but b serves the volume now", "grant ns/v2"],
      granted: 1,
      queued: 0,
    },
    {
      name: "serving node lost (no heartbeat past the failover bound): released",
      vols: [{ name: "v1", asked: 1, granted: true, state: "Rebuilding" }],
      cap: 1,
      lost: ["a"],
      actions: ["release ns/v1: serving node a is lost (no heartbeat)"],
      granted: 0,
      queued: 0,
    },
    {
      name: "replica partition deleted: released",
      vols: [{ name: "v1", asked: 1, granted: true, copy: "absent" }],
      cap: 1,
      actions: ["release ns/v1: replica partition v1-r1 is gone"],
      granted: 0,
      queued: 0,
    },
    {
      name: "replica partition being deleted: released",
      vols: [{ name: "v1", asked: 1, copy: "deleting" }],
      cap: 1,
      actions: ["release ns/v1: replica partition v1-r1 is being deleted"],
      granted: 0,
      queued: 0,
    },
    {
      name: "the copy left the volume's status: released",
      vols: [{ name: "v1", asked: 1, granted: true, strangerUid: true }],
      cap: 1,
      actions: ["release ns/v1: copy v1-r1 is no longer one of the volume's copies"],
      granted: 0,
      queued: 0,
    },
    {
      name: "a Rebuilding copy under its grant is kept; Faulted copies may ask too",
      vols: [
        { name: "v1", asked: 1, granted: true, state: "Rebuilding" },
        { name: "v2", asked: 2, state: "Faulted" },
      ],
      cap: 2,
      actions: ["grant ns/v2"],
      granted: 2,
      queued: 0,
    },
    {
      name: "a copy lowered at the current generation is not one a rebuild can start on",
      vols: [{ name: "v1", asked: 1, state: "Stale", generation: 2 }],
      cap: 1,
      actions: ["release ns/v1: copy v1-r1 is Stale at generation 2: nothing to rebuild"],
      granted: 0,
      queued: 0,
    },
  ];
  for (const c of cases)
    test(c.name, () => {
      const pending = c.pending ? new Map(c.pending.map(([u, s]) => [u, at(s)])) : undefined;
      expect(run(c.vols, c.cap, c.lost, pending)).toEqual({
        actions: c.actions,
        granted: c.granted,
        queued: c.queued,
      });
    });
});

describe("slot helpers", () => {
  test("a grant stamps grantedAt and drops the queue message; the request stays the same request", () => {
    const s: RebuildSlot = { replica: "r", uid: "u", node: "a", requestedAt: at(1), message: "m" };
    const g = grantedSlot(s, new Date(NOW));
    expect(g).toEqual({
      replica: "r",
      uid: "u",
      node: "a",
      requestedAt: at(1),
      grantedAt: new Date(NOW).toISOString(),
    });
    expect(sameRequest(s, g)).toBe(true);
    expect(sameRequest(s, { ...s, requestedAt: at(2) })).toBe(false);
    expect(sameRequest(s, { ...s, node: "b" })).toBe(false);
    expect(sameRequest(s, undefined)).toBe(false);
  });
  test("the queue message is stable for a cap", () => {
    expect(queuedMessage(4)).toBe("cluster rebuild cap 4 reached");
    expect(queuedMessage(4)).toBe(queuedMessage(4));
  });
  test("a volume nobody serves voids its slot", () => {
    const { volumes, copies } = build([{ name: "v1", asked: 1 }]);
    const v = volumes[0] as NVMePartition;
    delete v.spec.nodeName;
    expect(
      slotProblem(v, v.status?.rebuildSlot as RebuildSlot, copies.get("uid-v1") ?? [], view(), NOW),
    ).toBe("asked by a, but no node serves the volume now");
  });
});
