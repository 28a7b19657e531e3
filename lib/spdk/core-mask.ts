// nvmf_tgt reactor core masks: parsing and validating the configured mask (hex "0x3" or SPDK's
// list form "[0,2-3]"), deriving the running mask from framework_get_reactors, and comparing them.

import * as v from "valibot";
import { StorageError } from "../errors.ts";

/**
 * Lcores SPDK can address: its cpuset is 1024 bits wide (SPDK_CPUSET_SIZE), so a mask naming a
 * higher core cannot be what a running target reports.
 */
export const MAX_LCORES = 1024;

/** A validated, non-empty set of lcores. Plain frozen data; compare with sameCores(). */
export interface CoreMask {
  /** Lcore ids, ascending, without duplicates, never empty. */
  readonly cores: readonly number[];
  /** Canonical hex form, e.g. "0x3"; what the supervisor passes to nvmf_tgt -m. */
  readonly hex: string;
}

const HEX_MASK = /^0[xX]([0-9a-fA-F]+)$/;
const LIST_ITEM = /^\s*(\d{1,5})\s*(?:-\s*(\d{1,5})\s*)?$/;

function invalid(text: string, why: string): StorageError {
  return new StorageError("invalid", `core mask ${JSON.stringify(text)}: ${why}`, {
    details: { coreMask: text },
  });
}

/** The mask of `cores` (each an integer in [0, MAX_LCORES)). Throws StorageError("invalid"). */
export function coreMaskOf(cores: Iterable<number>): CoreMask {
  const set = new Set<number>();
  for (const c of cores) {
    if (!Number.isInteger(c) || c < 0 || c >= MAX_LCORES) {
      throw invalid(String(c), `lcore ${c} is not an integer in [0, ${MAX_LCORES})`);
    }
    set.add(c);
  }
  if (set.size === 0) throw invalid("", "selects no core");
  const sorted = [...set].sort((a, b) => a - b);
  let bits = 0n;
  for (const c of sorted) bits |= 1n << BigInt(c);
  return Object.freeze({ cores: Object.freeze(sorted), hex: `0x${bits.toString(16)}` });
}

/**
 * Parses a configured core mask. Accepts "0x" + hex digits (case-insensitive) or SPDK's list
 * form "[0,2-3]". Refuses, with StorageError("invalid") naming the mask and the reason: bare
 * hex without "0x" (SPDK would read "10" as cores 4, not core 10; configuration must not be
 * that ambiguous), decimal, an empty or all-zero mask, descending ranges, and any core at or
 * above MAX_LCORES. Pure.
 */
export function parseCoreMask(text: string): CoreMask {
  if (typeof text !== "string") throw invalid(String(text), "must be a string");
  const t = text.trim();
  if (t === "") throw invalid(text, "is empty");
  if (t.startsWith("[")) {
    if (!t.endsWith("]")) throw invalid(text, 'a core list must end with "]"');
    const cores: number[] = [];
    for (const part of t.slice(1, -1).split(",")) {
      const m = LIST_ITEM.exec(part);
      if (!m) throw invalid(text, `list item ${JSON.stringify(part.trim())} is not a core or a range lo-hi`);
      const lo = Number(m[1]);
      const hi = m[2] === undefined ? lo : Number(m[2]);
      if (hi < lo) throw invalid(text, `range ${lo}-${hi} is descending`);
      if (hi >= MAX_LCORES)
        throw invalid(text, `core ${hi} is beyond the ${MAX_LCORES} lcores SPDK supports`);
      for (let c = lo; c <= hi; c++) cores.push(c);
    }
    return coreMaskOf(cores);
  }
  const m = HEX_MASK.exec(t);
  if (!m) {
    throw invalid(text, 'must be hex with a "0x" prefix (e.g. "0x3") or a core list (e.g. "[0,2-3]")');
  }
  const digits = (m[1] as string).replace(/^0+/, "");
  if (digits === "") throw invalid(text, "selects no core (nvmf_tgt needs at least one reactor)");
  if (digits.length * 4 > MAX_LCORES) {
    throw invalid(text, `names cores beyond the ${MAX_LCORES} lcores SPDK supports`);
  }
  const cores: number[] = [];
  let bits = BigInt(`0x${digits}`);
  for (let c = 0; bits > 0n; c++, bits >>= 1n) if (bits & 1n) cores.push(c);
  return coreMaskOf(cores);
}

/**
 * The mask a running target uses: the lcores of framework_get_reactors' reactors. Throws
 * StorageError("internal") when the reply lists no reactor or an impossible lcore, which no
 * running nvmf_tgt does.
 */
export function coreMaskOfReactors(reply: {
  readonly reactors: readonly { readonly lcore: number }[];
}): CoreMask {
  try {
    return coreMaskOf(reply.reactors.map((r) => r.lcore));
  } catch (err) {
    throw new StorageError(
      "internal",
      `framework_get_reactors: cannot derive a core mask from lcores [${reply.reactors.map((r) => r.lcore).join(",")}]`,
      { cause: err },
    );
  }
}

/** True when both masks select exactly the same lcores. Pure. */
export function sameCores(a: CoreMask, b: CoreMask): boolean {
  return a.cores.length === b.cores.length && a.cores.every((c, i) => c === b.cores[i]);
}

/**
 * A valibot schema for configuration: a core-mask string in, a CoreMask out; the issue message
 * is parseCoreMask's reason.
 */
export const CoreMaskSchema = v.pipe(
  v.string(),
  v.rawTransform(({ dataset, addIssue, NEVER }) => {
    try {
      return parseCoreMask(dataset.value);
    } catch (err) {
      addIssue({ message: err instanceof Error ? err.message : String(err) });
      return NEVER;
    }
  }),
);
