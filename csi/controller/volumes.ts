// CreateVolume, DeleteVolume and ValidateVolumeCapabilities: a volume is one NVMePartition in the
// driver namespace, created once per request name (a retry finds it by its fingerprint) and
// waited on until the agent exports it or has released it.
import type { HandlerContext } from "@connectrpc/connect";
import type { ContentSource, NVMePartition, NVMeVolumeAttachment } from "../../api/index.ts";
import type {
  CreateVolumeRequest,
  DeleteVolumeRequest,
  ValidateVolumeCapabilitiesRequest,
} from "../../gen/csi/v1/csi_pb.ts";
import { errorMessage, StorageError } from "../../lib/errors.ts";
import {
  aborted,
  alreadyExists,
  csiError,
  failedPrecondition,
  invalidArgument,
  notFound,
} from "../errors.ts";
import { capabilityKey, malformedReason, requireSupported, unsupportedReason } from "./capabilities.ts";
import { buildPartition, type CreatePlan, planCreateVolume } from "./create-request.ts";
import {
  Annotations,
  canonicalJson,
  compareFingerprints,
  readRecord,
  type VolumeRecord,
} from "./fingerprint.ts";
import { parseParameters } from "./parameters.ts";
import { parseMutableParameters, requireQosBackend } from "./qos-parameters.ts";
import type { ControllerState } from "./state.ts";
import { attachmentNameFor, type VolumeRef } from "./volume-id.ts";
import { createVerdict, progressOf, volumeContextOf } from "./volume-view.ts";

/**
 * CreateVolume: validates the request before any API call, creates (or finds again) the
 * partition, and waits within the call's budget for it to be exported. Idempotent per request
 * name; ALREADY_EXISTS when the name was used with another request, ABORTED while another call on
 * the volume runs.
 */
export async function createVolume(c: ControllerState, req: CreateVolumeRequest, ctx: HandlerContext) {
  const plan = planCreateVolume(req, { namespace: c.ns, defaultVolumeBytes: c.o.defaultVolumeBytes });
  c.requireSynced();
  const source = plan.record.source
    ? await resolveContentSource(c, plan.record.source, plan.record.sizeBytes)
    : undefined;
  const key = c.key(plan.partitionName);
  return c.inFlight.run(key, `CreateVolume ${req.name}`, async () => {
    const p = await ensurePartition(c, plan, source);
    const uid = p.metadata.uid as string;
    let last: NVMePartition | undefined = p;
    const exported = await c.budget(
      ctx,
      (signal) =>
        c.partitionWaiter.waitFor(
          key,
          (o) => {
            if (o) last = o;
            return createVerdict(o, uid);
          },
          signal,
        ),
      () => `volume ${req.name} (NVMePartition ${key}) is not exported yet: ${progressOf(last)}`,
    );
    const volume = c.volumeOf(exported);
    if (req.volumeContentSource) volume.contentSource = req.volumeContentSource;
    return { volume };
  });
}

/**
 * The exact object a clone or restore copies from (the planner already refused the kernel
 * backend for the new volume). NOT_FOUND for a missing source, FAILED_PRECONDITION for a
 * kernel-backend or unready source, OUT_OF_RANGE when the new volume would be smaller.
 */
async function resolveContentSource(
  c: ControllerState,
  source: NonNullable<VolumeRecord["source"]>,
  sizeBytes: number,
): Promise<ContentSource> {
  const ref = c.ref(source.id);
  let sourceBytes: number;
  let out: ContentSource;
  if (source.kind === "snapshot") {
    const s = ref && (await c.snapshotOf(ref));
    if (!s || s.metadata.deletionTimestamp) throw notFound(`snapshot ${source.id} does not exist`);
    if (!s.status?.readyToUse) throw failedPrecondition(`snapshot ${source.id} is not ready to use yet`);
    sourceBytes = s.status.sizeBytes ?? 0;
    out = { kind: "Snapshot", name: s.metadata.name, uid: s.metadata.uid as string };
  } else {
    const p = ref && (await c.partitionOf(ref));
    if (!p || p.metadata.deletionTimestamp) throw notFound(`source volume ${source.id} does not exist`);
    if ((p.spec.backend ?? "spdk") !== "spdk")
      throw invalidArgument(
        `source volume ${source.id} uses the kernel backend, whose partitions cannot be cloned`,
      );
    sourceBytes = p.spec.sizeBytes;
    out = { kind: "Partition", name: p.metadata.name, uid: p.metadata.uid as string };
  }
  if (sizeBytes < sourceBytes)
    throw csiError(
      "out-of-range",
      `the new volume (${sizeBytes} bytes) would be smaller than its source ${source.id} (${sourceBytes} bytes)`,
    );
  return out;
}

/** Creates the plan's partition, or finds the one an earlier attempt created and checks it. */
async function ensurePartition(
  c: ControllerState,
  plan: CreatePlan,
  source?: ContentSource,
): Promise<NVMePartition> {
  for (let attempt = 0; attempt < 4; attempt++) {
    const existing = await c.partClient.get(plan.partitionName, c.ns);
    if (!existing) {
      try {
        const created = await c.partClient.create(buildPartition(plan, c.ns, source));
        c.log.info("volume requested", {
          volume: plan.requestName,
          partition: c.key(plan.partitionName),
          bytes: plan.record.sizeBytes,
          backend: plan.record.params.backend,
        });
        return created;
      } catch (err) {
        if (err instanceof StorageError && err.kind === "already-exists") continue;
        throw err;
      }
    }
    const ann = existing.metadata.annotations ?? {};
    const owner = ann[Annotations.requestName];
    if (owner !== plan.requestName) {
      throw alreadyExists(
        `NVMePartition ${c.key(plan.partitionName)} belongs to ${owner === undefined ? "a volume made outside CSI" : `volume ${JSON.stringify(owner)}`}, not ${JSON.stringify(plan.requestName)}`,
      );
    }
    if (existing.metadata.deletionTimestamp)
      throw aborted(`volume ${plan.requestName} is being deleted; retry once it is gone`);
    switch (compareFingerprints(ann[Annotations.fingerprint], plan.fingerprint)) {
      case "same":
        return existing;
      case "different":
        throw alreadyExists(
          `volume ${plan.requestName} already exists with ${differences(readRecord(ann), plan.record)}`,
        );
      case "topology-differs": {
        if (existing.spec.nodeName) {
          throw alreadyExists(
            `volume ${plan.requestName} is already placed on ${existing.spec.nodeName} for other accessibility requirements`,
          );
        }
        // Not placed yet: the claim was rescheduled (WaitForFirstConsumer); follow its new node.
        const spec = { ...existing.spec };
        if (plan.topology) spec.topology = plan.topology;
        else delete spec.topology;
        try {
          return await c.partClient.replace({
            ...existing,
            metadata: {
              ...existing.metadata,
              annotations: { ...ann, [Annotations.fingerprint]: plan.fingerprint },
            },
            spec,
          });
        } catch (err) {
          if (err instanceof StorageError && err.kind === "conflict") continue;
          throw err;
        }
      }
    }
  }
  throw aborted(`NVMePartition ${c.key(plan.partitionName)} kept changing while CreateVolume read it; retry`);
}

/**
 * What differs between the stored request and a new one, for ALREADY_EXISTS messages. Pure.
 * Exported for its test.
 */
export function differences(stored: VolumeRecord | undefined, wanted: VolumeRecord): string {
  if (!stored) return "no recorded request (created outside CSI, or by an incompatible version)";
  const out: string[] = [];
  if (stored.sizeBytes !== wanted.sizeBytes)
    out.push(`capacity ${stored.sizeBytes} bytes (asked: ${wanted.sizeBytes})`);
  if (canonicalJson(stored.params) !== canonicalJson(wanted.params))
    out.push(`parameters ${canonicalJson(stored.params)} (asked: ${canonicalJson(wanted.params)})`);
  if (canonicalJson(stored.capabilities) !== canonicalJson(wanted.capabilities))
    out.push(
      `capabilities ${stored.capabilities.map(capabilityKey).join(", ")} (asked: ${wanted.capabilities.map(capabilityKey).join(", ")})`,
    );
  if (canonicalJson(stored.source ?? null) !== canonicalJson(wanted.source ?? null))
    out.push("another content source");
  return out.length ? out.join("; ") : "a different request";
}

/**
 * DeleteVolume: deletes exactly the incarnation the id names and waits until the agent has
 * released its storage (the partition is gone from the API server). OK for ids that are not ours
 * or already gone; FAILED_PRECONDITION while the volume is still published.
 */
export async function deleteVolume(c: ControllerState, req: DeleteVolumeRequest, ctx: HandlerContext) {
  if (!req.volumeId) throw invalidArgument("volume_id is required");
  const ref = c.ref(req.volumeId);
  if (!ref) return {}; // never one of ours: already deleted as far as CSI is concerned
  c.requireSynced();
  const key = c.key(ref.name);
  return c.inFlight.run(key, "DeleteVolume", async () => {
    const p = await c.partitionOf(ref);
    if (!p) return {};
    const holders = await attachmentsOf(c, ref);
    if (holders.length > 0) {
      throw failedPrecondition(
        `volume is published to ${holders.map((a) => `node ${a.spec.nodeId} (NVMeVolumeAttachment ${a.metadata.name})`).join(", ")}; ControllerUnpublishVolume must run first`,
      );
    }
    if (!p.metadata.deletionTimestamp) {
      try {
        await c.partClient.delete(ref.name, c.ns, { uid: ref.uid });
      } catch (err) {
        // The uid precondition failed: the name now belongs to another object, ours is gone.
        if (err instanceof StorageError && err.kind === "conflict") return {};
        throw err;
      }
    }
    let last: NVMePartition | undefined = p;
    await c.budget(
      ctx,
      (signal) =>
        c.waitGone(c.partitionWaiter, c.partClient, ref.name, ref.uid, signal, (o) => {
          last = o;
        }),
      () => `cleanup of volume ${key} is not finished: ${progressOf(last)}`,
    );
    c.log.info("volume deleted", { partition: key, uid: ref.uid });
    return {};
  });
}

/** Attachments of this partition incarnation: the deterministic one, plus any the cache shows. */
async function attachmentsOf(c: ControllerState, ref: VolumeRef): Promise<NVMeVolumeAttachment[]> {
  const byName = await c.attClient.get(attachmentNameFor(ref.name, ref.uid), c.ns);
  const found = new Map<string, NVMeVolumeAttachment>();
  if (byName && byName.spec.partitionUID === ref.uid) found.set(byName.metadata.name, byName);
  for (const a of c.attachments.list())
    if (a.spec.partitionUID === ref.uid && !found.has(a.metadata.name)) found.set(a.metadata.name, a);
  return [...found.values()];
}

/**
 * ValidateVolumeCapabilities: confirms the capabilities, context and parameters only when the
 * volume, as the API server has it now, satisfies all of them; otherwise answers why not.
 * INVALID_ARGUMENT for a malformed request, NOT_FOUND for a volume that is gone. Reads only.
 */
export async function validateVolumeCapabilities(c: ControllerState, req: ValidateVolumeCapabilitiesRequest) {
  if (!req.volumeId) throw invalidArgument("volume_id is required");
  if (req.volumeCapabilities.length === 0) throw invalidArgument("volume_capabilities is required");
  req.volumeCapabilities.forEach((cap, i) => {
    const why = malformedReason(cap);
    if (why) throw invalidArgument(`volume_capabilities[${i}]: ${why}`);
  });
  const ref = c.ref(req.volumeId);
  if (!ref) throw notFound(`volume ${req.volumeId} does not exist`);
  const p = await c.partitionOf(ref);
  if (!p) throw notFound(`volume ${req.volumeId} does not exist`);
  const unconfirmed = (message: string) => ({ message });
  for (const cap of req.volumeCapabilities) {
    const why = unsupportedReason(cap);
    if (why) return unconfirmed(why);
  }
  const record = readRecord(p.metadata.annotations);
  const caps = requireSupported(req.volumeCapabilities, "volume_capabilities");
  const fsType = record?.params.fsType;
  const clash = fsType && caps.find((x) => x.access === "mount" && x.fsType && x.fsType !== fsType);
  if (clash) return unconfirmed(`the volume was created for ${fsType}, not ${clash.fsType}`);
  if (Object.keys(req.volumeContext).length > 0) {
    const ours = volumeContextOf(p, record);
    if (!ours) return unconfirmed(`the volume is not exported (${progressOf(p)})`);
    if (canonicalJson(ours) !== canonicalJson(req.volumeContext))
      return unconfirmed("volume_context does not match the volume's current context");
  }
  if (Object.keys(req.parameters).length > 0) {
    let params: VolumeRecord["params"];
    try {
      params = parseParameters(req.parameters, c.ns).params;
    } catch (err) {
      return unconfirmed(errorMessage(err));
    }
    const have: VolumeRecord["params"] = record?.params ?? {
      backend: p.spec.backend ?? "spdk",
      volumeManager: p.spec.volumeManager ?? "partition",
      transport: p.spec.targetOptions?.transport ?? "rdma",
      ...(p.spec.thinProvisioning ? { thin: true as const } : {}),
    };
    if (canonicalJson(params) !== canonicalJson(have))
      return unconfirmed(`parameters differ from the volume's: it was created with ${canonicalJson(have)}`);
  }
  if (Object.keys(req.mutableParameters).length > 0) {
    try {
      requireQosBackend(
        p.spec.backend ?? "spdk",
        parseMutableParameters(req.mutableParameters),
        "mutable_parameters",
      );
    } catch (err) {
      return unconfirmed(errorMessage(err));
    }
  }
  return {
    confirmed: {
      volumeContext: req.volumeContext,
      volumeCapabilities: req.volumeCapabilities,
      parameters: req.parameters,
      mutableParameters: req.mutableParameters,
    },
  };
}
