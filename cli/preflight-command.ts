// `kubectl distort preflight`: lib/preflight's checks on the machine the command runs on (run it
// on the node, or in a privileged debug Pod with the host's / at --host-root), with the plan given
// as flags the way the chart configures the agent.
import { type Exec, hostExec } from "../lib/exec.ts";
import { hostFs } from "../lib/fs.ts";
import { preflightExitCode, renderPreflight } from "../lib/preflight/check.ts";
import {
  PREFLIGHT_ROLES,
  type PreflightPlan,
  type PreflightRole,
  runPreflight,
  type Transport,
} from "../lib/preflight/preflight.ts";
import { parseCommand } from "./args.ts";
import { UsageError } from "./exit-codes.ts";
import { type DataFormat, parseOutput, renderData } from "./output.ts";

export const PREFLIGHT_USAGE = `usage: kubectl distort preflight [OPTIONS]

Checks this machine for what DISTORT needs: hugepages, CPU cores for the core mask, vfio/uio and
an IOMMU (spdk), configfs and nvmet (kernel-target), nvme-tcp/rdma, nvme-auth, nvme-keyring and
nvme-cli (initiator).

  --role LIST           spdk,kernel-target,initiator (default: all three)
  --transport LIST      tcp,rdma (default tcp)
  --core-mask MASK      nvmf_tgt -m (default 0x1)
  --mem-size-mb N       nvmf_tgt -s in MiB (agent.spdk.hugepages.sizeMiB)
  --volumes N           volumes the node is meant to serve, for the hugepage estimate (default 0)
  --spdk-drives         drives are handed to SPDK: check vfio-pci/uio and the IOMMU
  --host-root PATH      read /proc and /sys under PATH (default /)
  --strict              exit 3 when there are warnings
  -o json|yaml          the report as data
  -h, --help            this text

Exit status: 0 no check failed, 1 a check failed, 2 usage error, 3 warnings with --strict.`;

const OPTIONS = {
  role: { type: "string" },
  transport: { type: "string" },
  "core-mask": { type: "string" },
  "mem-size-mb": { type: "string" },
  volumes: { type: "string" },
  "spdk-drives": { type: "boolean" },
  "host-root": { type: "string" },
  strict: { type: "boolean" },
  output: { type: "string", short: "o" },
  help: { type: "boolean", short: "h" },
} as const;

function list<T extends string>(
  flag: string,
  value: string | undefined,
  allowed: readonly T[],
  fallback: readonly T[],
): T[] {
  if (value === undefined) return [...fallback];
  const items = value
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
  if (items.length === 0) throw new UsageError(`${flag} needs a value`);
  for (const i of items)
    if (!allowed.includes(i as T))
      throw new UsageError(`${flag}: unknown value ${JSON.stringify(i)} (use ${allowed.join(", ")})`);
  return items as T[];
}

function whole(flag: string, value: string | undefined, min: number): number | undefined {
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value) || Number(value) < min)
    throw new UsageError(`${flag} must be a whole number >= ${min}, not ${JSON.stringify(value)}`);
  return Number(value);
}

/** The parsed command line. Throws UsageError. */
export function parsePreflightArgs(
  argv: readonly string[],
): "help" | { plan: PreflightPlan; hostRoot: string; strict: boolean; output: "text" | DataFormat } {
  const { values, positionals } = parseCommand(argv, OPTIONS);
  if (values.help) return "help";
  if (positionals.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(positionals[0])}`);
  const mem = whole("--mem-size-mb", values["mem-size-mb"], 1);
  const plan: PreflightPlan = {
    roles: list<PreflightRole>("--role", values.role, PREFLIGHT_ROLES, PREFLIGHT_ROLES),
    transports: list<Transport>("--transport", values.transport, ["tcp", "rdma"], ["tcp"]),
    coreMask: values["core-mask"] ?? "0x1",
    ...(mem === undefined ? {} : { memSizeMiB: mem }),
    volumes: whole("--volumes", values.volumes, 0) ?? 0,
    spdkDrives: values["spdk-drives"] === true,
  };
  const hostRoot = values["host-root"] ?? "/";
  if (!hostRoot.startsWith("/")) throw new UsageError("--host-root must be an absolute path");
  return {
    plan,
    hostRoot,
    strict: values.strict === true,
    output: parseOutput(values.output) as "text" | DataFormat,
  };
}

/** Runs the checks and prints them; returns the exit code (check.ts's PREFLIGHT_EXIT). */
export async function preflightCommand(
  argv: readonly string[],
  io: { out: (s: string) => Promise<unknown> },
  exec: Exec = hostExec,
): Promise<number> {
  const args = parsePreflightArgs(argv);
  if (args === "help") {
    await io.out(`${PREFLIGHT_USAGE}\n`);
    return 0;
  }
  const report = await runPreflight(args.plan, { fs: hostFs(args.hostRoot), exec });
  await io.out(
    args.output === "text"
      ? renderPreflight(report)
      : renderData({ kind: "DistortPreflight", ...report }, args.output),
  );
  return preflightExitCode(report, args.strict);
}
