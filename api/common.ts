// Building blocks shared by every storage.distort.io kind: CEL/OpenAPI annotations carried as valibot
// metadata, metav1.Condition, ClaimRef, byte sizes, timestamps and a loose ObjectMeta.
// The CRD generator (api/crd.ts) reads the same schemas, so a constraint written here binds both TS and the apiserver.
import * as v from "valibot";

export const GROUP = "storage.distort.io";
export const VERSION = "v1alpha1";
export const API_VERSION = `${GROUP}/${VERSION}`;

/** One x-kubernetes-validations entry. `message` must name the field it guards (e.g. "spec.serial is immutable"). */
export interface CelRule {
  readonly rule: string;
  readonly message: string;
  /** Relative JSONPath (".nodeName") the apiserver reports the error under; must exist in the schema. */
  readonly fieldPath?: string;
  readonly reason?:
    | "FieldValueInvalid"
    | "FieldValueForbidden"
    | "FieldValueRequired"
    | "FieldValueDuplicate";
}

/**
 * Attaches an apiserver-enforced CEL rule to the schema it is piped into (the generator emits it as
 * x-kubernetes-validations on that node). Pure metadata: valibot itself never evaluates it, so a rule
 * that TS should also enforce needs a v.check/v.partialCheck placed immediately before it (its "TS twin").
 */
export function cel<TInput>(
  rule: string,
  message: string,
  opts: Pick<CelRule, "fieldPath" | "reason"> = {},
): v.MetadataAction<TInput, { readonly cel: CelRule }> {
  return v.metadata({ cel: { rule, message, ...opts } });
}

/** Extra OpenAPI keywords valibot has no action for (format, x-kubernetes-list-type, ...), merged verbatim. */
export function openapi<TInput>(
  props: Readonly<Record<string, unknown>>,
): v.MetadataAction<TInput, { readonly openapi: Readonly<Record<string, unknown>> }> {
  return v.metadata({ openapi: props });
}

/** Immutability of a required field: a transition rule on the field itself (only runs on update). */
export function immutable<TInput>(fieldPath: string): v.MetadataAction<TInput, { readonly cel: CelRule }> {
  return cel("self == oldSelf", `${fieldPath} is immutable`);
}

/**
 * Immutability of an optional field once it has been set; lives on the parent object because a rule
 * on an absent field never runs, so it could not stop the field being removed.
 */
export function immutableOnceSet<TInput>(
  parentPath: string,
  field: string,
): v.MetadataAction<TInput, { readonly cel: CelRule }> {
  return cel(
    `!has(oldSelf.${field}) || (has(self.${field}) && self.${field} == oldSelf.${field})`,
    `${parentPath}.${field} is immutable once set`,
    { fieldPath: `.${field}`, reason: "FieldValueForbidden" },
  );
}

/**
 * Bounded string; every string carries maxLength so CEL cost estimation stays within apiserver limits.
 * minLength 0 is a no-op the generator leaves out.
 */
export function str(description: string, maxLength: number, minLength = 0) {
  return v.pipe(v.string(), v.minLength(minLength), v.maxLength(maxLength), v.description(description));
}

/**
 * A size for people, as lib/units.ts formatQuantity writes it ("31.7Gi"): what `kubectl get`
 * prints. Written by the same component that writes the exact *Bytes field beside it.
 */
export function quantity(description: string) {
  return v.pipe(
    v.string(),
    v.maxLength(16),
    v.regex(/^[0-9]+(\.[0-9])?(Ki|Mi|Gi|Ti|Pi|Ei)?$/, "must be a binary quantity like 31.7Gi"),
    v.description(description),
  );
}

/** Kubernetes object names (DNS subdomain length); the apiserver validates real names, we only bound them. */
export function name(description: string) {
  return str(description, 253, 1);
}

/**
 * An integer from `min` to `max` inclusive: the one spelling of a bounded integer, which the CRD
 * generator turns into `type: integer` with `minimum`/`maximum`. Pipe it further for a description
 * or a format (`v.pipe(intRange(1, 3), v.description("..."))`).
 */
export function intRange(min: number, max: number) {
  return v.pipe(v.number(), v.integer(), v.minValue(min), v.maxValue(max));
}

/**
 * Byte counts and other int64 quantities. Capped at 2^53-1 so the apiserver refuses values a TS number
 * cannot hold exactly (8 PiB; larger than any drive this targets).
 */
export function int64(description: string, min = 0) {
  return v.pipe(
    intRange(min, Number.MAX_SAFE_INTEGER),
    openapi({ format: "int64" }),
    v.description(description),
  );
}

/** Strictly positive byte size. */
export function positiveBytes(description: string) {
  return int64(description, 1);
}

/**
 * RFC 3339 timestamp as Kubernetes serialises metav1.Time, kept a string so objects round-trip.
 * isoTimestamp checks ranges (and becomes format: date-time); the pattern narrows it to what the
 * apiserver's date-time accepts (valibot alone would take "2026-02-01 10:00:00Z" or "+0200").
 */
export function dateTime(description: string) {
  return v.pipe(
    v.string(),
    v.maxLength(64),
    v.isoTimestamp(),
    v.regex(
      /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/,
      "must be an RFC 3339 timestamp",
    ),
    v.description(description),
  );
}

export const PortSchema = v.pipe(intRange(1, 65535), openapi({ format: "int32" }));

/** IPv4 or IPv6 address (no zone, no prefix). */
export function ipAddress(fieldPath: string, description: string) {
  return v.pipe(
    v.string(),
    v.maxLength(45),
    v.ip(`${fieldPath} must be an IPv4 or IPv6 address`),
    // CEL isIP() refuses zones and IPv4-mapped IPv6, which v.ip() accepts.
    v.check(
      (s) => !s.includes("%") && !/^[0:]*:ffff:\d+\.\d+\.\d+\.\d+$/i.test(s),
      `${fieldPath} must be an IPv4 or IPv6 address`,
    ),
    cel("isIP(self)", `${fieldPath} must be an IPv4 or IPv6 address`),
    v.description(description),
  );
}

export const BackendSchema = v.pipe(
  v.picklist(["spdk", "kernel"]),
  v.description("NVMe-oF target implementation: SPDK nvmf_tgt or the Linux kernel nvmet (configfs)."),
);
export type Backend = v.InferOutput<typeof BackendSchema>;

export const TransportSchema = v.pipe(v.picklist(["rdma", "tcp"]), v.description("NVMe-oF transport."));
export type Transport = v.InferOutput<typeof TransportSchema>;

/** NVMe Qualified Name (NVMe base spec: at most 223 bytes). */
export function nqn(description: string) {
  return v.pipe(
    v.string(),
    v.maxLength(223),
    v.regex(/^nqn\.\d{4}-\d{2}\.[^:]+:.+$/, "must be an NQN (nqn.yyyy-mm.reverse-domain:identifier)"),
    v.description(description),
  );
}

// metav1.Condition, verbatim constraints from k8s.io/apimachinery/pkg/apis/meta/v1/types.go.
export const ConditionSchema = v.object({
  type: v.pipe(
    v.string(),
    v.maxLength(316),
    v.regex(
      /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$/,
    ),
    v.description("Type of condition in CamelCase or in foo.example.com/CamelCase."),
  ),
  status: v.pipe(
    v.picklist(["True", "False", "Unknown"]),
    v.description("Status of the condition, one of True, False, Unknown."),
  ),
  observedGeneration: v.optional(int64("The .metadata.generation that the condition was set based upon.", 0)),
  lastTransitionTime: dateTime("Last time the condition transitioned from one status to another."),
  reason: v.pipe(
    v.string(),
    v.minLength(1),
    v.maxLength(1024),
    v.regex(/^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$/),
    v.description("Programmatic identifier (CamelCase) of the reason for the last transition."),
  ),
  message: v.pipe(
    v.string(),
    v.maxLength(32768),
    v.description("Human-readable message with details about the transition; may be empty."),
  ),
});
export type Condition = v.InferOutput<typeof ConditionSchema>;

/**
 * A conditions list keyed by type (server-side apply merges per condition). Absent decodes as [] so
 * readers never branch on undefined; the bound keeps CEL cost estimates finite.
 */
export function conditions(description: string) {
  return v.optional(
    v.pipe(
      v.array(ConditionSchema),
      v.maxLength(32),
      openapi({ "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"] }),
      v.description(description),
    ),
    () => [],
  );
}

export const ObservedGenerationSchema = v.optional(
  int64("The .metadata.generation the writer of this status last acted on.", 0),
);

/** Exact reference to an NVMeDeviceClaim; the uid guards against a deleted-and-recreated claim of the same name. */
export const ClaimRefSchema = v.pipe(
  v.object({
    namespace: v.pipe(v.string(), v.minLength(1), v.maxLength(63), v.description("Namespace of the claim.")),
    name: name("Name of the claim."),
    uid: str("metadata.uid of the claim.", 128, 1),
  }),
  v.description("Exact identity (namespace, name, uid) of the owning NVMeDeviceClaim."),
);
export type ClaimRef = v.InferOutput<typeof ClaimRefSchema>;

/**
 * metadata as parsed in TS. Not part of the CRD schema (the apiserver owns ObjectMeta); loose so
 * managedFields, ownerReferences and future keys survive a parse.
 */
export const ObjectMetaSchema = v.looseObject({
  name: v.string(),
  namespace: v.optional(v.string()),
  uid: v.optional(v.string()),
  resourceVersion: v.optional(v.string()),
  generation: v.optional(v.number()),
  labels: v.optional(v.record(v.string(), v.string())),
  annotations: v.optional(v.record(v.string(), v.string())),
  finalizers: v.optional(v.array(v.string())),
  deletionTimestamp: v.optional(v.string()),
  creationTimestamp: v.optional(v.string()),
});
export type ObjectMeta = v.InferOutput<typeof ObjectMetaSchema>;

/** kubectl column (CRD additionalPrinterColumns); jsonPath is checked against the schema by api/crd.test.ts. */
export interface PrinterColumn {
  readonly name: string;
  readonly type: "string" | "integer" | "number" | "boolean" | "date";
  readonly jsonPath: string;
  readonly description?: string;
  readonly priority?: number;
  readonly format?: string;
}

/**
 * Fields usable in field selectors (CRD selectableFields, GA since Kubernetes 1.32), so node-local
 * watchers can ask the apiserver for their own objects instead of filtering every event.
 */
export type SelectableField = string;
