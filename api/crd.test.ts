// The valibot -> OpenAPI converter (each supported construct, each refusal) and the invariants every
// generated CRD must keep: structural, bounded for CEL cost, rules present, columns and selectors resolvable.
import { describe, expect, test } from "bun:test";
import * as v from "valibot";
import YAML from "yaml";
import { cel, openapi } from "./common.ts";
import {
  buildCrd,
  crdFileName,
  GENERATED_HEADER,
  type JSONSchemaProps,
  renderCrds,
  toOpenApi,
} from "./crd.ts";
import { type KindDef, kinds } from "./kinds.ts";

const allKinds = Object.values(kinds) as KindDef[];

describe("toOpenApi: supported constructs", () => {
  const cases: { name: string; schema: v.GenericSchema; want: JSONSchemaProps }[] = [
    {
      name: "bounded string with pattern and description",
      schema: v.pipe(v.string(), v.minLength(1), v.maxLength(8), v.regex(/^a\/b$/), v.description("d")),
      want: { description: "d", type: "string", minLength: 1, maxLength: 8, pattern: "^a/b$" },
    },
    { name: "minLength 0 is dropped", schema: v.pipe(v.string(), v.minLength(0)), want: { type: "string" } },
    {
      name: "integer with bounds",
      schema: v.pipe(v.number(), v.integer(), v.minValue(-1), v.maxValue(9)),
      want: { type: "integer", minimum: -1, maximum: 9 },
    },
    {
      name: "exclusive bounds",
      schema: v.pipe(v.number(), v.gtValue(0), v.ltValue(1)),
      want: { type: "number", minimum: 0, exclusiveMinimum: true, maximum: 1, exclusiveMaximum: true },
    },
    { name: "boolean", schema: v.boolean(), want: { type: "boolean" } },
    { name: "picklist", schema: v.picklist(["a", "b"]), want: { type: "string", enum: ["a", "b"] } },
    { name: "string literal", schema: v.literal("x"), want: { type: "string", enum: ["x"] } },
    {
      name: "timestamp",
      schema: v.pipe(v.string(), v.isoTimestamp()),
      want: { type: "string", format: "date-time" },
    },
    {
      name: "array with maxItems and list type",
      schema: v.pipe(
        v.array(v.string()),
        v.nonEmpty(),
        v.maxLength(4),
        openapi({ "x-kubernetes-list-type": "set" }),
      ),
      want: {
        type: "array",
        minItems: 1,
        maxItems: 4,
        items: { type: "string" },
        "x-kubernetes-list-type": "set",
      },
    },
    {
      name: "record",
      schema: v.pipe(v.record(v.string(), v.number()), v.maxEntries(3)),
      want: { type: "object", maxProperties: 3, additionalProperties: { type: "number" } },
    },
    {
      name: "object: required, optional, defaults (static and function)",
      schema: v.strictObject({
        a: v.string(),
        b: v.optional(v.string()),
        c: v.optional(v.picklist(["x", "y"]), "y"),
        d: v.optional(v.array(v.string()), () => []),
      }),
      want: {
        type: "object",
        properties: {
          a: { type: "string" },
          b: { type: "string" },
          c: { type: "string", enum: ["x", "y"], default: "y" },
          d: { type: "array", default: [], items: { type: "string" } },
        },
        required: ["a"],
      },
    },
    {
      name: "loose object preserves unknown fields explicitly",
      schema: v.looseObject({ a: v.optional(v.string()) }),
      want: {
        type: "object",
        properties: { a: { type: "string" } },
        "x-kubernetes-preserve-unknown-fields": true,
      },
    },
    {
      name: "CEL rules accumulate in order; a TS check followed by its twin",
      schema: v.pipe(
        v.object({ a: v.optional(v.string()) }),
        cel("has(self.a)", "x.a is required"),
        v.check((o) => o.a !== "", "x.a non-empty"),
        cel("!has(self.a) || self.a != ''", "x.a must not be empty", {
          fieldPath: ".a",
          reason: "FieldValueInvalid",
        }),
      ),
      want: {
        type: "object",
        properties: { a: { type: "string" } },
        "x-kubernetes-validations": [
          { rule: "has(self.a)", message: "x.a is required" },
          {
            rule: "!has(self.a) || self.a != ''",
            message: "x.a must not be empty",
            fieldPath: ".a",
            reason: "FieldValueInvalid",
          },
        ],
      },
    },
    {
      name: "a run of TS checks shares one twin",
      schema: v.pipe(
        v.string(),
        v.maxLength(45),
        v.ip(),
        v.check((s) => !s.includes("%")),
        cel("isIP(self)", "x must be an IP"),
      ),
      want: {
        type: "string",
        maxLength: 45,
        "x-kubernetes-validations": [{ rule: "isIP(self)", message: "x must be an IP" }],
      },
    },
    {
      name: "description on an optional entry overrides the inner one",
      schema: v.object({
        a: v.pipe(v.optional(v.pipe(v.string(), v.description("inner"))), v.description("outer")),
      }),
      want: { type: "object", properties: { a: { description: "outer", type: "string" } } },
    },
  ];
  test.each(cases)("$name", ({ schema, want }) => {
    expect(toOpenApi(schema)).toEqual(want);
  });
});

describe("toOpenApi: refuses what the apiserver cannot enforce", () => {
  const cases: { name: string; schema: v.GenericSchema; error: RegExp }[] = [
    { name: "union", schema: v.union([v.string(), v.number()]), error: /\$: valibot schema "union"/ },
    { name: "variant", schema: v.variant("k", [v.object({ k: v.literal("a") })]), error: /"variant"/ },
    {
      name: "nullable",
      schema: v.object({ a: v.nullable(v.string()) }),
      error: /\$\.a: nullable is not allowed/,
    },
    { name: "nullish", schema: v.object({ a: v.nullish(v.string()) }), error: /nullish is not allowed/ },
    { name: "unknown", schema: v.unknown(), error: /"unknown"/ },
    { name: "tuple", schema: v.tuple([v.string()]), error: /"tuple"/ },
    { name: "date", schema: v.date(), error: /"date"/ },
    { name: "number literal", schema: v.literal(1), error: /only string literals/ },
    {
      name: "transform",
      schema: v.pipe(
        v.string(),
        v.transform((s) => s.length),
      ),
      error: /transformation "transform"/,
    },
    {
      name: "check without CEL twin",
      schema: v.pipe(
        v.string(),
        v.check((s) => s !== "x"),
      ),
      error: /follow it with cel/,
    },
    {
      name: "check whose twin is not adjacent",
      schema: v.pipe(
        v.string(),
        v.check((s) => s !== "x"),
        v.description("d"),
        cel("self != 'x'", "x"),
      ),
      error: /"check" has no OpenAPI equivalent/,
    },
    { name: "email without twin", schema: v.pipe(v.string(), v.email()), error: /"email"/ },
    { name: "regex with flags", schema: v.pipe(v.string(), v.regex(/a/i)), error: /regex flags "i"/ },
    { name: "regex lookahead", schema: v.pipe(v.string(), v.regex(/^(?=a)a$/)), error: /lookaround/ },
    { name: "regex backreference", schema: v.pipe(v.string(), v.regex(/(a)\1/)), error: /backreferences/ },
    {
      name: "length action on a number",
      schema: v.pipe(v.number(), v.maxLength(3) as never),
      error: /"max_length" not supported on type number/,
    },
    {
      name: "record with validated keys",
      schema: v.record(v.pipe(v.string(), v.maxLength(3)), v.string()),
      error: /record keys/,
    },
    {
      name: "optional outside an object",
      schema: v.array(v.optional(v.string())),
      error: /\$\[\]: optional is only meaningful/,
    },
    {
      name: "default that fails its own schema",
      schema: v.object({ a: v.optional(v.pipe(v.string(), v.minLength(2)), "x") }),
      error: /\$\.a: default "x" does not satisfy/,
    },
    {
      name: "unknown metadata key",
      schema: v.pipe(v.string(), v.metadata({ foo: 1 })),
      error: /unknown metadata key "foo"/,
    },
    {
      name: "openapi() shadowing a real keyword",
      schema: v.pipe(v.string(), openapi({ pattern: "x" })),
      error: /may not set "pattern"/,
    },
    { name: "title", schema: v.pipe(v.string(), v.title("t")), error: /metadata action "title"/ },
  ];
  test.each(cases)("$name", ({ schema, error }) => {
    expect(() => toOpenApi(schema)).toThrow(error);
  });
  test("pipes that change type in the middle are refused", () => {
    expect(() => toOpenApi(v.pipe(v.string(), v.transform(Number), v.number()))).toThrow(
      /transformation|schema "number"/,
    );
  });
});

// Every node reachable from root, with its JSON path for messages.
function* walk(node: JSONSchemaProps, path: string): Generator<[string, JSONSchemaProps]> {
  yield [path, node];
  for (const [k, child] of Object.entries(node.properties ?? {})) yield* walk(child, `${path}.${k}`);
  if (node.items) yield* walk(node.items, `${path}[]`);
  if (node.additionalProperties) yield* walk(node.additionalProperties, `${path}{}`);
}

function rootSchema(def: KindDef): JSONSchemaProps {
  const crd = buildCrd(def) as { spec: { versions: { schema: { openAPIV3Schema: JSONSchemaProps } }[] } };
  return crd.spec.versions[0]!.schema.openAPIV3Schema;
}

function version(def: KindDef): Record<string, unknown> {
  return (buildCrd(def) as { spec: { versions: Record<string, unknown>[] } }).spec.versions[0]!;
}

/** Schema node at a dotted JSONPath like .spec.nodeName; [?(...)] filters and [n] descend into items. */
function resolve(root: JSONSchemaProps, jsonPath: string): JSONSchemaProps | undefined {
  let node: JSONSchemaProps | undefined = root;
  const tokens = jsonPath
    .replace(/\[[^\]]*\]/g, ".[]")
    .split(".")
    .filter(Boolean);
  for (const t of tokens) {
    if (!node) return undefined;
    node = t === "[]" ? node.items : node.properties?.[t];
  }
  return node;
}

describe.each(allKinds.map((d) => [d.kind, d] as const))("CRD %s", (_kind, def) => {
  const root = rootSchema(def);

  test("is structural: every node has a type (or an explicit escape hatch)", () => {
    const untyped = [...walk(root, "")]
      .filter(
        ([, n]) => !n.type && !n["x-kubernetes-int-or-string"] && !n["x-kubernetes-preserve-unknown-fields"],
      )
      .map(([p]) => p);
    expect(untyped).toEqual([]);
    expect(root.properties?.metadata).toEqual({ type: "object" });
  });

  test("every string and list is bounded (keeps CEL cost estimates finite)", () => {
    const unbounded = [...walk(root, "")]
      .filter(([p]) => p.startsWith(".spec") || p.startsWith(".status"))
      .filter(
        ([, n]) =>
          (n.type === "string" && !n.enum && n.maxLength === undefined) ||
          (n.type === "array" && n.maxItems === undefined),
      )
      .map(([p]) => p);
    expect(unbounded).toEqual([]);
  });

  test("every CEL message names an existing field, and fieldPath resolves", () => {
    for (const [path, node] of walk(root, "")) {
      for (const rule of node["x-kubernetes-validations"] ?? []) {
        const named = rule.message.split(" ")[0]!;
        expect(resolve(root, `.${named}`), `${path}: "${rule.message}"`).toBeDefined();
        if (rule.fieldPath) expect(resolve(node, rule.fieldPath), `${path}: ${rule.fieldPath}`).toBeDefined();
      }
    }
  });

  test("names, scope, status subresource, categories", () => {
    const crd = buildCrd(def) as { metadata: { name: string }; spec: Record<string, unknown> };
    expect(crd.metadata.name).toBe(`${def.plural}.storage.distort.io`);
    expect(crd.spec.scope).toBe(def.scope);
    expect(crd.spec.names).toMatchObject({
      kind: def.kind,
      listKind: `${def.kind}List`,
      categories: ["distort"],
    });
    expect((crd.spec.names as { shortNames: string[] }).shortNames.length).toBeGreaterThan(0);
    const ver = version(def);
    expect(ver).toMatchObject({
      name: "v1alpha1",
      served: true,
      storage: true,
      subresources: { status: {} },
    });
    expect(crdFileName(def)).toBe(`storage.distort.io_${def.plural}.yaml`);
  });

  test("printer column JSONPaths point at fields of the right type", () => {
    const kinds: Record<string, string[]> = {
      string: ["string"],
      integer: ["integer"],
      number: ["number", "integer"],
      boolean: ["boolean"],
      date: ["string"],
    };
    for (const col of def.printerColumns) {
      if (col.jsonPath === ".metadata.creationTimestamp") continue;
      const node = resolve(root, col.jsonPath);
      expect(node, `${col.name} ${col.jsonPath}`).toBeDefined();
      expect(kinds[col.type], `${col.name} ${col.jsonPath}`).toContain(node!.type!);
      if (col.type === "date") expect(node!.format).toBe("date-time");
    }
    expect(def.printerColumns.at(-1)).toEqual({
      name: "Age",
      type: "date",
      jsonPath: ".metadata.creationTimestamp",
    });
  });

  test("selectable fields are scalar fields (apiserver requirement, at most 8)", () => {
    expect(def.selectableFields.length).toBeLessThanOrEqual(8);
    for (const f of def.selectableFields) {
      expect(["string", "integer", "boolean"]).toContain(resolve(root, f)?.type ?? "missing");
    }
  });
});

describe("CEL rules required by the design", () => {
  // [kind, schema node path, rule, message]
  const required: [string, string, string, string][] = [
    ["NVMeDevice", ".spec.nodeName", "self == oldSelf", "spec.nodeName is immutable"],
    ["NVMeDevice", ".spec.serial", "self == oldSelf", "spec.serial is immutable"],
    [
      "NVMeDevice",
      ".status",
      "self.phase != 'Claimed' || has(self.claimRef)",
      "status.claimRef is required when status.phase is Claimed",
    ],
    [
      "NVMeDevice",
      ".spec",
      "!(has(self.drain) && self.drain && has(self.unschedulable) && !self.unschedulable)",
      "spec.unschedulable must not be false while spec.drain is true (a drain implies cordon): remove spec.unschedulable or set it true",
    ],
    [
      "RDMAStorageNode",
      ".spec",
      "!(has(self.drain) && self.drain && has(self.unschedulable) && !self.unschedulable)",
      "spec.unschedulable must not be false while spec.drain is true (a drain implies cordon): remove spec.unschedulable or set it true",
    ],
    ["NVMeDeviceClaim", ".spec.serial", "self == oldSelf", "spec.serial is immutable"],
    ["NVMePartition", ".spec.sizeBytes", "self >= oldSelf", "spec.sizeBytes may not shrink"],
    ["NVMePartition", ".spec.backend", "self == oldSelf", "spec.backend is immutable"],
    ["NVMePartition", ".spec.volumeManager", "self == oldSelf", "spec.volumeManager is immutable"],
    [
      "NVMePartition",
      ".spec",
      "(has(self.replicas) && self.replicas > 1) || !has(oldSelf.nodeName) || (has(self.nodeName) && self.nodeName == oldSelf.nodeName)",
      "spec.nodeName is immutable once set",
    ],
    [
      "NVMePartition",
      ".spec",
      "!has(oldSelf.deviceSerial) || (has(self.deviceSerial) && self.deviceSerial == oldSelf.deviceSerial)",
      "spec.deviceSerial is immutable once set",
    ],
    [
      "NVMePartition",
      ".spec",
      "(has(self.replicas) && self.replicas > 1) || has(self.nodeName) == has(self.deviceSerial)",
      "spec.nodeName and spec.deviceSerial must be set together",
    ],
    [
      "NVMePartition",
      ".spec",
      "self.volumeManager != 'spdk-lvol' || self.backend == 'spdk'",
      "spec.volumeManager spdk-lvol requires spec.backend spdk",
    ],
    [
      "NVMePartition",
      ".spec",
      "self.volumeManager != 'parted' || self.backend == 'kernel'",
      "spec.volumeManager parted requires spec.backend kernel",
    ],
    [
      "NVMePartition",
      ".spec",
      "!has(self.targetOptions) || !has(self.targetOptions.coreMask) || self.backend == 'spdk'",
      "spec.targetOptions.coreMask requires spec.backend spdk",
    ],
    [
      "NVMePartition",
      ".spec",
      "has(self.targetOptions) == has(oldSelf.targetOptions) && (!has(self.targetOptions) || self.targetOptions == oldSelf.targetOptions)",
      "spec.targetOptions is immutable",
    ],
    [
      "NVMePartition",
      ".status",
      "!has(oldSelf.externalId) || (has(self.externalId) && self.externalId == oldSelf.externalId)",
      "status.externalId is immutable once set",
    ],
    [
      "NVMePartition",
      ".status",
      "!has(oldSelf.volumeHandle) || (has(self.volumeHandle) && self.volumeHandle == oldSelf.volumeHandle)",
      "status.volumeHandle is immutable once set",
    ],
    ["NVMePartition", ".status.portalIP", "isIP(self)", "status.portalIP must be an IPv4 or IPv6 address"],
    [
      "NVMePartition",
      ".status.portals[].address",
      "isIP(self)",
      "status.portals[].address must be an IPv4 or IPv6 address",
    ],
    [
      "NVMePartition",
      ".spec",
      "!has(oldSelf.contentSource) || (has(self.contentSource) && self.contentSource == oldSelf.contentSource)",
      "spec.contentSource is immutable once set",
    ],
    [
      "NVMePartition",
      ".spec.qos.rwIosPerSec",
      "self % 1000 == 0",
      "spec.qos.rwIosPerSec must be a multiple of 1000 (SPDK's QoS granularity)",
    ],
    [
      "NVMePartition",
      ".spec",
      "!has(self.qos) || self.backend == 'spdk'",
      "spec.qos requires spec.backend spdk: nvmet has no per-namespace rate limits",
    ],
    [
      "NVMePartition",
      ".spec",
      "!has(self.thinProvisioning) || !self.thinProvisioning || self.backend == 'spdk'",
      "spec.thinProvisioning requires spec.backend spdk: kernel partitions are always thick",
    ],
    [
      "NVMePartition",
      ".spec",
      "has(self.thinProvisioning) == has(oldSelf.thinProvisioning) && (!has(self.thinProvisioning) || self.thinProvisioning == oldSelf.thinProvisioning)",
      "spec.thinProvisioning is immutable",
    ],
    [
      "NVMePartition",
      ".spec.targetOptions",
      "!has(self.tls) || (has(self.transport) && self.transport == 'tcp')",
      "spec.targetOptions.tls needs transport tcp: TLS is defined for NVMe/TCP only",
    ],
    [
      "NVMePartition",
      ".spec",
      "!has(self.replicas) || self.replicas == 1 || self.backend == 'spdk'",
      "spec.replicas above 1 requires spec.backend spdk: the kernel nvmet backend has no RAID to mirror copies with",
    ],
    [
      "NVMePartition",
      ".spec",
      "!has(self.replicas) || self.replicas == 1 || !has(self.deviceSerial)",
      "spec.deviceSerial stays unset on a replicated volume: its replicas are placed, each on its own drive, and spec.nodeName names the node serving it",
    ],
    [
      "NVMePartition",
      ".spec",
      "!has(self.replicaOf) || !has(self.replicas) || self.replicas == 1",
      "spec.replicaOf is set only on a single-copy replica (spec.replicas absent or 1)",
    ],
    [
      "NVMePartition",
      ".spec",
      "!has(self.replicaTopologyKey) || (has(self.replicas) && self.replicas > 1)",
      "spec.replicaTopologyKey needs spec.replicas above 1",
    ],
    [
      "NVMePartition",
      ".spec",
      "!has(self.contentSource) || !has(self.replicas) || self.replicas == 1",
      "spec.contentSource is not supported with spec.replicas above 1 (clones and restores stay on one drive)",
    ],
    [
      "NVMePartition",
      ".spec",
      "has(self.replicas) == has(oldSelf.replicas) && (!has(self.replicas) || self.replicas == oldSelf.replicas)",
      "spec.replicas is immutable",
    ],
    [
      "NVMePartition",
      ".spec",
      "has(self.replicaTopologyKey) == has(oldSelf.replicaTopologyKey) && (!has(self.replicaTopologyKey) || self.replicaTopologyKey == oldSelf.replicaTopologyKey)",
      "spec.replicaTopologyKey is immutable",
    ],
    [
      "NVMePartition",
      ".spec",
      "has(self.replicaOf) == has(oldSelf.replicaOf) && (!has(self.replicaOf) || self.replicaOf == oldSelf.replicaOf)",
      "spec.replicaOf is immutable",
    ],
    [
      "NVMePartition",
      ".spec",
      "!has(self.failoverAfterSeconds) || (has(self.replicas) && self.replicas > 1)",
      "spec.failoverAfterSeconds needs spec.replicas above 1",
    ],
    ["NVMeSnapshot", ".spec.sourcePartitionName", "self == oldSelf", "spec.sourcePartitionName is immutable"],
    ["NVMeSnapshot", ".spec.sourcePartitionUID", "self == oldSelf", "spec.sourcePartitionUID is immutable"],
    ["NVMeVolumeAttachment", ".spec.partitionName", "self == oldSelf", "spec.partitionName is immutable"],
    ["NVMeVolumeAttachment", ".spec.partitionUID", "self == oldSelf", "spec.partitionUID is immutable"],
    ["RDMAStorageNode", ".spec.nodeName", "self == oldSelf", "spec.nodeName is immutable"],
    ["RDMAStorageNode", ".status.rdmaIP", "isIP(self)", "status.rdmaIP must be an IPv4 or IPv6 address"],
  ];
  test.each(required)("%s %s: %s", (kind, path, rule, message) => {
    const node = resolve(rootSchema(kinds[kind as keyof typeof kinds] as KindDef), path);
    expect(node?.["x-kubernetes-validations"]?.map((r) => [r.rule, r.message])).toContainEqual([
      rule,
      message,
    ]);
  });

  test("no other CEL rules exist (the table above is the complete contract)", () => {
    const all = allKinds.flatMap((def) =>
      [...walk(rootSchema(def), "")].flatMap(([, n]) =>
        (n["x-kubernetes-validations"] ?? []).map((r) => r.message),
      ),
    );
    expect(all.length).toBe(required.length);
  });

  test("enums for backend and volume manager", () => {
    const spec = rootSchema(kinds.NVMePartition as KindDef).properties!.spec!;
    expect(spec.properties!.backend).toMatchObject({ enum: ["spdk", "kernel"], default: "spdk" });
    expect(spec.properties!.volumeManager).toMatchObject({
      enum: ["partition", "spdk-lvol", "parted"],
      default: "partition",
    });
    expect(spec.properties!.sizeBytes).toMatchObject({ type: "integer", format: "int64", minimum: 1 });
  });

  test("claim serial is non-empty at the OpenAPI level", () => {
    expect(rootSchema(kinds.NVMeDeviceClaim as KindDef).properties!.spec!.properties!.serial).toMatchObject({
      minLength: 1,
    });
  });
});

describe("renderCrds", () => {
  test("one file per kind, headed, parsing back to buildCrd's object", () => {
    const files = renderCrds();
    expect([...files.keys()].sort()).toEqual(allKinds.map(crdFileName).sort());
    for (const def of allKinds) {
      const text = files.get(crdFileName(def))!;
      expect(text.startsWith(GENERATED_HEADER)).toBe(true);
      expect(text).toContain("`bun run gen`");
      expect(YAML.parse(text, { version: "1.1" })).toEqual(buildCrd(def));
      expect(text).not.toMatch(/[&*]a\d/); // no YAML anchors: kubectl diff and humans read these
    }
  });
});
