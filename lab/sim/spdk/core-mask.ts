// The reactor core mask: parsing nvmf_tgt's -m argument (hex mask or DPDK core list) and the
// reactor/thread picture framework_get_reactors reports for it.

/**
 * Cores selected by `mask`: "0x3", "3" (hex without prefix) or a list "[0,2-3]". Throws on an
 * empty or unparsable mask, as nvmf_tgt refuses to start with one.
 */
export function parseCoreMask(mask: string): number[] {
  const m = mask.trim();
  const cores = new Set<number>();
  if (m.startsWith("[")) {
    if (!m.endsWith("]")) throw new Error(`invalid core list ${mask}`);
    for (const part of m.slice(1, -1).split(",")) {
      const r = /^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$/.exec(part);
      if (!r) throw new Error(`invalid core list ${mask}`);
      const lo = Number(r[1]);
      const hi = r[2] === undefined ? lo : Number(r[2]);
      if (hi < lo) throw new Error(`invalid core range in ${mask}`);
      for (let c = lo; c <= hi; c++) cores.add(c);
    }
  } else {
    const hex = m.replace(/^0x/i, "");
    if (!/^[0-9a-fA-F]+$/.test(hex)) throw new Error(`invalid core mask ${mask}`);
    let bits = BigInt(`0x${hex}`);
    for (let c = 0; bits > 0n; c++, bits >>= 1n) if (bits & 1n) cores.add(c);
  }
  if (cores.size === 0) throw new Error(`core mask ${mask} selects no core`);
  return [...cores].sort((a, b) => a - b);
}

/** A cpumask as SPDK prints thread masks: hex without "0x". */
export function cpumaskHex(cores: readonly number[]): string {
  let bits = 0n;
  for (const c of cores) bits |= 1n << BigInt(c);
  return bits.toString(16);
}

/**
 * The timestamp-counter rate reactors and nvmf stats count in. Real targets report their CPU's
 * TSC (2.45 GHz on the machine the reference transcripts come from); any fixed rate will do.
 */
export const TICK_RATE = 2_400_000_000;
