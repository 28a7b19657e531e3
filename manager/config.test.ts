// Configuration parsing: defaults, fallbacks, every bad variable reported by name, and lease
// timings that could let two leaders overlap refused.
import { describe, expect, test } from "bun:test";
import { StorageError } from "../lib/errors.ts";
import { parseConfig } from "./config.ts";

const HOST = { hostname: "host-1", randomSuffix: "abcd" };

describe("parseConfig", () => {
  test("defaults", () => {
    expect(parseConfig({}, HOST)).toEqual({
      namespace: "distort-system",
      identity: "host-1_abcd",
      leaderElection: {
        enabled: true,
        leaseName: "distort-manager",
        leaseDurationMs: 15_000,
        renewDeadlineMs: 10_000,
        retryPeriodMs: 2_000,
      },
      workers: 4,
      placementWorkers: 8,
      stalenessMs: 90_000,
      spreadPolicy: "most-free-device",
      placementBackoff: { initialMs: 1000, maxMs: 60_000 },
      thinLvstoreFullPercent: 85,
      lostNodeReleaseAfterMs: 900_000,
      health: { host: "127.0.0.1", port: 8081 },
      logLevel: "info",
      resyncMs: 600_000,
      rebuildsPerCluster: 4,
    });
  });

  test("every variable", () => {
    const cfg = parseConfig(
      {
        DISTORT_KUBECONFIG: "/k",
        DISTORT_NAMESPACE: "ns",
        DISTORT_IDENTITY: "me",
        DISTORT_LEADER_ELECT: "false",
        DISTORT_LEASE_NAME: "l",
        DISTORT_LEASE_DURATION_MS: "3000",
        DISTORT_RENEW_DEADLINE_MS: "2000",
        DISTORT_RETRY_PERIOD_MS: "500",
        DISTORT_WORKERS: "2",
        DISTORT_PLACEMENT_WORKERS: "16",
        DISTORT_HEARTBEAT_STALENESS_MS: "30000",
        DISTORT_SPREAD_POLICY: "least-loaded-node",
        DISTORT_PLACEMENT_BACKOFF_INITIAL_MS: "200",
        DISTORT_PLACEMENT_BACKOFF_MAX_MS: "5000",
        DISTORT_HEALTH_HOST: "0.0.0.0",
        DISTORT_HEALTH_PORT: "0",
        DISTORT_LABEL_SELECTOR: "team=a",
        DISTORT_LOG_LEVEL: "debug",
        DISTORT_RESYNC_MS: "0",
        DISTORT_REBUILDS_PER_CLUSTER: "1",
        DISTORT_LOST_NODE_RELEASE_AFTER_SECONDS: "3600",
      },
      HOST,
    );
    expect(cfg).toMatchObject({
      kubeconfig: "/k",
      namespace: "ns",
      identity: "me",
      leaderElection: {
        enabled: false,
        leaseName: "l",
        leaseDurationMs: 3000,
        renewDeadlineMs: 2000,
        retryPeriodMs: 500,
      },
      workers: 2,
      placementWorkers: 16,
      stalenessMs: 30_000,
      spreadPolicy: "least-loaded-node",
      placementBackoff: { initialMs: 200, maxMs: 5000 },
      health: { host: "0.0.0.0", port: 0 },
      labelSelector: "team=a",
      logLevel: "debug",
      resyncMs: 0,
      rebuildsPerCluster: 1,
      lostNodeReleaseAfterMs: 3_600_000,
    });
  });

  test("DISTORT_REBUILDS_PER_CLUSTER: 0 (none granted) to 10000; anything else is refused by name", () => {
    expect(parseConfig({ DISTORT_REBUILDS_PER_CLUSTER: "0" }, HOST).rebuildsPerCluster).toBe(0);
    expect(parseConfig({ DISTORT_REBUILDS_PER_CLUSTER: " 10000 " }, HOST).rebuildsPerCluster).toBe(10_000);
    for (const bad of ["-1", "10001", "four", "1.5"])
      expect(() => parseConfig({ DISTORT_REBUILDS_PER_CLUSTER: bad }, HOST)).toThrow(
        /DISTORT_REBUILDS_PER_CLUSTER=/,
      );
  });

  test("downward-API fallbacks: POD_NAMESPACE, POD_NAME; KUBECONFIG", () => {
    const cfg = parseConfig({ POD_NAMESPACE: "pns", POD_NAME: "mgr-7f9", KUBECONFIG: "/kc" }, HOST);
    expect(cfg.namespace).toBe("pns");
    expect(cfg.identity).toBe("mgr-7f9_abcd");
    expect(cfg.kubeconfig).toBe("/kc");
  });

  test("empty values count as unset", () => {
    expect(parseConfig({ DISTORT_NAMESPACE: "", POD_NAMESPACE: "x" }, HOST).namespace).toBe("x");
  });

  test("lists every bad variable by name", () => {
    let err: unknown;
    try {
      parseConfig(
        {
          DISTORT_WORKERS: "0",
          DISTORT_SPREAD_POLICY: "random",
          DISTORT_LEADER_ELECT: "maybe",
          DISTORT_HEALTH_PORT: "8x",
          DISTORT_LOST_NODE_RELEASE_AFTER_SECONDS: "0",
        },
        HOST,
      );
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("invalid");
    const msg = (err as Error).message;
    for (const name of [
      "DISTORT_WORKERS",
      "DISTORT_SPREAD_POLICY",
      "DISTORT_LEADER_ELECT",
      "DISTORT_HEALTH_PORT",
      "DISTORT_LOST_NODE_RELEASE_AFTER_SECONDS",
    ]) {
      expect(msg).toContain(name);
    }
  });

  test("refuses lease timings under which two leaders could overlap", () => {
    expect(() =>
      parseConfig(
        {
          DISTORT_LEASE_DURATION_MS: "2000",
          DISTORT_RENEW_DEADLINE_MS: "2000",
          DISTORT_RETRY_PERIOD_MS: "500",
        },
        HOST,
      ),
    ).toThrow(/leaseDuration must be greater than renewDeadline/);
    // ...unless leader election is off, where they are unused.
    expect(
      parseConfig(
        {
          DISTORT_LEADER_ELECT: "false",
          DISTORT_LEASE_DURATION_MS: "2000",
          DISTORT_RENEW_DEADLINE_MS: "2000",
        },
        HOST,
      ).leaderElection.enabled,
    ).toBe(false);
  });

  test("refuses a backoff maximum below its initial delay", () => {
    expect(() =>
      parseConfig(
        { DISTORT_PLACEMENT_BACKOFF_INITIAL_MS: "5000", DISTORT_PLACEMENT_BACKOFF_MAX_MS: "1000" },
        HOST,
      ),
    ).toThrow(/BACKOFF_MAX_MS/);
  });
});
