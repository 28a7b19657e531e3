// The SPDK version a target reports (spdk_get_version) and the oldest one DISTORT drives: parsed
// with valibot from the reply's `fields`, compared numerically. Pure.
import * as v from "valibot";

/** A parsed spdk_get_version reply. */
export interface SpdkVersion {
  readonly major: number;
  readonly minor: number;
  readonly patch: number;
  /** As the target prints it, e.g. "SPDK v25.05.1 git sha1 44b23be7c3". */
  readonly text: string;
}

/**
 * The oldest SPDK release the agent supports: v25.05, the release whose RPC replies the agent's
 * parsers and the lab's emulator follow (shared/spdk-transcripts). Older targets differ in reply
 * shapes the agent reads (lvol and nvmf listings), so they are refused rather than misread.
 */
export const MIN_SPDK_VERSION = { major: 25, minor: 5, patch: 0 } as const;

const ReplySchema = v.looseObject({
  version: v.string(),
  fields: v.looseObject({
    major: v.pipe(v.number(), v.integer(), v.minValue(0)),
    minor: v.pipe(v.number(), v.integer(), v.minValue(0)),
    patch: v.pipe(v.number(), v.integer(), v.minValue(0)),
  }),
});

/** The version in a spdk_get_version `result`, or undefined when it is not one. */
export function parseSpdkVersion(reply: unknown): SpdkVersion | undefined {
  const r = v.safeParse(ReplySchema, reply);
  if (!r.success) return undefined;
  const { major, minor, patch } = r.output.fields;
  return { major, minor, patch, text: r.output.version };
}

/** "v25.05.1": SPDK's own spelling (two-digit minor). */
export function formatSpdkVersion(x: { major: number; minor: number; patch: number }): string {
  return `v${x.major}.${String(x.minor).padStart(2, "0")}.${x.patch}`;
}

/** True when `x` is at least MIN_SPDK_VERSION (or the given minimum). */
export function spdkVersionSupported(
  x: { major: number; minor: number; patch: number },
  min: { major: number; minor: number; patch: number } = MIN_SPDK_VERSION,
): boolean {
  if (x.major !== min.major) return x.major > min.major;
  if (x.minor !== min.minor) return x.minor > min.minor;
  return x.patch >= min.patch;
}
