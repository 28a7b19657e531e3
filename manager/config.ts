// The manager's configuration: environment variables (the Deployment sets them) parsed and
// validated with valibot into one typed object. Pure: main.ts hands in process.env.
import * as v from "valibot";
import { wholeNumber } from "../lib/config-schemas.ts";
import { StorageError } from "../lib/errors.ts";
import { validateTimings } from "../lib/kube/leader.ts";
import { DEFAULT_REBUILDS_PER_CLUSTER } from "./replicas/rebuild-grants.ts";

/** Highest DISTORT_REBUILDS_PER_CLUSTER accepted. */
export const MAX_REBUILDS_PER_CLUSTER = 10_000;

/** A whole number, surrounding spaces allowed. */
const int = (min: number, max?: number) => v.pipe(v.string(), v.trim(), wholeNumber(min, max));
const bool = v.pipe(
  v.string(),
  v.trim(),
  v.toLowerCase(),
  v.picklist(["true", "false", "1", "0", "yes", "no"], "must be true or false"),
  v.transform((s) => s === "true" || s === "1" || s === "yes"),
);
const text = (max: number) =>
  v.pipe(v.string(), v.trim(), v.minLength(1, "must not be empty"), v.maxLength(max));

/**
 * Every variable the manager reads, with its default. The first name listed is the canonical
 * one; later names are the conventional fallbacks (POD_NAMESPACE from the downward API...).
 */
const VARIABLES = {
  kubeconfig: { env: ["DISTORT_KUBECONFIG", "KUBECONFIG"], schema: text(4096), default: undefined },
  namespace: { env: ["DISTORT_NAMESPACE", "POD_NAMESPACE"], schema: text(63), default: "distort-system" },
  identity: { env: ["DISTORT_IDENTITY"], schema: text(128), default: undefined },
  podName: { env: ["POD_NAME"], schema: text(253), default: undefined },
  leaderElect: { env: ["DISTORT_LEADER_ELECT"], schema: bool, default: "true" },
  leaseName: { env: ["DISTORT_LEASE_NAME"], schema: text(253), default: "distort-manager" },
  leaseDurationMs: { env: ["DISTORT_LEASE_DURATION_MS"], schema: int(1000), default: "15000" },
  renewDeadlineMs: { env: ["DISTORT_RENEW_DEADLINE_MS"], schema: int(500), default: "10000" },
  retryPeriodMs: { env: ["DISTORT_RETRY_PERIOD_MS"], schema: int(100), default: "2000" },
  workers: { env: ["DISTORT_WORKERS"], schema: int(1, 256), default: "4" },
  placementWorkers: { env: ["DISTORT_PLACEMENT_WORKERS"], schema: int(1, 256), default: "8" },
  stalenessMs: { env: ["DISTORT_HEARTBEAT_STALENESS_MS"], schema: int(1000), default: "90000" },
  spreadPolicy: {
    env: ["DISTORT_SPREAD_POLICY"],
    schema: v.picklist(
      ["most-free-device", "least-loaded-node"],
      "must be most-free-device or least-loaded-node",
    ),
    default: "most-free-device",
  },
  backoffInitialMs: { env: ["DISTORT_PLACEMENT_BACKOFF_INITIAL_MS"], schema: int(10), default: "1000" },
  backoffMaxMs: { env: ["DISTORT_PLACEMENT_BACKOFF_MAX_MS"], schema: int(10), default: "60000" },
  thinLvstoreFullPercent: {
    env: ["DISTORT_THIN_LVSTORE_FULL_PERCENT"],
    schema: int(1, 100),
    default: "85",
  },
  lostNodeReleaseAfterSeconds: {
    env: ["DISTORT_LOST_NODE_RELEASE_AFTER_SECONDS"],
    schema: int(1, 30 * 24 * 3600),
    default: "900",
  },
  healthHost: { env: ["DISTORT_HEALTH_HOST"], schema: text(255), default: "127.0.0.1" },
  healthPort: { env: ["DISTORT_HEALTH_PORT"], schema: int(0, 65535), default: "8081" },
  labelSelector: { env: ["DISTORT_LABEL_SELECTOR"], schema: text(1024), default: undefined },
  logLevel: {
    env: ["DISTORT_LOG_LEVEL"],
    schema: v.picklist(["debug", "info", "warn", "error"], "must be debug, info, warn or error"),
    default: "info",
  },
  resyncMs: { env: ["DISTORT_RESYNC_MS"], schema: int(0), default: "600000" },
  rebuildsPerCluster: {
    env: ["DISTORT_REBUILDS_PER_CLUSTER"],
    schema: int(0, MAX_REBUILDS_PER_CLUSTER),
    default: String(DEFAULT_REBUILDS_PER_CLUSTER),
  },
} as const;

export interface ManagerConfig {
  /** Path of a kubeconfig; undefined means the in-cluster service account. */
  kubeconfig?: string;
  /** Namespace of the Lease and of the RDMAStorageNode records the agents publish. */
  namespace: string;
  /** Unique per process: the Lease holder identity and the Events' reportingInstance. */
  identity: string;
  leaderElection: {
    enabled: boolean;
    leaseName: string;
    leaseDurationMs: number;
    renewDeadlineMs: number;
    retryPeriodMs: number;
  };
  /** Workers of the claim, capacity and storage-node controllers. */
  workers: number;
  placementWorkers: number;
  /** Heartbeats older than this make a storage node stale. */
  stalenessMs: number;
  spreadPolicy: "most-free-device" | "least-loaded-node";
  placementBackoff: { initialMs: number; maxMs: number };
  /**
   * Placement refuses a new thin partition on a drive whose lvstore the agent reported fuller
   * than this (percent of its data clusters in use): thin volumes write into that free space.
   */
  thinLvstoreFullPercent: number;
  /**
   * How long a storage node may go without a heartbeat (or without an RDMAStorageNode) before the
   * manager releases the partitions being deleted there in its agent's place, their room held as
   * leftovers on the drives until that agent deletes the volumes.
   */
  lostNodeReleaseAfterMs: number;
  health: { host: string; port: number };
  /**
   * Restricts every watch (devices, claims, partitions, nodes) to labelled objects, so several
   * independent managers can share one API server (staged rollouts, tests). Unset in production.
   */
  labelSelector?: string;
  logLevel: "debug" | "info" | "warn" | "error";
  /** Period at which every cached object is reconciled again; 0 disables it. */
  resyncMs: number;
  /**
   * Most rebuilds of replicated volumes' copies running at once across the cluster (slots the
   * manager grants in status.rebuildSlot); 0: none is granted, every rebuild waits.
   */
  rebuildsPerCluster: number;
}

/** Host facts used for defaults, passed in so parsing stays pure. */
export interface ConfigHost {
  hostname: string;
  /** A short random string making the default identity unique per process. */
  randomSuffix: string;
}

/**
 * Parses `env`. Throws StorageError("invalid") listing every bad variable by name (not only the
 * first), or when the lease timings could let two leaders overlap.
 */
export function parseConfig(
  env: Readonly<Record<string, string | undefined>>,
  host: ConfigHost,
): ManagerConfig {
  const raw: Record<string, unknown> = {};
  const problems: string[] = [];
  for (const [field, spec] of Object.entries(VARIABLES)) {
    const name = spec.env.find((n) => env[n] !== undefined && env[n] !== "");
    const value = name ? env[name] : spec.default;
    if (value === undefined) continue;
    const r = v.safeParse(spec.schema as v.GenericSchema, value);
    if (r.success) raw[field] = r.output;
    else
      problems.push(`${name ?? spec.env[0]}=${JSON.stringify(value)}: ${r.issues[0]?.message ?? "invalid"}`);
  }
  if (problems.length > 0) throw new StorageError("invalid", `manager configuration: ${problems.join("; ")}`);
  const opt = (k: string) => raw[k] as string | undefined;
  const cfg: ManagerConfig = {
    ...(opt("kubeconfig") ? { kubeconfig: opt("kubeconfig") } : {}),
    namespace: raw.namespace as string,
    identity: opt("identity") ?? `${opt("podName") ?? host.hostname}_${host.randomSuffix}`,
    leaderElection: {
      enabled: raw.leaderElect as boolean,
      leaseName: raw.leaseName as string,
      leaseDurationMs: raw.leaseDurationMs as number,
      renewDeadlineMs: raw.renewDeadlineMs as number,
      retryPeriodMs: raw.retryPeriodMs as number,
    },
    workers: raw.workers as number,
    placementWorkers: raw.placementWorkers as number,
    stalenessMs: raw.stalenessMs as number,
    spreadPolicy: raw.spreadPolicy as ManagerConfig["spreadPolicy"],
    placementBackoff: { initialMs: raw.backoffInitialMs as number, maxMs: raw.backoffMaxMs as number },
    thinLvstoreFullPercent: raw.thinLvstoreFullPercent as number,
    lostNodeReleaseAfterMs: (raw.lostNodeReleaseAfterSeconds as number) * 1000,
    health: { host: raw.healthHost as string, port: raw.healthPort as number },
    ...(opt("labelSelector") ? { labelSelector: opt("labelSelector") } : {}),
    logLevel: raw.logLevel as ManagerConfig["logLevel"],
    resyncMs: raw.resyncMs as number,
    rebuildsPerCluster: raw.rebuildsPerCluster as number,
  };
  if (cfg.placementBackoff.maxMs < cfg.placementBackoff.initialMs) {
    throw new StorageError(
      "invalid",
      "manager configuration: DISTORT_PLACEMENT_BACKOFF_MAX_MS must be >= DISTORT_PLACEMENT_BACKOFF_INITIAL_MS",
    );
  }
  if (cfg.leaderElection.enabled) {
    const { leaseDurationMs, renewDeadlineMs, retryPeriodMs } = cfg.leaderElection;
    try {
      validateTimings(leaseDurationMs, renewDeadlineMs, retryPeriodMs);
    } catch (err) {
      throw new StorageError("invalid", `manager configuration: ${(err as Error).message}`, { cause: err });
    }
  }
  return cfg;
}
