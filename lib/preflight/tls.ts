// Whether this host's kernel can connect NVMe/TCP with TLS: the host driver takes the PSK from
// the kernel's ".nvme" keyring (drivers/nvme/common/keyring.c) and hands the handshake to tlshd,
// which arrived with Linux 6.7; the keyring shows in /proc/keys once nvme_keyring is loaded.
import type { HostFs } from "../fs.ts";
import type { CheckResult } from "./check.ts";

/** The first kernel whose NVMe/TCP host does TLS (the .nvme keyring and the handshake upcall). */
export const TLS_KERNEL = { major: 6, minor: 7 } as const;

/** "6.18.44-fc-v857" -> {6, 18}; undefined when it does not start with major.minor. */
export function kernelVersion(release: string): { major: number; minor: number } | undefined {
  const m = /^(\d+)\.(\d+)/.exec(release.trim());
  return m ? { major: Number(m[1]), minor: Number(m[2]) } : undefined;
}

/**
 * Reads /proc/sys/kernel/osrelease and /proc/keys. pass: 6.7 or later with the .nvme keyring
 * present; warn (TLS volumes will not connect, others do) otherwise, saying which it is.
 */
export async function checkTlsKernel(fs: HostFs): Promise<CheckResult> {
  const release = (await fs.readFile("/proc/sys/kernel/osrelease").catch(() => "")).trim();
  const v = kernelVersion(release);
  const id = "nvme-tls";
  if (!v || v.major < TLS_KERNEL.major || (v.major === TLS_KERNEL.major && v.minor < TLS_KERNEL.minor)) {
    return {
      id,
      status: "warn",
      message: `kernel ${release || "(unknown)"} cannot connect NVMe/TCP with TLS (it needs Linux ${TLS_KERNEL.major}.${TLS_KERNEL.minor} or later for the .nvme keyring and the TLS handshake): volumes of a class with tls: required will not stage here`,
      fix: "run Linux 6.7 or later with CONFIG_NVME_TCP_TLS, and tlshd (ktls-utils)",
      details: { release },
    };
  }
  const keys = await fs.readFile("/proc/keys").catch(() => "");
  if (!/ keyring\s+\.nvme:/.test(keys)) {
    return {
      id,
      status: "warn",
      message: `kernel ${release} has no .nvme keyring in /proc/keys: nvme_keyring is not loaded or the kernel lacks CONFIG_NVME_KEYRING, so TLS volumes will not connect`,
      fix: "modprobe nvme_keyring (and run tlshd)",
      details: { release },
    };
  }
  return {
    id,
    status: "pass",
    message: `kernel ${release} has the .nvme keyring for NVMe/TCP TLS`,
    details: { release },
  };
}
