// The node preflight: which checks a role needs (storage-node agent with SPDK and/or the kernel
// target, consumer node with the NVMe-oF initiator) and running them through the HostFs and Exec
// ports, so a fake /sys and /proc tree and a fake `nvme` stand in for a host in tests.
import type { Exec } from "../exec.ts";
import type { HostFs } from "../fs.ts";
import { type CheckResult, type PreflightReport, reportOf } from "./check.ts";
import { checkCoreMask, readOnlineCpus } from "./cpu.ts";
import { checkHugepages, readHugepages } from "./hugepages.ts";
import { checkConfigfs, checkModules, checkUserspaceDriver, type ModuleNeed } from "./kernel.ts";
import { checkNvmeCli } from "./nvme-cli.ts";
import { checkTlsKernel } from "./tls.ts";

/** The parts of a node a preflight covers; a role not listed is not checked at all. */
export type PreflightRole = "spdk" | "kernel-target" | "initiator";
export const PREFLIGHT_ROLES: readonly PreflightRole[] = ["spdk", "kernel-target", "initiator"];

export type Transport = "tcp" | "rdma";

/** What the node is configured for; the agent and the CSI node fill it from their config. */
export interface PreflightPlan {
  readonly roles: readonly PreflightRole[];
  /** Transports the node serves (target roles) or connects over (initiator). Default ["tcp"]. */
  readonly transports?: readonly Transport[];
  /** nvmf_tgt -m; default "0x1" (the chart's default). */
  readonly coreMask?: string;
  /** nvmf_tgt -s in MiB, when set. */
  readonly memSizeMiB?: number;
  /** Volumes the node is meant to serve, for the hugepage estimate. Default 0. */
  readonly volumes?: number;
  /** Drives are handed to SPDK (a setup script binds them to vfio/uio); checks the driver and IOMMU. */
  readonly spdkDrives?: boolean;
}

export interface PreflightPorts {
  /** Reads /sys and /proc; its root is "/" on a host, a fixture tree in tests. */
  readonly fs: HostFs;
  /** Runs `nvme version`. */
  readonly exec: Exec;
}

const INITIATOR_TRANSPORT: Record<Transport, ModuleNeed> = {
  tcp: { name: "nvme_tcp", missing: "fail", why: "volumes served over NVMe/TCP cannot be connected" },
  rdma: { name: "nvme_rdma", missing: "fail", why: "volumes served over NVMe/RDMA cannot be connected" },
};
const TARGET_TRANSPORT: Record<Transport, ModuleNeed> = {
  tcp: { name: "nvmet_tcp", missing: "fail", why: "the kernel target cannot listen on NVMe/TCP" },
  rdma: { name: "nvmet_rdma", missing: "fail", why: "the kernel target cannot listen on NVMe/RDMA" },
};

/**
 * Runs every check the plan's roles need, in a fixed order (SPDK, kernel target, initiator).
 * Never throws: a fact that cannot be read becomes a warn or fail result naming it.
 */
export async function runPreflight(plan: PreflightPlan, ports: PreflightPorts): Promise<PreflightReport> {
  const roles = new Set(plan.roles);
  const transports = plan.transports && plan.transports.length > 0 ? plan.transports : (["tcp"] as const);
  const checks: CheckResult[] = [];
  if (roles.has("spdk")) {
    checks.push(
      checkHugepages(await readHugepages(ports.fs), {
        ...(plan.memSizeMiB === undefined ? {} : { memSizeMiB: plan.memSizeMiB }),
        volumes: plan.volumes ?? 0,
      }),
    );
    checks.push(checkCoreMask(plan.coreMask ?? "0x1", await readOnlineCpus(ports.fs)));
    if (plan.spdkDrives) checks.push(...(await checkUserspaceDriver(ports.fs)));
    else
      checks.push({
        id: "userspace-driver",
        status: "skip",
        message: "no SPDK setup script configured: drives are bound already or not handed to SPDK",
      });
  }
  if (roles.has("kernel-target")) {
    checks.push(await checkConfigfs(ports.fs));
    checks.push(
      ...(await checkModules(ports.fs, [
        { name: "nvmet", missing: "fail", why: "the kernel target backend cannot export volumes" },
        ...transports.map((t) => TARGET_TRANSPORT[t]),
      ])),
    );
  }
  if (roles.has("initiator")) {
    checks.push(
      ...(await checkModules(ports.fs, [
        { name: "nvme_fabrics", missing: "fail", why: "no NVMe-oF connect at all" },
        ...transports.map((t) => INITIATOR_TRANSPORT[t]),
        { name: "nvme_auth", missing: "warn", why: "volumes with DH-HMAC-CHAP secrets cannot connect" },
        { name: "nvme_keyring", missing: "warn", why: "volumes over TLS cannot connect" },
      ])),
    );
    checks.push(await checkTlsKernel(ports.fs));
    checks.push(await checkNvmeCli(ports.exec));
  }
  return reportOf(checks);
}
