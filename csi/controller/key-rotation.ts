// DH-HMAC-CHAP key rotation asked for on a volume: the annotation storage.distort.io/rotate-keys
// on its NVMePartition names a generation; the CSI controller gives every host of the volume's key
// Secret a new pair once per generation. The agent's next pass over the export swaps the new keys
// in on the target (SPDK nvmf_subsystem_set_keys), which keeps connected hosts' controllers.
import type { NVMePartition } from "../../api/index.ts";
import type { EventRecorder } from "../../lib/kube/events.ts";
import type { VolumeKeyStore } from "../../lib/kube/volume-keys.ts";
import type { Logger } from "../../lib/log.ts";

/** Annotation on an NVMePartition: any new value (a generation, e.g. "2" or a date) rotates its keys once. */
export const ROTATE_KEYS_ANNOTATION = "storage.distort.io/rotate-keys";

export type RotationDecision =
  | { action: "none" }
  | { action: "refuse"; reason: string; message: string }
  | { action: "rotate"; generation: string; secretName: string };

/**
 * What a partition's rotate-keys annotation asks for. Nothing without the annotation or while the
 * partition is being deleted; refused (with why) for a volume without per-volume keys: no
 * DH-HMAC-CHAP, an operator's dhchapSecretRef (that Secret is theirs to change), or the kernel
 * backend (nvmet keeps one key per host, shared by every volume the host uses).
 */
export function decideRotation(p: NVMePartition): RotationDecision {
  const generation = p.metadata.annotations?.[ROTATE_KEYS_ANNOTATION];
  if (generation === undefined || generation === "" || p.metadata.deletionTimestamp)
    return { action: "none" };
  const dh = p.spec.targetOptions?.dhchap;
  if (!dh) {
    const message = p.spec.targetOptions?.dhchapSecretRef
      ? `the volume's DH-HMAC-CHAP secret is the operator's Secret ${p.spec.targetOptions.dhchapSecretRef.name}: change it there`
      : "the volume has no DH-HMAC-CHAP keys to rotate";
    return { action: "refuse", reason: "KeyRotationUnsupported", message };
  }
  if (p.spec.backend === "kernel") {
    return {
      action: "refuse",
      reason: "KeyRotationUnsupported",
      message:
        "kernel-backend (nvmet) keys are per host and shared by every volume of that host; they are not rotated per volume",
    };
  }
  return { action: "rotate", generation, secretName: dh.secretName };
}

export interface KeyRotationOptions {
  keys: VolumeKeyStore;
  events?: EventRecorder;
  logger: Logger;
}

/**
 * Acts on one partition's rotation request: rotates its Secret once per generation (idempotent:
 * the Secret records the generation done) and records KeysRotated, or KeyRotationUnsupported for a
 * volume it cannot rotate. Returns the decision taken. Never rejects for a refusal; rejects when
 * the Secret write fails (the caller retries on the next change or sweep).
 */
export async function rotateKeysIfAsked(p: NVMePartition, o: KeyRotationOptions): Promise<RotationDecision> {
  const d = decideRotation(p);
  if (d.action === "none") return d;
  if (d.action === "refuse") {
    await o.events?.record(p, "Warning", d.reason, "RotateKeys", d.message);
    return d;
  }
  const dh = p.spec.targetOptions?.dhchap as NonNullable<
    NonNullable<NVMePartition["spec"]["targetOptions"]>["dhchap"]
  >;
  const ns = p.metadata.namespace as string;
  const rotated = await o.keys.rotate(ns, d.secretName, d.generation, dh.mode, dh.hash);
  if (rotated && rotated.length > 0) {
    o.logger.info("DH-HMAC-CHAP keys rotated", {
      partition: `${ns}/${p.metadata.name}`,
      generation: d.generation,
      hosts: rotated.length,
    });
    await o.events?.record(
      p,
      "Normal",
      "KeysRotated",
      "RotateKeys",
      `generation ${d.generation}: new DH-HMAC-CHAP keys for ${rotated.length} host(s); connected hosts stay connected, new connections need the new keys`,
    );
  }
  return d;
}
