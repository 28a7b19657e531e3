// Volume capabilities DISTORT accepts: one writer node (SINGLE_NODE_WRITER and the two
// SINGLE_NODE_MULTI_WRITER-era refinements) or readers only (one node, or several for
// MULTI_NODE_READER_ONLY), as a raw block device or mounted ext4/xfs; and MULTI_NODE_MULTI_WRITER
// for raw block only (two hosts during a live migration). Pure.
import { VolumeCapability_AccessMode_Mode as Mode, type VolumeCapability } from "../../gen/csi/v1/csi_pb.ts";
import { invalidArgument } from "../errors.ts";

/**
 * Access modes a volume can be published with. A single-node mode admits exactly one host at a
 * time; MULTI_NODE_READER_ONLY admits several hosts, and only while no writer holds the volume;
 * MULTI_NODE_MULTI_WRITER (raw block only) admits at most MAX_SHARED_WRITERS hosts, and only
 * while no publication of another mode holds it.
 */
export const SUPPORTED_MODES: readonly Mode[] = [
  Mode.SINGLE_NODE_WRITER,
  Mode.SINGLE_NODE_SINGLE_WRITER,
  Mode.SINGLE_NODE_MULTI_WRITER,
  Mode.SINGLE_NODE_READER_ONLY,
  Mode.MULTI_NODE_READER_ONLY,
  Mode.MULTI_NODE_MULTI_WRITER,
];

/**
 * Hosts a MULTI_NODE_MULTI_WRITER volume may be published to at once: the source and the
 * destination of a live migration. The workload coordinates their writes; the target does not.
 */
export const MAX_SHARED_WRITERS = 2;

/** True for the modes whose every publication is read-only, whatever the readonly flag says. */
export function isReaderMode(mode: AccessModeName): boolean {
  return mode === "SINGLE_NODE_READER_ONLY" || mode === "MULTI_NODE_READER_ONLY";
}

/**
 * True for the modes published as one attachment per node (several hosts on the target ACL):
 * MULTI_NODE_READER_ONLY and MULTI_NODE_MULTI_WRITER. Every other mode has one holder.
 */
export function isMultiNodeMode(mode: AccessModeName): boolean {
  return mode === "MULTI_NODE_READER_ONLY" || mode === "MULTI_NODE_MULTI_WRITER";
}

/** Filesystems the node service formats and mounts. */
export const SUPPORTED_FS_TYPES = ["ext4", "xfs"] as const;
export type FsType = (typeof SUPPORTED_FS_TYPES)[number];

export type AccessModeName = keyof typeof Mode;

/** A capability reduced to what DISTORT acts on (mount flags and mount group are node business). */
export interface NormalizedCapability {
  access: "block" | "mount";
  /** Mount only; undefined when the CO left it to the driver's default. */
  fsType?: FsType;
  mode: AccessModeName;
}

function modeName(m: Mode): AccessModeName {
  return (Mode[m] ?? "UNKNOWN") as AccessModeName;
}

const SUPPORTED_LIST = SUPPORTED_MODES.map(modeName).join(", ");

/**
 * Why `cap` is malformed (a required field missing), or undefined. Malformed capabilities are an
 * INVALID_ARGUMENT everywhere, even in ValidateVolumeCapabilities.
 */
export function malformedReason(cap: VolumeCapability): string | undefined {
  if (cap.accessType.case === undefined) return "access_type (block or mount) is required";
  if (!cap.accessMode || cap.accessMode.mode === Mode.UNKNOWN) return "access_mode is required";
  return undefined;
}

/** Why a well-formed `cap` is not supported, or undefined when DISTORT can serve it. */
export function unsupportedReason(cap: VolumeCapability): string | undefined {
  const mode = cap.accessMode?.mode ?? Mode.UNKNOWN;
  if (!SUPPORTED_MODES.includes(mode)) {
    return `access mode ${modeName(mode)} is not supported: a DISTORT volume has one writer node, only readers, or two writers of a raw block device (supported: ${SUPPORTED_LIST})`;
  }
  if (mode === Mode.MULTI_NODE_MULTI_WRITER && cap.accessType.case === "mount") {
    return "access mode MULTI_NODE_MULTI_WRITER is supported for raw block volumes only (volumeMode: Block, e.g. a live-migrating VM's disk): ext4 and xfs are not cluster filesystems, and two nodes mounting one would corrupt it";
  }
  if (cap.accessType.case === "mount") {
    const fs = cap.accessType.value.fsType;
    if (fs !== "" && !(SUPPORTED_FS_TYPES as readonly string[]).includes(fs)) {
      return `fsType ${JSON.stringify(fs)} is not supported (supported: ${SUPPORTED_FS_TYPES.join(", ")})`;
    }
  }
  return undefined;
}

/** The normalized form of a capability already checked by malformedReason/unsupportedReason. */
export function normalizeCapability(cap: VolumeCapability): NormalizedCapability {
  const mode = modeName(cap.accessMode?.mode ?? Mode.UNKNOWN);
  if (cap.accessType.case === "mount") {
    const fs = cap.accessType.value.fsType;
    return fs === "" ? { access: "mount", mode } : { access: "mount", fsType: fs as FsType, mode };
  }
  return { access: "block", mode };
}

/**
 * Checks every capability of a request that must be fully supported (CreateVolume,
 * ControllerPublishVolume, GetCapacity callers decide for themselves) and returns them normalized,
 * deduplicated and sorted so equal sets compare equal. Throws INVALID_ARGUMENT naming the first
 * offending entry; an empty list is refused too.
 */
export function requireSupported(caps: readonly VolumeCapability[], field: string): NormalizedCapability[] {
  if (caps.length === 0) throw invalidArgument(`${field} is required`);
  const out = new Map<string, NormalizedCapability>();
  caps.forEach((cap, i) => {
    const why = malformedReason(cap) ?? unsupportedReason(cap);
    if (why) throw invalidArgument(`${field}[${i}]: ${why}`);
    const n = normalizeCapability(cap);
    out.set(capabilityKey(n), n);
  });
  return [...out.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, n]) => n);
}

/** A stable string for one normalized capability, e.g. "mount:xfs:SINGLE_NODE_WRITER". */
export function capabilityKey(c: NormalizedCapability): string {
  return `${c.access}:${c.fsType ?? ""}:${c.mode}`;
}
