// Allocatable capacity of a drive: namespace 1 minus a 1 % reserve, rounded down to the 4 MiB
// allocation unit. The reserve covers GPT structures and SPDK blobstore metadata, so a size
// accepted while the kernel owns a drive still fits after it is rebound to SPDK (and back).

/** Allocation unit every volume size is rounded to (the SPDK lvol cluster size). */
export const ALLOCATION_UNIT_BYTES = 4 * 1024 * 1024;

/**
 * Bytes offered for placement out of a namespace of `namespaceBytes`. The reserve is rounded up,
 * so it is never less than 1 %. Exact for any safe integer; 0 when nothing is left (a drive that
 * small must not be advertised). Throws RangeError on a negative or non-integer size.
 */
export function allocatableBytes(namespaceBytes: number): number {
  if (!Number.isSafeInteger(namespaceBytes) || namespaceBytes < 0) {
    throw new RangeError(`namespace size must be a non-negative safe integer, got ${namespaceBytes}`);
  }
  // BigInt because namespaceBytes * 99 leaves the safe range for drives above ~90 TiB.
  const total = BigInt(namespaceBytes);
  const reserve = (total + 99n) / 100n;
  const unit = BigInt(ALLOCATION_UNIT_BYTES);
  return Number(((total - reserve) / unit) * unit);
}
