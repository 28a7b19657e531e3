// Deterministic pseudo-randomness for tests and schedules that must replay exactly from a seed:
// the mulberry32 generator and a Fisher-Yates shuffle driven by it.

/**
 * mulberry32: a small, well-mixed 32-bit generator. Returns numbers in [0, 1); the same seed
 * (taken modulo 2^32) always yields the same sequence, which printed seeds and recorded fault
 * plans depend on, so the sequence must never change.
 */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Fisher-Yates shuffle of a copy of `items`, drawing one number from `random` per position. */
export function shuffled<T>(items: readonly T[], random: () => number): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j] as T, out[i] as T];
  }
  return out;
}
