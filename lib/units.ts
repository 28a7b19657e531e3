// Byte arithmetic shared by placement and capacity accounting: every size is counted in whole
// allocation units, the granularity both the kernel partitioner and SPDK lvols allocate in.

/** 4 MiB: the allocation unit shared by SPDK lvstores (default cluster size) and parted alignment. */
export const ALLOCATION_UNIT = 4 * 1024 * 1024;

/**
 * `bytes` rounded up to a whole number of allocation units. Pure; `bytes` must be a non-negative
 * safe integer (schemas guarantee it), and the result stays exact below 2^53.
 */
export function roundUpToUnit(bytes: number): number {
  return Math.ceil(bytes / ALLOCATION_UNIT) * ALLOCATION_UNIT;
}

/** "12 MiB", "1.5 GiB": sizes in messages and events, where people read them. */
export function formatBytes(bytes: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = bytes;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  const text = Number.isInteger(v) ? String(v) : v.toFixed(1).replace(/\.0$/, "");
  return `${text} ${units[i]}`;
}

/**
 * "31.7Gi", "512Mi", "1Ti", "0": a size as a Kubernetes-style binary quantity with at most one
 * decimal, for status fields that `kubectl get` prints. Rounded to nearest, so it is for reading;
 * the exact figure stays in the *Bytes field beside it.
 */
export function formatQuantity(bytes: number): string {
  const units = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
  let v = bytes;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  // 1023.96Mi would print as "1024.0Mi": carry into the next unit instead.
  if (Math.round(v * 10) / 10 >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  const text = Number.isInteger(v) ? String(v) : v.toFixed(1).replace(/\.0$/, "");
  return `${text}${units[i]}`;
}
