// When a serving node stops serving a replicated volume on its own: the manager moves the volume
// once the node has gone failoverAfterSeconds without a heartbeat, and fences the node from the
// copies on other nodes. Its local copy it cannot fence: a node cut off from the API server (its
// agent alive, its target still reachable by consumers) would go on acknowledging writes that
// land on its local copy alone, which the failover has already left out. So the agent fences
// itself first: past SELF_FENCE_FRACTION of the bound since its last heartbeat the API server
// took, the volume's export on this node turns standby (ANA inaccessible, then no namespace);
// it serves again only after a newer heartbeat went through and the volume, read afresh, still
// names this node. Pure.
import { DEFAULT_FAILOVER_AFTER_SECONDS } from "../../api/index.ts";

/** The share of a volume's failoverAfterSeconds after which its serving node fences itself. */
export const SELF_FENCE_FRACTION = 0.6;

/**
 * True when this node must stop serving a volume whose bound is `failoverAfterSeconds`: the last
 * heartbeat the API server took (or, before any, the agent's start) is older than
 * SELF_FENCE_FRACTION of the bound.
 */
export function selfFenceDue(o: {
  lastHeartbeatMs: number | undefined;
  startedMs: number;
  failoverAfterSeconds: number | undefined;
  nowMs: number;
}): boolean {
  const since = o.lastHeartbeatMs ?? o.startedMs;
  const boundMs = (o.failoverAfterSeconds ?? DEFAULT_FAILOVER_AFTER_SECONDS) * 1000;
  return o.nowMs - since > boundMs * SELF_FENCE_FRACTION;
}

/** True when a node that fenced itself at `fencedAtMs` may serve again: a heartbeat went through since. */
export function selfFenceLifted(lastHeartbeatMs: number | undefined, fencedAtMs: number): boolean {
  return lastHeartbeatMs !== undefined && lastHeartbeatMs > fencedAtMs;
}
