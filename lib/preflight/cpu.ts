// CPU cores for nvmf_tgt's reactor core mask: every core the mask names must be online, or SPDK
// refuses to start its reactors.
import type { HostFs } from "../fs.ts";
import { parseCoreMask } from "../spdk/core-mask.ts";
import type { CheckResult } from "./check.ts";

/** Parses a kernel CPU list ("0-3,8,10-11"); throws on anything else. Pure. */
export function parseCpuList(text: string): number[] {
  const out: number[] = [];
  for (const part of text.trim().split(",")) {
    if (part === "") continue;
    const m = /^(\d+)(?:-(\d+))?$/.exec(part);
    if (!m) throw new Error(`not a CPU list: ${JSON.stringify(text.trim())}`);
    const lo = Number(m[1]);
    const hi = m[2] === undefined ? lo : Number(m[2]);
    for (let c = lo; c <= hi; c++) out.push(c);
  }
  return out;
}

/** Reads /sys/devices/system/cpu/online; undefined when it cannot be read or parsed. */
export async function readOnlineCpus(fs: HostFs): Promise<number[] | undefined> {
  try {
    return parseCpuList(await fs.readFile("/sys/devices/system/cpu/online"));
  } catch {
    return undefined;
  }
}

/**
 * fail: the mask is invalid or names an offline core; warn: the online list is unreadable, or the
 * mask takes every online core (nothing left for the agent and the kernel). Pure.
 */
export function checkCoreMask(mask: string, online: readonly number[] | undefined): CheckResult {
  const id = "cpu-cores";
  let cores: readonly number[];
  try {
    cores = parseCoreMask(mask).cores;
  } catch (err) {
    return {
      id,
      status: "fail",
      message: (err as Error).message,
      fix: "set agent.spdk.coreMask to a hex mask like 0x1",
    };
  }
  if (online === undefined) {
    return {
      id,
      status: "warn",
      message: `core mask ${mask} (cores ${cores.join(",")}); cannot read the online CPU list`,
    };
  }
  const missing = cores.filter((c) => !online.includes(c));
  const details = { mask, cores, online: online.length };
  if (missing.length > 0) {
    return {
      id,
      status: "fail",
      message: `core mask ${mask} names core(s) ${missing.join(",")} but only ${formatCpus(online)} are online`,
      fix: "choose a mask within the online cores (agent.spdk.coreMask)",
      details,
    };
  }
  if (cores.length >= online.length) {
    return {
      id,
      status: "warn",
      message: `core mask ${mask} takes all ${online.length} online cores: reactors poll at 100 %, nothing is left for the agent and the kernel`,
      details,
    };
  }
  return {
    id,
    status: "pass",
    message: `core mask ${mask}: ${cores.length} of ${online.length} online cores`,
    details,
  };
}

function formatCpus(cpus: readonly number[]): string {
  return cpus.length === 0
    ? "none"
    : cpus.length === 1
      ? `core ${cpus[0]}`
      : `cores ${cpus[0]}-${cpus[cpus.length - 1]}`;
}
