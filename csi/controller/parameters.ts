// StorageClass parameters of a DISTORT volume, parsed with valibot into a normalized record
// (defaults filled in, so equal requests compare equal). Unknown keys are refused, except the
// csi.storage.k8s.io/* keys the external-provisioner adds. Pure.
import * as v from "valibot";
import type { Backend, QosLimits, Transport, VolumeManager } from "../../api/index.ts";
import {
  FAILOVER_AFTER_MAX_SECONDS,
  FAILOVER_AFTER_MIN_SECONDS,
  TopologyKeySchema,
} from "../../api/replicas.ts";
import {
  DHCHAP_DHGROUPS,
  DHCHAP_HASH_NAMES,
  DHCHAP_MODES,
  type DhchapDhgroup,
  type DhchapHashName,
} from "../../lib/nvme/dhchap-keys.ts";
import { VolumeContextKeys, VolumeContextSchema } from "../../lib/volume-context.ts";
import { describeIssues, invalidArgument } from "../errors.ts";
import { type FsType, SUPPORTED_FS_TYPES } from "./capabilities.ts";
import { isQosParameter, parseQos, QOS_PARAMETER_KEYS, requireQosBackend } from "./qos-parameters.ts";

/** Prefix of the keys the external-provisioner adds (--extra-create-metadata) or interprets. */
export const PROVISIONER_PREFIX = "csi.storage.k8s.io/";

/** What --extra-create-metadata adds; recorded on the partition for operators, not fingerprinted. */
export const ProvisionerKeys = {
  pvcName: "csi.storage.k8s.io/pvc/name",
  pvcNamespace: "csi.storage.k8s.io/pvc/namespace",
  pvName: "csi.storage.k8s.io/pv/name",
} as const;

const BACKENDS = ["spdk", "kernel"] as const satisfies readonly Backend[];
const VOLUME_MANAGERS = ["partition", "spdk-lvol", "parted"] as const satisfies readonly VolumeManager[];
const TRANSPORTS = ["rdma", "tcp"] as const satisfies readonly Transport[];
/** NVMe/TCP TLS with a per-host PSK: required (TLS-only listeners) or none. */
const TLS_MODES = ["required", "none"] as const;

// The reconnect ranges are the node's: reuse the volume-context schema entries, one source of truth.
const ctx = VolumeContextSchema.entries;

const ParametersSchema = v.object({
  backend: v.optional(v.picklist(BACKENDS, "backend must be spdk or kernel"), "spdk"),
  volumeManager: v.optional(
    v.picklist(VOLUME_MANAGERS, "volumeManager must be partition, spdk-lvol or parted"),
    "partition",
  ),
  fsType: v.optional(
    v.picklist(SUPPORTED_FS_TYPES, `fsType must be one of ${SUPPORTED_FS_TYPES.join(", ")}`),
  ),
  transport: v.optional(v.picklist(TRANSPORTS, "transport must be rdma or tcp"), "rdma"),
  portalPort: v.optional(
    v.pipe(
      v.string(),
      v.regex(/^\d+$/, "portalPort must be an integer"),
      v.transform(Number),
      v.minValue(1, "portalPort must be >= 1"),
      v.maxValue(65535, "portalPort must be <= 65535"),
    ),
  ),
  ctrlLossTmo: ctx[VolumeContextKeys.ctrlLossTmo],
  reconnectDelay: ctx[VolumeContextKeys.reconnectDelay],
  fastIoFailTmo: ctx[VolumeContextKeys.fastIoFailTmo],
  dhchapSecretName: v.optional(
    v.pipe(
      v.string(),
      v.regex(/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/, "dhchapSecretName must be a Secret name"),
      v.maxLength(253, "dhchapSecretName must be at most 253 characters"),
    ),
  ),
  dhchapSecretNamespace: v.optional(v.string()),
  dhchapMode: v.optional(
    v.picklist(DHCHAP_MODES, "dhchapMode must be none, unidirectional or bidirectional"),
    "none",
  ),
  dhchapHash: v.optional(v.picklist(DHCHAP_HASH_NAMES, "dhchapHash must be sha256, sha384 or sha512")),
  dhchapGroup: v.optional(
    v.picklist(DHCHAP_DHGROUPS, `dhchapGroup must be one of ${DHCHAP_DHGROUPS.join(", ")}`),
  ),
  tls: v.optional(v.picklist(TLS_MODES, "tls must be required or none"), "none"),
  mkfsOptions: v.optional(
    v.pipe(v.string(), v.maxLength(1024, "mkfsOptions must be at most 1024 characters")),
  ),
  thinProvisioning: v.optional(
    v.picklist(["true", "false"], 'thinProvisioning must be "true" or "false"'),
    "false",
  ),
  replicas: v.optional(v.picklist(["1", "2", "3"], "replicas must be 1, 2 or 3")),
  replicaTopologyKey: v.optional(
    v.pipe(
      v.string(),
      v.check(
        (k) => v.is(TopologyKeySchema, k),
        "replicaTopologyKey must be a label key such as topology.kubernetes.io/zone",
      ),
    ),
  ),
  failoverAfterSeconds: v.optional(
    v.pipe(
      v.string(),
      v.regex(/^[0-9]{1,4}$/, "failoverAfterSeconds must be a whole number of seconds"),
      v.transform(Number),
      v.minValue(
        FAILOVER_AFTER_MIN_SECONDS,
        `failoverAfterSeconds must be at least ${FAILOVER_AFTER_MIN_SECONDS}`,
      ),
      v.maxValue(
        FAILOVER_AFTER_MAX_SECONDS,
        `failoverAfterSeconds must be at most ${FAILOVER_AFTER_MAX_SECONDS}`,
      ),
    ),
  ),
  dhchapSecretKey: v.optional(
    v.pipe(
      v.string(),
      v.regex(/^[-._a-zA-Z0-9]+$/, "dhchapSecretKey must be a Secret data key"),
      v.maxLength(253, "dhchapSecretKey must be at most 253 characters"),
    ),
  ),
});

/** The parameter names DISTORT understands. */
export const KNOWN_PARAMETERS: readonly string[] = [
  ...Object.keys(ParametersSchema.entries),
  ...QOS_PARAMETER_KEYS,
];

/** Parsed parameters with defaults; the shape the fingerprint and the partition spec are built from. */
export interface VolumeParameters {
  backend: Backend;
  volumeManager: VolumeManager;
  fsType?: FsType;
  transport: Transport;
  portalPort?: number;
  ctrlLossTmo?: number;
  reconnectDelay?: number;
  fastIoFailTmo?: number;
  /** Extra mkfs arguments, whitespace-normalized; checked against the filesystem by CreateVolume. */
  mkfsOptions?: string;
  /**
   * thinProvisioning "true": a thin lvol, reserved against the drive's overcommit budget. Present
   * only when true, so the records (and fingerprints) of thick volumes are what they always were.
   */
  thin?: true;
  /**
   * DH-HMAC-CHAP with keys generated per volume and host (dhchapMode other than none), the
   * defaults filled in; absent for none.
   */
  dhchap?: { mode: "unidirectional" | "bidirectional"; hash: DhchapHashName; dhgroup: DhchapDhgroup };
  /** NVMe/TCP TLS with a PSK generated per volume and host; absent for none. */
  tls?: "required";
  /** Copies on distinct storage nodes (2 or 3); absent for a single copy, as volumes always were. */
  replicas?: 2 | 3;
  /** Storage-node label the copies spread across (each copy in its own value); only with replicas. */
  replicaTopologyKey?: string;
  /** Seconds without a heartbeat from the serving node before another serves; only with replicas. */
  failoverAfterSeconds?: number;
}

export interface ParsedParameters {
  params: VolumeParameters;
  /** The csi.storage.k8s.io/pvc/name, pvc/namespace and pv/name values, when present. */
  provisioner: { pvcName?: string; pvcNamespace?: string; pvName?: string };
  /**
   * The qos.* limits (initial spec.qos; a VolumeAttributesClass may change them later, so they
   * are kept out of `params` and the fingerprint). Absent when none is given.
   */
  qos?: QosLimits;
}

/**
 * Parses a CreateVolume (or GetCapacity / ValidateVolumeCapabilities) parameter map. Throws
 * INVALID_ARGUMENT naming the parameter: unknown keys, bad values, a volume manager that does not
 * belong to the backend, QoS limits (qos.*) that are malformed or on the kernel backend, the
 * operator-supplied DH-HMAC-CHAP Secret (dhchapSecretName: validated, then refused, as generated
 * per-host keys replace it), tls other than required/none, tls on rdma or on the kernel backend.
 * Exporting without the authentication a StorageClass asked for would
 * be worse than failing. `driverNamespace` is where the partition,
 * and so any Secret it references, lives.
 */
export function parseParameters(
  raw: Readonly<Record<string, string>>,
  driverNamespace: string,
): ParsedParameters {
  const own: Record<string, string> = {};
  const qosRaw: Record<string, string> = {};
  const provisioner: ParsedParameters["provisioner"] = {};
  const unknown: string[] = [];
  for (const [k, val] of Object.entries(raw)) {
    if (k.startsWith(PROVISIONER_PREFIX)) {
      if (k === ProvisionerKeys.pvcName) provisioner.pvcName = val;
      else if (k === ProvisionerKeys.pvcNamespace) provisioner.pvcNamespace = val;
      else if (k === ProvisionerKeys.pvName) provisioner.pvName = val;
      continue;
    }
    if (isQosParameter(k)) qosRaw[k] = val;
    else if (!KNOWN_PARAMETERS.includes(k)) unknown.push(k);
    else own[k] = val;
  }
  if (unknown.length > 0) {
    throw invalidArgument(
      `unknown parameter${unknown.length > 1 ? "s" : ""} ${unknown
        .sort()
        .map((k) => JSON.stringify(k))
        .join(", ")} (DISTORT understands: ${KNOWN_PARAMETERS.join(", ")})`,
    );
  }
  const r = v.safeParse(ParametersSchema, own);
  if (!r.success) throw invalidArgument(describeIssues("invalid parameters", r.issues));
  const p = r.output;
  if (p.volumeManager === "spdk-lvol" && p.backend !== "spdk")
    throw invalidArgument("volumeManager spdk-lvol requires backend spdk");
  if (p.volumeManager === "parted" && p.backend !== "kernel")
    throw invalidArgument("volumeManager parted requires backend kernel");
  const thin = p.thinProvisioning === "true";
  if (thin && p.backend !== "spdk")
    throw invalidArgument(
      "thinProvisioning true requires backend spdk: kernel-backend volumes are disk partitions, which are always thick",
    );
  const dhchap = p.dhchapSecretName ?? p.dhchapSecretNamespace ?? p.dhchapSecretKey;
  if (dhchap !== undefined) {
    if (!p.dhchapSecretName)
      throw invalidArgument("dhchapSecretNamespace/dhchapSecretKey need dhchapSecretName");
    if (p.dhchapSecretNamespace !== undefined && p.dhchapSecretNamespace !== driverNamespace) {
      throw invalidArgument(
        `dhchapSecretNamespace must be ${driverNamespace}: the Secret has to live beside the NVMePartition`,
      );
    }
    throw invalidArgument(
      "DH-HMAC-CHAP with a shared Secret (dhchapSecretName) is not supported: use dhchapMode (unidirectional or bidirectional), which generates keys per volume and host",
    );
  }
  if (p.dhchapMode === "none" && (p.dhchapHash !== undefined || p.dhchapGroup !== undefined))
    throw invalidArgument("dhchapHash/dhchapGroup need dhchapMode unidirectional or bidirectional");

  if (p.tls === "required" && p.transport !== "tcp")
    throw invalidArgument(
      `tls required needs transport tcp (TLS is defined for NVMe/TCP only; got ${p.transport})`,
    );
  if (p.tls === "required" && p.backend === "kernel") {
    throw invalidArgument(
      "tls required is not supported on backend kernel: nvmet takes its PSKs from the kernel's .nvme keyring and tlshd, which DISTORT does not provision (docs/api.md, TLS); use backend spdk",
    );
  }
  const replicas = p.replicas === undefined ? 1 : Number(p.replicas);
  if (replicas > 1 && p.backend !== "spdk")
    throw invalidArgument(
      `replicas ${replicas} requires backend spdk: the kernel nvmet backend has no RAID to mirror copies with; use backend spdk or replicas 1`,
    );
  if (p.replicaTopologyKey !== undefined && replicas === 1)
    throw invalidArgument("replicaTopologyKey needs replicas 2 or 3");
  if (p.failoverAfterSeconds !== undefined && replicas === 1)
    throw invalidArgument("failoverAfterSeconds needs replicas 2 or 3");
  const qos = parseQos(qosRaw, "parameter");
  requireQosBackend(p.backend, qos, "parameters");
  const params: VolumeParameters = {
    backend: p.backend,
    volumeManager: p.volumeManager,
    transport: p.transport,
    ...(p.fsType === undefined ? {} : { fsType: p.fsType }),
    ...(p.portalPort === undefined ? {} : { portalPort: p.portalPort }),
    ...(p.ctrlLossTmo === undefined ? {} : { ctrlLossTmo: p.ctrlLossTmo }),
    ...(p.reconnectDelay === undefined ? {} : { reconnectDelay: p.reconnectDelay }),
    ...(p.fastIoFailTmo === undefined ? {} : { fastIoFailTmo: p.fastIoFailTmo }),
    ...(thin ? { thin: true as const } : {}),
    ...(p.mkfsOptions === undefined || p.mkfsOptions.trim() === ""
      ? {}
      : { mkfsOptions: p.mkfsOptions.trim().split(/\s+/).join(" ") }),
    ...(p.dhchapMode === "none"
      ? {}
      : { dhchap: { mode: p.dhchapMode, hash: p.dhchapHash ?? "sha256", dhgroup: p.dhchapGroup ?? "null" } }),
    ...(p.tls === "required" ? { tls: "required" as const } : {}),
    ...(replicas > 1 ? { replicas: replicas as 2 | 3 } : {}),
    ...(p.replicaTopologyKey === undefined ? {} : { replicaTopologyKey: p.replicaTopologyKey }),
    ...(p.failoverAfterSeconds === undefined ? {} : { failoverAfterSeconds: p.failoverAfterSeconds }),
  };
  return { params, provisioner, ...(qos ? { qos } : {}) };
}
