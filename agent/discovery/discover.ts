// One discovery pass over both sources at once: kernel sysfs (plus lsblk) and SPDK, assembled
// into a single result. Each source fails on its own; the other's findings are always kept.
import type { Exec } from "../../lib/exec.ts";
import type { HostFs } from "../../lib/fs.ts";
import type { Logger } from "../../lib/log.ts";
import type { DeviceFilter } from "./device-filter.ts";
import type { DiscoveryResult } from "./inventory.ts";
import { scanKernel } from "./kernel-source.ts";
import { assembleInventory } from "./merge.ts";
import { type SpdkInventorySource, scanSpdk } from "./spdk-source.ts";

export interface DiscoveryDeps {
  /** Host filesystem whose /sys is read. */
  readonly fs: HostFs;
  /** Runs lsblk. */
  readonly exec: Exec;
  /** Undefined on a node that runs no SPDK: the SPDK source is then complete and empty. */
  readonly spdk?: SpdkInventorySource;
  readonly logger: Logger;
}

export interface DiscoveryOptions {
  /** NVME_ALLOWED_DEVICES / NVME_EXCLUDE_DEVICES as lists of serials or PCI addresses. */
  readonly filter?: DeviceFilter;
  readonly lsblkTimeoutMs?: number;
}

/**
 * Discovers the node's NVMe drives. Never rejects: a source that cannot be read is reported
 * through its health and `complete: false`. Read-only and safe to run concurrently with itself.
 */
export async function discoverDevices(
  deps: DiscoveryDeps,
  opts: DiscoveryOptions = {},
): Promise<DiscoveryResult> {
  const [kernel, spdk] = await Promise.all([
    scanKernel(deps.fs, deps.exec, { lsblkTimeoutMs: opts.lsblkTimeoutMs }),
    scanSpdk(deps.spdk),
  ]);
  const result = assembleInventory(kernel, spdk, opts.filter);
  for (const p of result.problems) {
    deps.logger.warn("NVMe controller not advertised", {
      source: p.source,
      controller: p.controller,
      reason: p.reason,
      detail: p.message,
    });
  }
  for (const [source, h] of [
    ["kernel", result.kernel],
    ["spdk", result.spdk],
  ] as const) {
    if (h.state === "failed")
      deps.logger.warn("NVMe inventory source failed", { source, reason: h.reason, detail: h.message });
  }
  deps.logger.debug("NVMe discovery", {
    devices: result.devices.length,
    complete: result.complete,
    skipped: result.skipped.map((s) => `${s.source}/${s.controller}:${s.reason}`),
  });
  return result;
}
