// The kind registry: names follow Kubernetes conventions, the whole-object schema is assembled from the
// spec/status schemas it lists, and the inferred types line up (checked by tsc).
import { describe, expect, test } from "bun:test";
import * as v from "valibot";
import * as api from "./index.ts";
import { type KindDef, type KindObject, kinds } from "./kinds.ts";

// Compile-time: the registry's schema infers the exported type, and parse() returns it.
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
const typeChecks: [
  Equal<KindObject<"NVMePartition">, api.NVMePartition>,
  Equal<KindObject<"NVMeDevice">, api.NVMeDevice>,
  Equal<KindObject<"NVMeDeviceClaim">, api.NVMeDeviceClaim>,
  Equal<KindObject<"NVMeVolumeAttachment">, api.NVMeVolumeAttachment>,
  Equal<KindObject<"NVMeSnapshot">, api.NVMeSnapshot>,
  Equal<KindObject<"RDMAStorageNode">, api.RDMAStorageNode>,
  Equal<api.NVMePartition["spec"]["backend"], "spdk" | "kernel">,
  Equal<NonNullable<api.NVMePartition["status"]>["conditions"], api.Condition[]>,
] = [true, true, true, true, true, true, true, true];

const examples = {
  NVMeDevice: api.exampleNVMeDevice,
  NVMeDeviceClaim: api.exampleNVMeDeviceClaim,
  NVMePartition: api.exampleNVMePartition,
  NVMeSnapshot: api.exampleNVMeSnapshot,
  NVMeVolumeAttachment: api.exampleNVMeVolumeAttachment,
  RDMAStorageNode: api.exampleRDMAStorageNode,
} as const;

describe("kinds", () => {
  test("type-level checks compiled", () => expect(typeChecks.every(Boolean)).toBe(true));

  test("six kinds keyed by kind name, group and version shared", () => {
    expect(Object.keys(kinds).sort()).toEqual(Object.keys(examples).sort());
    expect(api.GROUP).toBe("storage.distort.io");
    expect(api.VERSION).toBe("v1alpha1");
    for (const [key, def] of Object.entries(kinds) as [string, KindDef][]) {
      expect(def.kind).toBe(key);
      expect(def.apiVersion).toBe("storage.distort.io/v1alpha1");
      expect(def.plural).toBe(`${key.toLowerCase()}s`);
      expect(def.singular).toBe(key.toLowerCase());
      expect(def.listKind).toBe(`${key}List`);
      expect(def.categories).toEqual(["distort"]);
      expect(Object.isFrozen(def)).toBe(true);
    }
    expect(kinds.NVMeDevice.scope).toBe("Cluster");
    expect(kinds.NVMePartition.shortNames).toEqual(["nvmepart"]);
  });

  test.each(Object.keys(examples) as (keyof typeof examples)[])("%s example parses and round-trips", (k) => {
    const obj = examples[k]();
    const def = kinds[k] as KindDef;
    expect(v.parse(def.schema, obj)).toEqual(obj);
    expect(v.parse(def.specSchema, obj.spec)).toEqual(obj.spec);
    expect(v.parse(def.statusSchema, obj.status)).toEqual(obj.status);
  });
});
