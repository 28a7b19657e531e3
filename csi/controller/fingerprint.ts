// The persisted CreateVolume request of a partition (normalized record + fingerprint annotations), so
// a retry continues only when it asks for the same volume. The fingerprint has an immutable half and
// a topology half: a rescheduled WaitForFirstConsumer claim legitimately changes only the latter.
import { createHash } from "node:crypto";
import * as v from "valibot";
import type { TopologyRequirement } from "../../api/index.ts";
import type { NormalizedCapability } from "./capabilities.ts";
import type { VolumeParameters } from "./parameters.ts";

/** Annotation keys on NVMePartitions the CSI controller creates. */
export const Annotations = {
  /** The CreateVolume name, verbatim: tells a hash collision from a retry. */
  requestName: "storage.distort.io/csi-name",
  /** "v1:<32 hex of the request>:<32 hex of the topology>". */
  fingerprint: "storage.distort.io/csi-fingerprint",
  /** canonicalJson(VolumeRecord): parameters the volume context and validation need later. */
  request: "storage.distort.io/csi-request",
  pvcName: "storage.distort.io/pvc-name",
  pvcNamespace: "storage.distort.io/pvc-namespace",
  pvName: "storage.distort.io/pv-name",
} as const;

/** Label on every partition the CSI controller creates, for `kubectl get -l`. */
export const PROVISIONED_BY_LABEL = "storage.distort.io/provisioned-by";
export const PROVISIONED_BY = "csi";

/** A CreateVolume request reduced to what defines the volume. */
export interface VolumeRecord {
  v: 1;
  /** Allocated size in bytes (rounded): ranges that resolve to the same size are the same request. */
  sizeBytes: number;
  params: VolumeParameters;
  /** Sorted and deduplicated. */
  capabilities: NormalizedCapability[];
  source?: { kind: "volume" | "snapshot"; id: string };
}

/** JSON with object keys sorted at every depth and undefined members dropped: equal data, equal text. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map((x) => canonicalJson(x ?? null)).join(",")}]`;
  const keys = Object.keys(value)
    .filter((k) => (value as Record<string, unknown>)[k] !== undefined)
    .sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson((value as Record<string, unknown>)[k])}`).join(",")}}`;
}

function hash(value: unknown): string {
  return createHash("sha256").update(canonicalJson(value)).digest("hex").slice(0, 32);
}

/** Requisite order carries no meaning (any one must match); preferred order does. */
function canonicalTopology(t: TopologyRequirement | undefined): unknown {
  if (!t) return null;
  const requisite = (t.requisite ?? []).map((x) => canonicalJson(x.segments)).sort();
  const preferred = (t.preferred ?? []).map((x) => canonicalJson(x.segments));
  return { requisite, preferred };
}

/** The fingerprint annotation value for a request. */
export function fingerprintOf(record: VolumeRecord, topology: TopologyRequirement | undefined): string {
  return `v1:${hash(record)}:${hash(canonicalTopology(topology))}`;
}

export type FingerprintMatch = "same" | "topology-differs" | "different";

/**
 * Compares a stored fingerprint with the one a new request produces. A missing or unreadable
 * stored value is "different": a partition without one was not made by this CreateVolume.
 */
export function compareFingerprints(stored: string | undefined, wanted: string): FingerprintMatch {
  if (stored === wanted) return "same";
  const s = stored?.split(":");
  const w = wanted.split(":");
  if (s?.length !== 3 || s[0] !== w[0]) return "different";
  return s[1] === w[1] ? "topology-differs" : "different";
}

const StoredRecordSchema = v.object({
  v: v.literal(1),
  sizeBytes: v.number(),
  params: v.looseObject({
    backend: v.picklist(["spdk", "kernel"]),
    volumeManager: v.picklist(["partition", "spdk-lvol", "parted"]),
    transport: v.picklist(["rdma", "tcp"]),
    fsType: v.optional(v.picklist(["ext4", "xfs"])),
    portalPort: v.optional(v.number()),
    ctrlLossTmo: v.optional(v.number()),
    reconnectDelay: v.optional(v.number()),
    fastIoFailTmo: v.optional(v.number()),
    mkfsOptions: v.optional(v.string()),
    thin: v.optional(v.literal(true)),
    dhchap: v.optional(
      v.object({
        mode: v.picklist(["unidirectional", "bidirectional"]),
        hash: v.picklist(["sha256", "sha384", "sha512"]),
        dhgroup: v.picklist(["null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192"]),
      }),
    ),
    tls: v.optional(v.literal("required")),
    replicas: v.optional(v.picklist([2, 3])),
    replicaTopologyKey: v.optional(v.string()),
    failoverAfterSeconds: v.optional(v.number()),
  }),
  capabilities: v.array(
    v.object({
      access: v.picklist(["block", "mount"]),
      fsType: v.optional(v.picklist(["ext4", "xfs"])),
      mode: v.string(),
    }),
  ),
  source: v.optional(v.object({ kind: v.picklist(["volume", "snapshot"]), id: v.string() })),
});

/**
 * The record stored on a partition, or undefined when the annotation is absent (an NVMePartition
 * an administrator created by hand) or does not parse (treated the same way: no CSI extras).
 */
export function readRecord(
  annotations: Readonly<Record<string, string>> | undefined,
): VolumeRecord | undefined {
  const raw = annotations?.[Annotations.request];
  if (!raw) return undefined;
  try {
    const r = v.safeParse(StoredRecordSchema, JSON.parse(raw));
    return r.success ? (r.output as VolumeRecord) : undefined;
  } catch {
    return undefined;
  }
}
