// The rebuild bench's pure parts: the data pattern it fills a copy with (non-zero and different at
// every 4-byte position, so a lost, shifted or zeroed window changes the checksum), rates in MiB/s,
// the bandwidth cap it sets for the capped run, and whether a measured rate kept to a cap.

const MIB = 2 ** 20;
/** Knuth's multiplicative constant: odd, so word index -> value is a bijection modulo 2^32. */
const MULTIPLIER = 0x9e3779b1;

/**
 * `length` bytes of the pattern starting at byte `offset` of the data region. Every 32-bit word
 * (little endian) is (index + 1) * MULTIPLIER mod 2^32, which is never zero below 2^32 words
 * (16 GiB) and never repeats there, so two windows of one region never hold the same bytes.
 * Pure; the same arguments give the same bytes. Throws RangeError unless offset and length are
 * non-negative multiples of 4.
 */
export function pattern(offset: number, length: number): Buffer {
  if (!(Number.isInteger(offset) && offset >= 0 && offset % 4 === 0))
    throw new RangeError(`pattern offset ${offset} is not a non-negative multiple of 4`);
  if (!(Number.isInteger(length) && length >= 0 && length % 4 === 0))
    throw new RangeError(`pattern length ${length} is not a non-negative multiple of 4`);
  const out = Buffer.alloc(length);
  const first = offset / 4 + 1;
  // Little endian whatever the host's order, so a checksum means the same everywhere.
  for (let i = 0; i < length / 4; i++) out.writeUInt32LE(Math.imul(first + i, MULTIPLIER) >>> 0, i * 4);
  return out;
}

/** Bytes per millisecond as MiB/s; NaN for a non-positive time (nothing measurable). */
export function mibPerSecond(bytes: number, ms: number): number {
  return ms > 0 ? bytes / MIB / (ms / 1000) : Number.NaN;
}

/**
 * The process_max_bandwidth_mb_sec for the capped run: 100 MiB/s, or half the uncapped rebuild's
 * rate when that is below 200 MiB/s, so the cap is always below what the rebuild does unpaced and
 * the run shows the pacing rather than the copy's own speed. At least 1 (0 would mean no cap).
 */
export function capFor(uncappedMiBs: number, preferred = 100): number {
  if (!(uncappedMiBs > 0)) return 1;
  return Math.max(1, Math.min(preferred, Math.floor(uncappedMiBs / 2)));
}

/** Whether `measured` MiB/s kept to `cap` MiB/s within `tolerance` (0.1: up to 110 % of it). */
export function keptToCap(measured: number, cap: number, tolerance = 0.1): boolean {
  return Number.isFinite(measured) && measured <= cap * (1 + tolerance);
}
