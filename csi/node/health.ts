// The pure verdict behind NodeGetVolumeHealth: from what the node observed about one staged volume
// (its subsystem's controllers, its device node, its mounts) to the adverse conditions CSI reports.
import type { ConnectedSubsystem } from "../host/nvme-initiator.ts";

/** What was observed about a mount point of the volume. */
export interface MountObservation {
  readonly path: string;
  /** Something is mounted there. */
  readonly mounted: boolean;
  /** What is mounted is this volume (same device, or the staging mount for a bind). */
  readonly ours: boolean;
  /** statfs failed there (EIO, ENOTCONN...): the mount exists but is broken. */
  readonly statfsError?: string;
}

export interface HealthObservation {
  /** The volume's subsystem as the initiator lists it; undefined when it has no controller. */
  readonly subsystem: ConnectedSubsystem | undefined;
  /** The recorded block device node exists. */
  readonly deviceExists: boolean;
  /** Staging mount (mount volumes only). */
  readonly staging?: MountObservation;
  /** The publish path the caller asked about, when it gave one. */
  readonly published?: MountObservation;
}

export interface HealthIssue {
  readonly status: "DEGRADED" | "INACCESSIBLE";
  /** CamelCase, for machines. */
  readonly reason: string;
  readonly message: string;
}

function mountIssue(what: string, m: MountObservation): HealthIssue | undefined {
  if (!m.mounted)
    return {
      status: "INACCESSIBLE",
      reason: `${what}MountMissing`,
      message: `nothing is mounted at ${m.path}`,
    };
  if (!m.ours)
    return {
      status: "INACCESSIBLE",
      reason: `${what}MountForeign`,
      message: `${m.path} shows another filesystem`,
    };
  if (m.statfsError !== undefined) {
    return {
      status: "INACCESSIBLE",
      reason: `${what}MountBroken`,
      message: `statfs ${m.path} failed: ${m.statfsError}`,
    };
  }
  return undefined;
}

/**
 * Adverse conditions, most fundamental first; empty when the volume is healthy. A subsystem with
 * no live controller makes the volume inaccessible; one with some paths down is degraded.
 */
export function assessHealth(o: HealthObservation): HealthIssue[] {
  const issues: HealthIssue[] = [];
  const paths = o.subsystem?.paths ?? [];
  const live = paths.filter((p) => p.state === "live");
  if (paths.length === 0) {
    issues.push({
      status: "INACCESSIBLE",
      reason: "ControllerGone",
      message: "the subsystem has no controller on this node",
    });
  } else if (live.length === 0) {
    issues.push({
      status: "INACCESSIBLE",
      reason: "ControllerNotLive",
      message: `no live controller: ${paths.map((p) => `${p.name} ${p.state}`).join(", ")}`,
    });
  } else if (live.length < paths.length) {
    issues.push({
      status: "DEGRADED",
      reason: "PathDown",
      message: `${paths.length - live.length} of ${paths.length} paths not live: ${paths
        .filter((p) => p.state !== "live")
        .map((p) => `${p.name} ${p.state}`)
        .join(", ")}`,
    });
  }
  if (!o.deviceExists) {
    issues.push({
      status: "INACCESSIBLE",
      reason: "DeviceMissing",
      message: "the namespace's block device is gone",
    });
  }
  const staging = o.staging && mountIssue("Staging", o.staging);
  if (staging) issues.push(staging);
  const published = o.published && mountIssue("Publish", o.published);
  if (published) issues.push(published);
  return issues;
}
