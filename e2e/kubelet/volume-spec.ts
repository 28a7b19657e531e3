// What kubelet derives from a PersistentVolume before calling the CSI node service: the access
// mode and capability (k8s pkg/volume/csi), the volume mode, and byte counts of resource
// quantities. Pure.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type * as k8s from "@kubernetes/client-node";
import {
  VolumeCapability_AccessMode_Mode as Mode,
  type VolumeCapabilitySchema,
} from "../../gen/csi/v1/csi_pb.ts";
import type { VolumeMode } from "./naming.ts";

/** A volume_capability as the CSI client takes it. */
export type VolumeCapabilityInit = MessageInitShape<typeof VolumeCapabilitySchema>;

/** Kubernetes access mode -> CSI access mode, as kubelet maps them (RWO is the plain single-node writer). */
const ACCESS_MODES: Readonly<Record<string, Mode>> = {
  ReadWriteOnce: Mode.SINGLE_NODE_WRITER,
  ReadOnlyMany: Mode.MULTI_NODE_READER_ONLY,
  ReadWriteMany: Mode.MULTI_NODE_MULTI_WRITER,
  ReadWriteOncePod: Mode.SINGLE_NODE_SINGLE_WRITER,
};

/**
 * The CSI access mode for a PV's access modes. kubelet looks only at the first one (ReadWriteOnce
 * when there is none); an unknown mode is UNKNOWN, which the driver refuses.
 */
export function csiAccessMode(pvAccessModes: readonly string[] | undefined): Mode {
  const first = pvAccessModes?.[0] ?? "ReadWriteOnce";
  return ACCESS_MODES[first] ?? Mode.UNKNOWN;
}

/** Filesystem unless the PV says Block. */
export function volumeModeOf(pv: k8s.V1PersistentVolume): VolumeMode {
  return pv.spec?.volumeMode === "Block" ? "Block" : "Filesystem";
}

/** fs_type when the PV names none. */
export const DEFAULT_FS_TYPE = "ext4";

/**
 * The volume_capability of NodeStage/NodePublish/NodeExpand: block for a Block PV, else a mount
 * with the PV's csi.fsType (ext4 when empty) and mountOptions.
 */
export function volumeCapabilityOf(pv: k8s.V1PersistentVolume): VolumeCapabilityInit {
  const accessMode = { mode: csiAccessMode(pv.spec?.accessModes) };
  if (volumeModeOf(pv) === "Block") return { accessMode, accessType: { case: "block", value: {} } };
  const fsType = pv.spec?.csi?.fsType || DEFAULT_FS_TYPE;
  return {
    accessMode,
    accessType: { case: "mount", value: { fsType, mountFlags: [...(pv.spec?.mountOptions ?? [])] } },
  };
}

const BINARY: Record<string, bigint> = {
  Ki: 1024n,
  Mi: 1024n ** 2n,
  Gi: 1024n ** 3n,
  Ti: 1024n ** 4n,
  Pi: 1024n ** 5n,
  Ei: 1024n ** 6n,
};
const DECIMAL_EXP: Record<string, number> = { m: -3, "": 0, k: 3, M: 6, G: 9, T: 12, P: 15, E: 18 };

/**
 * A resource.Quantity in bytes, rounded up to a whole byte ("1Gi", "500M", "1.5Gi", "2e9", "1024").
 * Throws on a string that is no quantity. Negative quantities are refused (sizes only).
 */
export function quantityBytes(text: string): bigint {
  const m = /^(\d+)(?:\.(\d+))?(?:(Ki|Mi|Gi|Ti|Pi|Ei)|([mkMGTPE])|[eE]([-+]?\d+))?$/.exec(text.trim());
  if (!m) throw new Error(`${JSON.stringify(text)} is not a size quantity`);
  const [, whole = "0", frac = "", bin, dec, exp] = m;
  // value = digits * 10^(scale) * multiplier, computed exactly in integers, then rounded up.
  const digits = BigInt(whole + frac);
  let scale = -frac.length;
  let multiplier = 1n;
  if (bin !== undefined) multiplier = BINARY[bin] ?? 1n;
  else if (dec !== undefined) scale += DECIMAL_EXP[dec] ?? 0;
  else if (exp !== undefined) scale += Number(exp);
  const num = digits * multiplier;
  if (scale >= 0) return num * 10n ** BigInt(scale);
  const den = 10n ** BigInt(-scale);
  return (num + den - 1n) / den;
}
