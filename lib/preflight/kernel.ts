// Kernel modules and features a role needs: the NVMe-oF initiator (nvme_tcp / nvme_rdma,
// nvme_auth for DH-HMAC-CHAP, nvme_keyring for TLS), the kernel target (nvmet, its transports,
// configfs), and vfio / uio with an IOMMU for drives handed to SPDK.
import type { HostFs } from "../fs.ts";
import type { CheckResult, CheckStatus } from "./check.ts";

/**
 * True when the module is loaded or built in with a sysfs entry (/sys/module/<name>), else when
 * /proc/modules lists it. Module names use underscores, as the kernel shows them.
 */
export async function moduleLoaded(fs: HostFs, name: string): Promise<boolean> {
  if (await fs.exists(`/sys/module/${name}`)) return true;
  try {
    return (await fs.readFile("/proc/modules")).split("\n").some((l) => l.split(" ")[0] === name);
  } catch {
    return false;
  }
}

/** A module a role needs: `missing` is the status when it is absent, `why` says what breaks. */
export interface ModuleNeed {
  readonly name: string;
  readonly missing: Exclude<CheckStatus, "pass" | "skip">;
  readonly why: string;
}

/** Checks each module; one result per module, id `module:<name>`. */
export async function checkModules(fs: HostFs, needs: readonly ModuleNeed[]): Promise<CheckResult[]> {
  const out: CheckResult[] = [];
  for (const n of needs) {
    const loaded = await moduleLoaded(fs, n.name);
    out.push(
      loaded
        ? { id: `module:${n.name}`, status: "pass", message: `${n.name} loaded` }
        : {
            id: `module:${n.name}`,
            status: n.missing,
            message: `${n.name} not loaded: ${n.why}`,
            fix: `modprobe ${n.name}`,
          },
    );
  }
  return out;
}

/**
 * configfs for the kernel target: pass when /sys/kernel/config/nvmet exists (configfs mounted and
 * nvmet loaded), fail when /proc/mounts shows no configfs or nvmet is absent from a mounted one.
 */
export async function checkConfigfs(fs: HostFs): Promise<CheckResult> {
  const id = "configfs";
  if (await fs.isDirectory("/sys/kernel/config/nvmet")) {
    return { id, status: "pass", message: "configfs mounted with nvmet at /sys/kernel/config/nvmet" };
  }
  let mounted: boolean | null = null;
  try {
    mounted = (await fs.readFile("/proc/mounts")).split("\n").some((l) => l.split(" ")[2] === "configfs");
  } catch {
    mounted = null;
  }
  if (mounted === false) {
    return {
      id,
      status: "fail",
      message: "configfs is not mounted: the kernel target (nvmet) is configured through it",
      fix: "mount -t configfs none /sys/kernel/config",
    };
  }
  return {
    id,
    status: "fail",
    message: "/sys/kernel/config/nvmet does not exist: nvmet is not loaded or configfs is not mounted there",
    fix: "modprobe nvmet && mount -t configfs none /sys/kernel/config",
  };
}

/**
 * vfio-pci or uio for drives bound to SPDK, and the IOMMU vfio needs: pass with vfio_pci and IOMMU
 * groups (or vfio's unsafe no-IOMMU mode, as a warning), or with uio_pci_generic / igb_uio; fail
 * when none of the drivers is loaded.
 */
export async function checkUserspaceDriver(fs: HostFs): Promise<CheckResult[]> {
  const vfio = await moduleLoaded(fs, "vfio_pci");
  const uio = (await moduleLoaded(fs, "uio_pci_generic")) || (await moduleLoaded(fs, "igb_uio"));
  let groups = 0;
  try {
    groups = (await fs.readdir("/sys/kernel/iommu_groups")).length;
  } catch {
    groups = 0;
  }
  let noiommu = false;
  try {
    noiommu = /^[Yy1]/.test(
      (await fs.readFile("/sys/module/vfio/parameters/enable_unsafe_noiommu_mode")).trim(),
    );
  } catch {
    noiommu = false;
  }
  const driver: CheckResult =
    vfio || uio
      ? {
          id: "userspace-driver",
          status: "pass",
          message: `${[vfio ? "vfio_pci" : "", uio ? "uio" : ""].filter(Boolean).join(" and ")} loaded`,
        }
      : {
          id: "userspace-driver",
          status: "fail",
          message: "neither vfio_pci nor uio_pci_generic is loaded: SPDK cannot take drives from the kernel",
          fix: "modprobe vfio-pci (or uio_pci_generic where there is no IOMMU)",
        };
  let iommu: CheckResult;
  if (!vfio) {
    iommu = {
      id: "iommu",
      status: "skip",
      message: uio ? "uio needs no IOMMU" : "vfio_pci not loaded",
      details: { groups },
    };
  } else if (groups > 0) {
    iommu = { id: "iommu", status: "pass", message: `IOMMU enabled (${groups} groups)`, details: { groups } };
  } else if (noiommu) {
    iommu = {
      id: "iommu",
      status: "warn",
      message: "no IOMMU groups; vfio runs in unsafe no-IOMMU mode (no DMA isolation)",
      details: { groups },
    };
  } else {
    iommu = {
      id: "iommu",
      status: "fail",
      message: "vfio_pci is loaded but there are no IOMMU groups: vfio cannot bind drives",
      fix: "enable the IOMMU (intel_iommu=on or amd_iommu=on, VT-d / AMD-Vi in firmware), or use uio_pci_generic",
      details: { groups },
    };
  }
  return [driver, iommu];
}
