// The serving lease the agent leaves beside the SPDK RPC socket for the target watchdog, and the
// fence record the watchdog leaves for the agent: their file names, versioned shapes, builders
// and parsers. Pure (the writer is agent/watchdog/lease-writer.ts).
import { dirname, join } from "node:path";
import * as v from "valibot";
import { DEFAULT_FAILOVER_AFTER_SECONDS } from "../../api/index.ts";
import { SELF_FENCE_FRACTION } from "../nexus/self-fence.ts";

/** The lease file's name, in the run directory the agent and nvmf_tgt share (the socket's). */
export const LEASE_FILE = "distort-serving-lease.json";
/** The fence record's name, in the same directory. */
export const FENCE_RECORD_FILE = "distort-target-fence.json";

/** Where the lease and the fence record live for an SPDK RPC socket at `spdkSocket`. */
export function watchdogPaths(spdkSocket: string): { lease: string; record: string } {
  const dir = dirname(spdkSocket);
  return { lease: join(dir, LEASE_FILE), record: join(dir, FENCE_RECORD_FILE) };
}

const Ms = v.pipe(v.number(), v.integer(), v.minValue(0));
const Nqn = v.pipe(v.string(), v.minLength(1), v.maxLength(223));

/**
 * Version 1 of the lease. `fenceAtMs` is absent when the node serves no nexus (then `nqns` is
 * empty): nothing for the watchdog to fence. Unknown fields are kept out (strict), so a newer
 * agent's lease under this version number is refused loudly rather than half-read.
 */
export const LeaseSchema = v.strictObject({
  version: v.literal(1),
  node: v.pipe(v.string(), v.minLength(1)),
  heartbeatMs: Ms,
  fenceAtMs: v.optional(Ms),
  nqns: v.array(Nqn),
});
export type Lease = v.InferOutput<typeof LeaseSchema>;

/** Version 1 of the fence record: which subsystems the watchdog fenced, when, for which lease. */
export const FenceRecordSchema = v.strictObject({
  version: v.literal(1),
  node: v.string(),
  fencedAtMs: Ms,
  leaseHeartbeatMs: Ms,
  fenceAtMs: Ms,
  nqns: v.array(Nqn),
});
export type FenceRecord = v.InferOutput<typeof FenceRecordSchema>;

/**
 * The lease after a heartbeat the API server took at `heartbeatMs`, for the nexus subsystems
 * this node serves optimized (`serving`: NQN and the volume's failoverAfterSeconds). The deadline
 * is the agent's own self-fence deadline for the volume with the smallest bound.
 */
export function buildLease(o: {
  node: string;
  heartbeatMs: number;
  serving: readonly { nqn: string; failoverAfterSeconds: number | undefined }[];
}): Lease {
  const nqns = [...new Set(o.serving.map((s) => s.nqn))].sort();
  if (nqns.length === 0) return { version: 1, node: o.node, heartbeatMs: o.heartbeatMs, nqns };
  const minBoundS = Math.min(
    ...o.serving.map((s) => s.failoverAfterSeconds ?? DEFAULT_FAILOVER_AFTER_SECONDS),
  );
  return {
    version: 1,
    node: o.node,
    heartbeatMs: o.heartbeatMs,
    fenceAtMs: o.heartbeatMs + Math.floor(minBoundS * 1000 * SELF_FENCE_FRACTION),
    nqns,
  };
}

/** What reading a lease file gave. */
export type LeaseRead =
  | { kind: "missing" }
  | { kind: "malformed"; why: string }
  | { kind: "valid"; lease: Lease };

/** Parses a lease file's text; `node`, when given, must be the lease's node. Never throws. */
export function parseLease(text: string, node?: string): LeaseRead {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    return { kind: "malformed", why: `not JSON: ${(err as Error).message}` };
  }
  const r = v.safeParse(LeaseSchema, json);
  if (!r.success) {
    const issue = r.issues[0];
    return { kind: "malformed", why: `${v.getDotPath(issue) ?? "<root>"}: ${issue.message}` };
  }
  if (node && r.output.node !== node)
    return { kind: "malformed", why: `lease of node ${r.output.node}, this is node ${node}` };
  if (r.output.nqns.length > 0 && r.output.fenceAtMs === undefined)
    return { kind: "malformed", why: "nqns listed without fenceAtMs" };
  return { kind: "valid", lease: r.output };
}

/** Parses a fence record's text; undefined (with why) when it is not a valid version-1 record. */
export function parseFenceRecord(text: string): { record: FenceRecord } | { why: string } {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    return { why: `not JSON: ${(err as Error).message}` };
  }
  const r = v.safeParse(FenceRecordSchema, json);
  if (!r.success) {
    const issue = r.issues[0];
    return { why: `${v.getDotPath(issue) ?? "<root>"}: ${issue.message}` };
  }
  return { record: r.output };
}
