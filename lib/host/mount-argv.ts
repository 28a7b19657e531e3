// The mount(8) command line for a filesystem on a block device, shared by the CSI node (staging)
// and the DPU plugin (Filesystem devices). Pure.

/** argv mounting filesystem `fsType` of `device` on `target`, with `options` joined by commas (may be empty). */
export function mountArgv(
  device: string,
  target: string,
  fsType: string,
  options: readonly string[],
): string[] {
  return options.length > 0
    ? ["mount", "-t", fsType, "-o", options.join(","), device, target]
    : ["mount", "-t", fsType, device, target];
}
