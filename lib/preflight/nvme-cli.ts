// nvme-cli on the consumer node: present (the CSI node plugin connects and disconnects with it)
// and new enough for the options DISTORT passes (DH-HMAC-CHAP secrets, TLS).
import type { Exec } from "../exec.ts";
import type { CheckResult } from "./check.ts";

/** nvme-cli 2.0 brought --dhchap-secret / --dhchap-ctrl-secret to connect. */
export const NVME_CLI_MIN = { major: 2, minor: 0 } as const;
/** --tls on connect is in nvme-cli from 2.4 (with libnvme's keyring support). */
export const NVME_CLI_TLS = { major: 2, minor: 4 } as const;

/** "nvme version 2.8 (git 2.8)" -> { major: 2, minor: 8 }; undefined when it does not match. Pure. */
export function parseNvmeVersion(stdout: string): { major: number; minor: number; text: string } | undefined {
  const m = /nvme version (\d+)\.(\d+)(?:\.\d+)?/.exec(stdout);
  if (!m) return undefined;
  return { major: Number(m[1]), minor: Number(m[2]), text: `${m[1]}.${m[2]}` };
}

const atLeast = (v: { major: number; minor: number }, min: { major: number; minor: number }) =>
  v.major > min.major || (v.major === min.major && v.minor >= min.minor);

/** Runs `nvme version` through `exec`. fail: not installed or unparsable; warn: below 2.4 (no TLS). */
export async function checkNvmeCli(exec: Exec): Promise<CheckResult> {
  const id = "nvme-cli";
  let out: string;
  try {
    const r = await exec.run(["nvme", "version"], { timeoutMs: 10_000 });
    if (r.code !== 0) {
      return {
        id,
        status: "fail",
        message: `nvme version exited ${r.code}: ${(r.stderr || r.stdout).trim().slice(0, 200)}`,
        fix: "install nvme-cli",
      };
    }
    out = r.stdout;
  } catch (err) {
    return {
      id,
      status: "fail",
      message: `nvme-cli is not installed (${(err as Error).message})`,
      fix: "install nvme-cli (2.4 or later)",
    };
  }
  const v = parseNvmeVersion(out);
  if (!v)
    return {
      id,
      status: "fail",
      message: `cannot read a version from "nvme version": ${out.trim().slice(0, 120)}`,
    };
  const details = { version: v.text };
  if (!atLeast(v, NVME_CLI_MIN)) {
    return {
      id,
      status: "fail",
      message: `nvme-cli ${v.text} is older than 2.0: no DH-HMAC-CHAP options on connect`,
      fix: "install nvme-cli 2.4 or later",
      details,
    };
  }
  if (!atLeast(v, NVME_CLI_TLS)) {
    return {
      id,
      status: "warn",
      message: `nvme-cli ${v.text}: DH-HMAC-CHAP works, TLS (--tls, from 2.4) does not`,
      fix: "install nvme-cli 2.4 or later",
      details,
    };
  }
  return { id, status: "pass", message: `nvme-cli ${v.text}`, details };
}
