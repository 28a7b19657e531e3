// Names and host paths kubelet derives for CSI volumes (k8s pkg/volume/csi): VolumeAttachment
// names, node-status volume names, and where volumes are staged and published, which the e2e
// suites look for on the real kubelets' nodes. Pure.
import { createHash } from "node:crypto";
import { join } from "node:path";

/** Lower-case hex sha256 of a UTF-8 string. */
export function sha256Hex(s: string): string {
  return createHash("sha256").update(s).digest("hex");
}

/** VolumeAttachment name the attach-detach controller creates: csi-<sha256(handle + driver + node)>. */
export function attachmentName(volumeHandle: string, driver: string, nodeName: string): string {
  return `csi-${sha256Hex(`${volumeHandle}${driver}${nodeName}`)}`;
}

/** The name node.status.volumesAttached and volumesInUse carry for a CSI volume. */
export function uniqueVolumeName(driver: string, volumeHandle: string): string {
  return `kubernetes.io/csi/${driver}^${volumeHandle}`;
}

/** The prefix every unique volume name of `driver` starts with. */
export function uniqueNamePrefix(driver: string): string {
  return `kubernetes.io/csi/${driver}^`;
}

/** A PersistentVolume's volumeMode. */
export type VolumeMode = "Filesystem" | "Block";

const CSI_PLUGIN_DIR = ["plugins", "kubernetes.io", "csi"];

/** kubelet's CSI plugin directory under its root, e.g. /var/lib/kubelet/plugins/kubernetes.io/csi. */
export function csiPluginDir(rootDir: string): string {
  return join(rootDir, ...CSI_PLUGIN_DIR);
}

/**
 * staging_target_path: <root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount for a
 * filesystem volume; a block volume stages at <root>/plugins/kubernetes.io/csi/volumeDevices/staging/<pv>.
 */
export function stagingPath(
  rootDir: string,
  o: { driver: string; volumeHandle: string; pvName: string; mode: VolumeMode },
): string {
  return o.mode === "Block"
    ? join(csiPluginDir(rootDir), "volumeDevices", "staging", o.pvName)
    : join(csiPluginDir(rootDir), o.driver, sha256Hex(o.volumeHandle), "globalmount");
}

/** The directory of one Pod's state under the kubelet root. */
export function podDir(rootDir: string, podUID: string): string {
  return join(rootDir, "pods", podUID);
}

/**
 * target_path: <root>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount (a directory the driver
 * creates) for a filesystem volume; <root>/plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid>
 * (a file the driver creates) for a block volume.
 */
export function publishPath(
  rootDir: string,
  o: { podUID: string; pvName: string; mode: VolumeMode },
): string {
  return o.mode === "Block"
    ? join(csiPluginDir(rootDir), "volumeDevices", "publish", o.pvName, o.podUID)
    : join(podDir(rootDir, o.podUID), "volumes", "kubernetes.io~csi", o.pvName, "mount");
}

/**
 * Where the record of one Pod's use of a volume lives (a vol_data.json, as kubelet keeps one):
 * <root>/pods/<uid>/volumes/kubernetes.io~csi/<pv> or <root>/pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>.
 */
export function publicationRecordDir(
  rootDir: string,
  o: { podUID: string; pvName: string; mode: VolumeMode },
): string {
  return join(
    podDir(rootDir, o.podUID),
    o.mode === "Block" ? "volumeDevices" : "volumes",
    "kubernetes.io~csi",
    o.pvName,
  );
}

/** Where the record of a staged volume lives: beside its staging path. */
export function stagingRecordDir(
  rootDir: string,
  o: { driver: string; volumeHandle: string; pvName: string; mode: VolumeMode },
): string {
  return o.mode === "Block"
    ? join(csiPluginDir(rootDir), "volumeDevices", o.pvName, "data")
    : join(csiPluginDir(rootDir), o.driver, sha256Hex(o.volumeHandle));
}

/** The record file kubelet keeps next to a CSI volume's paths. */
export const VOL_DATA_FILE = "vol_data.json";
