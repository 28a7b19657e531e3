// Every metric family the distort-csi binary exports, registered in one place: runCsi uses it, and
// the metric-coverage test calls it to learn what the CSI driver can show.
import { callMetrics } from "../lib/grpc/call-metrics.ts";
import type { Registry } from "../lib/metrics.ts";
import { csiNodeMetrics } from "./node/metrics.ts";

/** How often the node plugin lists the host's NVMe subsystems for its path metrics. */
export const NODE_PATH_PERIOD_MS = 15_000;

/**
 * Registers the CSI families on `registry` (once per registry): per-method call counts and
 * durations of every CSI service, and the node plugin's connection families.
 */
export function registerCsiMetrics(registry: Registry) {
  return {
    measure: callMetrics(registry, "distort_csi", "CSI"),
    node: csiNodeMetrics(registry),
  };
}
