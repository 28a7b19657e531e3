// The shapes discovery produces: one validated controller per source, the merged device list the
// reporter publishes, and per-source health that decides whether absence may be trusted.
import type { Backend } from "../../api/common.ts";

/** Where a controller was seen: bound to the kernel nvme driver, or owned by SPDK. */
export type SourceName = "kernel" | "spdk";

/** ok: every controller read and validated; degraded: some rejected; failed: the source gave nothing usable. */
export type SourceState = "ok" | "degraded" | "failed";

/** Health of one discovery source. `reason` is CamelCase so it can become a condition reason as is. */
export interface SourceHealth {
  readonly state: SourceState;
  readonly reason: string;
  readonly message: string;
}

/** Why a controller was not advertised although it may be local hardware we are meant to use. */
export interface InventoryProblem {
  readonly source: SourceName;
  /** Controller (nvme0, Nvme0) or bdev name the problem is about; empty when not attributable. */
  readonly controller: string;
  /** CamelCase, e.g. Namespace1Missing, SerialInvalid, PciAddressInvalid, CapacityInvalid. */
  readonly reason: string;
  readonly message: string;
  /** What is known of the controller's identity, so an operator can exclude a broken drive. */
  readonly serial?: string;
  readonly pciAddress?: string;
}

/** Controllers deliberately left out; not a fault, so the scan stays complete. */
export interface SkippedController {
  readonly source: SourceName;
  readonly controller: string;
  /** Mounted, Excluded, NotAllowed, ControllerDead, ControllerDisabled. */
  readonly reason: string;
  readonly serial?: string;
}

/** A controller that passed validation, as one source reported it. */
export interface SourceController {
  readonly source: SourceName;
  /** Kernel controller (nvme0) or SPDK bdev_nvme controller name (Nvme0). */
  readonly controller: string;
  /** Exact serial: the NVMe field without its space padding, nothing else changed. */
  readonly serial: string;
  /** Normalized 0000:bb:dd.f. */
  readonly pciAddress: string;
  readonly model: string;
  /** -1 when unknown. */
  readonly numaNode: number;
  /** Size of namespace ID 1 in bytes. */
  readonly namespace1Bytes: number;
  /** namespace1Bytes minus the reserve, rounded down to the allocation unit; always > 0. */
  readonly allocatableBytes: number;
  /** Kernel only: the namespace 1 block device as lsblk names it (nvme0n1). */
  readonly blockDevice?: string;
  /** SPDK only: the namespace 1 bdev (Nvme0n1). */
  readonly bdev?: string;
}

/**
 * Everything one source found in one scan, before filtering and merging. `failure` is set when the
 * source gave nothing trustworthy (then `controllers` is empty); `notConfigured` when the node runs
 * no such source at all, which is a complete (empty) answer rather than a fault.
 */
export interface SourceScan {
  readonly source: SourceName;
  readonly failure?: { readonly reason: string; readonly message: string };
  readonly notConfigured?: boolean;
  /** SPDK only: the target's version ("v25.05.1") when it was read this scan. */
  readonly version?: string;
  /** Local controllers seen, valid or not (for messages). */
  readonly found: number;
  readonly controllers: readonly SourceController[];
  readonly problems: readonly InventoryProblem[];
  readonly skipped: readonly SkippedController[];
}

/** One physical drive after merging the sources by serial. */
export interface DiscoveredDevice {
  readonly serial: string;
  readonly pciAddress: string;
  readonly model: string;
  readonly numaNode: number;
  readonly namespace1Bytes: number;
  readonly allocatableBytes: number;
  /** Who owns the controller now; SPDK when both sources report the serial. */
  readonly activeBackend: Backend;
  readonly kernel?: { readonly controller: string; readonly blockDevice?: string };
  readonly spdk?: { readonly controller: string; readonly bdev?: string };
}

/** The result of one discovery pass. Never thrown away as a whole because one part failed. */
export interface DiscoveryResult {
  /** Sorted by PCI address, then serial. */
  readonly devices: readonly DiscoveredDevice[];
  readonly kernel: SourceHealth;
  readonly spdk: SourceHealth;
  /** The SPDK target's version ("v25.05.1") when this pass read it. */
  readonly spdkVersion?: string;
  /**
   * True only when both sources are ok: then a device missing from `devices` is really gone (or
   * deliberately skipped). When false, absence proves nothing.
   */
  readonly complete: boolean;
  readonly problems: readonly InventoryProblem[];
  readonly skipped: readonly SkippedController[];
}

/** Health of a source that ran to the end: degraded when any controller was rejected. */
export function healthFromProblems(
  problems: readonly InventoryProblem[],
  found: number,
  advertised: number,
): SourceHealth {
  if (problems.length === 0) {
    return {
      state: "ok",
      reason: "Scanned",
      message: `${found} local controller(s), ${advertised} advertised`,
    };
  }
  const reasons = new Set(problems.map((p) => p.reason));
  const only = reasons.size === 1 ? [...reasons][0] : undefined;
  const detail = problems
    .slice(0, 8)
    .map((p) => `${p.controller || "?"}: ${p.message}`)
    .join("; ");
  const more = problems.length > 8 ? `; and ${problems.length - 8} more` : "";
  return {
    state: "degraded",
    reason: only ?? "ControllersRejected",
    message: `${problems.length} controller(s) rejected, ${advertised} advertised: ${detail}${more}`,
  };
}

/** Health of a source that could not be read at all. */
export function failedHealth(reason: string, message: string): SourceHealth {
  return { state: "failed", reason, message };
}
