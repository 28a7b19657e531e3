// CreateVolume's pure half: validate a request into a plan (partition name, normalized record,
// fingerprint, topology) and build the NVMePartition the plan describes. Everything a bad request
// can be refused for is refused here, before any API call.

import {
  API_VERSION,
  type ContentSource,
  type NVMePartition,
  type QosLimits,
  type TopologyRequirement,
} from "../../api/index.ts";
import type { CreateVolumeRequest } from "../../gen/csi/v1/csi_pb.ts";
import { parseMkfsOptions } from "../../lib/mkfs-options.ts";
import { dhchapSecretName } from "../../lib/nvme/dhchap-keys.ts";
import { invalidArgument } from "../errors.ts";
import { requireSupported } from "./capabilities.ts";
import { resolveCapacity } from "./capacity.ts";
import {
  Annotations,
  canonicalJson,
  fingerprintOf,
  PROVISIONED_BY,
  PROVISIONED_BY_LABEL,
  type VolumeRecord,
} from "./fingerprint.ts";
import { type ParsedParameters, parseParameters } from "./parameters.ts";
import { parseMutableParameters, requireQosBackend } from "./qos-parameters.ts";
import { toPartitionTopology } from "./topology.ts";
import { MAX_REQUEST_NAME_LENGTH, partitionNameFor } from "./volume-id.ts";

export interface CreatePlan {
  requestName: string;
  partitionName: string;
  record: VolumeRecord;
  topology?: TopologyRequirement;
  fingerprint: string;
  provisioner: ParsedParameters["provisioner"];
  /** Initial spec.qos: the StorageClass's qos.* with the mutable parameters' on top (spdk only). */
  qos?: QosLimits;
}

export interface PlanOptions {
  /** Namespace the partition is created in (Secrets referenced by parameters must be there too). */
  namespace: string;
  /** Size when the request carries no capacity range. */
  defaultVolumeBytes: number;
}

/**
 * Validates `req` and returns the plan, or throws: INVALID_ARGUMENT (missing or over-long name,
 * missing or unsupported capabilities, malformed range, unknown or bad parameters, an fsType
 * parameter contradicting a capability, mkfsOptions outside the allow-list of the filesystem (or
 * for a mount of unknown filesystem), a content source on the kernel backend, mutable parameters
 * other than qos.*, QoS limits on the kernel backend), OUT_OF_RANGE (a capacity no 4 MiB multiple
 * satisfies). Content sources that pass
 * are still only validated: the caller decides whether it can honour them.
 */
export function planCreateVolume(req: CreateVolumeRequest, o: PlanOptions): CreatePlan {
  if (req.name === "") throw invalidArgument("name is required");
  const nameBytes = Buffer.byteLength(req.name);
  if (nameBytes > MAX_REQUEST_NAME_LENGTH)
    throw invalidArgument(`name is ${nameBytes} bytes long; at most ${MAX_REQUEST_NAME_LENGTH} are allowed`);
  const capabilities = requireSupported(req.volumeCapabilities, "volume_capabilities");
  const sizeBytes = resolveCapacity(req.capacityRange, o.defaultVolumeBytes);
  const { params, provisioner, qos: parsedQos } = parseParameters(req.parameters, o.namespace);
  if (params.fsType) {
    const clash = capabilities.find((c) => c.access === "mount" && c.fsType && c.fsType !== params.fsType);
    if (clash) {
      throw invalidArgument(
        `parameter fsType ${params.fsType} contradicts the mount capability's fs_type ${clash.fsType}`,
      );
    }
  }
  if (params.mkfsOptions !== undefined) {
    // Checked for each filesystem a mount of this volume may be formatted with; block ignores it.
    for (const c of capabilities) {
      if (c.access !== "mount") continue;
      const fs = params.fsType ?? c.fsType;
      if (fs === undefined)
        throw invalidArgument(
          "mkfsOptions needs the filesystem known: set the fsType parameter or csi.storage.k8s.io/fstype",
        );
      parseMkfsOptions(params.mkfsOptions, fs); // StorageError "invalid": INVALID_ARGUMENT
    }
  }
  // A VolumeAttributesClass's qos.* override the StorageClass's, key by key.
  const mutable = parseMutableParameters(req.mutableParameters);
  requireQosBackend(params.backend, mutable, "mutable_parameters");
  const qos = parsedQos || mutable ? { ...parsedQos, ...mutable } : undefined;
  let source: VolumeRecord["source"];
  const cs = req.volumeContentSource?.type;
  if (cs?.case === "volume" || cs?.case === "snapshot") {
    const id = cs.case === "volume" ? cs.value.volumeId : cs.value.snapshotId;
    if (!id) throw invalidArgument(`volume_content_source.${cs.case}: the source id is required`);
    if (params.backend !== "spdk") {
      throw invalidArgument(
        `volume_content_source (${cs.case}) needs backend spdk: kernel-backend volumes are disk partitions, which cannot be cloned or restored from snapshots`,
      );
    }
    if (params.replicas)
      throw invalidArgument(
        `volume_content_source (${cs.case}) with replicas ${params.replicas}: clones and restores are made on their source's drive, so they cannot be replicated yet; use a StorageClass with replicas 1`,
      );
    source = { kind: cs.case, id };
  } else if (req.volumeContentSource) {
    throw invalidArgument("volume_content_source must name a volume or a snapshot");
  }
  const topology = toPartitionTopology(req.accessibilityRequirements);
  const record: VolumeRecord = { v: 1, sizeBytes, params, capabilities, ...(source ? { source } : {}) };
  return {
    requestName: req.name,
    partitionName: partitionNameFor(req.name),
    record,
    ...(topology ? { topology } : {}),
    fingerprint: fingerprintOf(record, topology),
    provisioner,
    // All-zero limits on the kernel backend passed requireQosBackend: nvmet is unlimited anyway.
    ...(qos && params.backend === "spdk" ? { qos } : {}),
  };
}

/**
 * The NVMePartition to create for `plan` in `namespace`: unplaced, with the request recorded, and
 * the resolved content source (exact object identity) when the request has one.
 */
export function buildPartition(
  plan: CreatePlan,
  namespace: string,
  contentSource?: ContentSource,
): NVMePartition {
  const { params } = plan.record;
  const annotations: Record<string, string> = {
    [Annotations.requestName]: plan.requestName,
    [Annotations.fingerprint]: plan.fingerprint,
    [Annotations.request]: canonicalJson(plan.record),
  };
  if (plan.provisioner.pvcName) annotations[Annotations.pvcName] = plan.provisioner.pvcName;
  if (plan.provisioner.pvcNamespace) annotations[Annotations.pvcNamespace] = plan.provisioner.pvcNamespace;
  if (plan.provisioner.pvName) annotations[Annotations.pvName] = plan.provisioner.pvName;
  return {
    apiVersion: API_VERSION,
    kind: "NVMePartition",
    metadata: {
      name: plan.partitionName,
      namespace,
      labels: { [PROVISIONED_BY_LABEL]: PROVISIONED_BY },
      annotations,
    },
    spec: {
      sizeBytes: plan.record.sizeBytes,
      backend: params.backend,
      volumeManager: params.volumeManager,
      targetOptions: {
        transport: params.transport,
        ...(params.portalPort === undefined ? {} : { portalPort: params.portalPort }),
        // The Secret is named after the PersistentVolume (CreateVolume's name), which is what the
        // StorageClass's node-stage secret template expands to.
        ...(params.dhchap === undefined
          ? {}
          : { dhchap: { ...params.dhchap, secretName: dhchapSecretName(plan.requestName) } }),
        // The same Secret carries the hosts' TLS PSKs: one node-stage secret delivers both.
        ...(params.tls === undefined ? {} : { tls: { secretName: dhchapSecretName(plan.requestName) } }),
      },
      ...(plan.topology ? { topology: plan.topology } : {}),
      ...(contentSource ? { contentSource } : {}),
      ...(plan.qos ? { qos: plan.qos } : {}),
      ...(params.thin ? { thinProvisioning: true } : {}),
      ...(params.replicas ? { replicas: params.replicas } : {}),
      ...(params.replicaTopologyKey ? { replicaTopologyKey: params.replicaTopologyKey } : {}),
      ...(params.failoverAfterSeconds ? { failoverAfterSeconds: params.failoverAfterSeconds } : {}),
    },
  };
}
