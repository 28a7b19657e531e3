// What the agent keeps of each kind it caches: the fields its controllers read, nothing more.
import { describe, expect, test } from "bun:test";
import {
  exampleNVMeDevice,
  exampleNVMePartition,
  exampleNVMeSnapshot,
  exampleNVMeVolumeAttachment,
  exampleRDMAStorageNode,
} from "../api/examples.ts";
import { kinds } from "../api/index.ts";
import type { KubeObject, ResourceKind } from "../lib/kube/resource.ts";
import { agentTransform, inReleaseNamespace, onNode } from "./caches.ts";

const shape = (kind: ResourceKind, obj: KubeObject) => agentTransform(kind, structuredClone(obj));

describe("agentTransform", () => {
  test("partitions lose annotations and every condition but Ready, keep what the controllers read", () => {
    const p = exampleNVMePartition();
    p.metadata.annotations = { "storage.distort.io/request": "{}" };
    p.metadata.finalizers = ["storage.distort.io/partition"];
    const ready = p.status?.conditions?.[0];
    p.status?.conditions?.push({
      type: "Placed",
      status: "True",
      lastTransitionTime: "2026-12-01T00:00:00Z",
      reason: "Placed",
      message: "",
    });
    const out = shape(kinds.NVMePartition as ResourceKind, p) as typeof p;
    expect(out.metadata.annotations).toBeUndefined();
    expect(out.status?.conditions).toEqual([ready as NonNullable<typeof ready>]);
    const noReady = structuredClone(p);
    if (noReady.status)
      noReady.status.conditions = noReady.status.conditions?.filter((c) => c.type !== "Ready");
    const none = shape(kinds.NVMePartition as ResourceKind, noReady) as typeof p;
    expect(none.status && "conditions" in none.status).toBe(false);
    expect(out.metadata).toMatchObject({
      name: p.metadata.name,
      uid: p.metadata.uid,
      finalizers: p.metadata.finalizers,
    });
    expect(out.spec).toEqual(p.spec);
    const { conditions: _c, ...rest } = p.status ?? {};
    const { conditions: _o, ...outRest } = out.status ?? {};
    expect(outRest).toEqual(rest);
  });

  test("attachments and snapshots lose only their conditions; attachment metadata stays whole", () => {
    const a = exampleNVMeVolumeAttachment();
    a.metadata.annotations = { keep: "me" };
    a.status = { ...(a.status ?? {}), conditions: [] } as typeof a.status;
    const out = shape(kinds.NVMeVolumeAttachment as ResourceKind, a) as typeof a;
    expect(out.metadata).toEqual(a.metadata);
    expect(out.spec).toEqual(a.spec);
    expect(out.status && "conditions" in out.status).toBe(false);
    const s = exampleNVMeSnapshot();
    const so = shape(kinds.NVMeSnapshot as ResourceKind, s) as typeof s;
    expect(so.status && "conditions" in so.status).toBe(false);
    expect(so.spec).toEqual(s.spec);
  });

  test("devices and other kinds pass unchanged (the reporter builds on the cached device status)", () => {
    for (const [kind, obj] of [
      [kinds.NVMeDevice, exampleNVMeDevice()],
      [kinds.RDMAStorageNode, exampleRDMAStorageNode()],
    ] as const) {
      expect(shape(kind as ResourceKind, obj)).toEqual(obj);
    }
  });
});

test("onNode selects by spec.nodeName, and by namespace when given one", () => {
  expect(onNode("node-a")).toEqual({ fieldSelector: "spec.nodeName=node-a" });
  expect(onNode("node-a", "distort-system")).toEqual({
    namespace: "distort-system",
    fieldSelector: "spec.nodeName=node-a",
  });
  expect(inReleaseNamespace("distort-system")).toEqual({ namespace: "distort-system" });
});
