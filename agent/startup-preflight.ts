// The agent's start-up preflight: lib/preflight's plan from the agent's configuration and the
// partitions placed on its node, and the verdict on which findings make the
// agent unusable (so it exits with a clear message instead of failing later in nvmf_tgt).
import type { NVMePartition } from "../api/nvme-partition.ts";
import { StorageError } from "../lib/errors.ts";
import type { CheckResult, PreflightReport } from "../lib/preflight/check.ts";
import type { PreflightPlan, PreflightRole, Transport } from "../lib/preflight/preflight.ts";
import type { AgentConfig } from "./config.ts";

/** The plan for this agent: its backends' roles, its nvmf_tgt -m/-s, and the volumes placed here. Pure. */
export function agentPreflightPlan(
  cfg: Pick<AgentConfig, "backends" | "coreMask" | "spdkMemSizeMb" | "spdkSetup">,
  placed: readonly Pick<NVMePartition, "spec">[],
): PreflightPlan {
  const roles: PreflightRole[] = [];
  if (cfg.backends.includes("spdk")) roles.push("spdk");
  if (cfg.backends.includes("kernel")) roles.push("kernel-target");
  const transports = [
    ...new Set(placed.map((p) => (p.spec.targetOptions?.transport ?? "rdma") as Transport)),
  ].sort();
  return {
    roles,
    transports: transports.length > 0 ? transports : ["tcp"],
    coreMask: cfg.coreMask,
    ...(cfg.spdkMemSizeMb === undefined ? {} : { memSizeMiB: cfg.spdkMemSizeMb }),
    volumes: placed.filter((p) => (p.spec.backend ?? "spdk") === "spdk").length,
    spdkDrives: cfg.spdkSetup !== "",
  };
}

/**
 * The failed checks that make this agent unusable. Only when the agent starts nvmf_tgt itself:
 * too few hugepages for its -s (DPDK cannot initialise) and a core mask naming offline cores
 * (SPDK cannot start its reactors). Everything else (a missing kernel module for one transport,
 * vfio for a drive not handed over yet, a target the host runs) leaves the agent useful for what
 * does work, so it is logged, and the affected partitions report their own failures. Pure.
 */
export function fatalChecks(
  report: PreflightReport,
  cfg: Pick<AgentConfig, "nvmfTgtCommand">,
): CheckResult[] {
  if (cfg.nvmfTgtCommand.length === 0) return [];
  return report.checks.filter((c) => c.status === "fail" && (c.id === "hugepages" || c.id === "cpu-cores"));
}

/** Throws StorageError("invalid") naming every fatal check; returns when there is none. */
export function assertUsable(fatal: readonly CheckResult[]): void {
  if (fatal.length === 0) return;
  throw new StorageError(
    "invalid",
    `preflight: this node cannot run nvmf_tgt: ${fatal.map((c) => `${c.message}${c.fix ? ` (fix: ${c.fix})` : ""}`).join("; ")}`,
  );
}
