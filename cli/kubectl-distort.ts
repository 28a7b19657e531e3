// `kubectl distort` (the kubectl-distort plugin binary, compiled by scripts/build-cli.ts): one
// entry point dispatching to status, describe volume, preflight, fence/unfence, support-bundle
// and completion. Every subcommand returns an exit code from exit-codes.ts instead of exiting.
import type { Exec } from "../lib/exec.ts";
import type { KubeConnection } from "../lib/kube/connection.ts";
import { KUBE_OPTIONS, namespaceOf, parseCommand, positionals } from "./args.ts";
import { openCluster } from "./cluster.ts";
import { completionScript } from "./completion.ts";
import { buildVolumeChain, fetchVolumeChain, renderVolumeChain } from "./describe-volume.ts";
import { EXIT, NotFoundError, UsageError } from "./exit-codes.ts";
import { renderFence, setFenced } from "./fence.ts";
import { type DataFormat, parseOutput, renderData } from "./output.ts";
import { preflightCommand } from "./preflight-command.ts";
import { DEFAULT_NAMESPACE, main as statusMain } from "./status.ts";
import { collectBundle, writeBundle } from "./support-bundle.ts";

export const USAGE = `usage: kubectl distort COMMAND [OPTIONS]

Commands:
  status                     storage nodes, devices, partitions, attachments, snapshots and what is unhealthy
  describe volume PVC        the chain PVC -> PV -> partition -> device -> node -> subsystem -> hosts, with conditions
  preflight                  check this machine for hugepages, cores, drivers, kernel modules and nvme-cli
  fence NODE                 let other nodes take over the volumes NODE holds (after NODE is cut off)
  unfence NODE               withdraw a fence that no takeover has consumed yet
  support-bundle             objects, Events and logs of DISTORT in one archive, secrets redacted
  completion bash|zsh        shell completion script

Common options: --kubeconfig PATH, -n NAMESPACE, -o json|yaml, -h. Run COMMAND --help for more.

Exit status: 0 ok, 1 unhealthy or a preflight check failed, 2 usage or API error,
3 preflight warnings with --strict, 4 the named object does not exist.`;

const DESCRIBE_USAGE = `usage: kubectl distort describe volume PVC [-n NAMESPACE] [-o json|yaml] [--kubeconfig PATH]

Shows the chain behind a PersistentVolumeClaim: PV, NVMePartition, NVMeDevice, storage node,
Node, subsystem and the hosts it admits, NVMeVolumeAttachments and VolumeAttachments, each with
its conditions, and a list of problems. NAMESPACE defaults to the kubeconfig context's, else default.
Exit status: 0 no problem found, 1 problems, 2 usage or API error, 4 no such PVC.`;

const FENCE_USAGE = `usage: kubectl distort fence|unfence NODE [-n NAMESPACE | -A] [--dry-run] [-o json|yaml]

fence marks every NVMeVolumeAttachment NODE holds storage.distort.io/fenced=true: the next
ControllerPublish of such a volume on another node takes it over (the target admits the new host
and revokes NODE's). Fence a node only once it can no longer reach the targets (powered off, cut
from the fabric). unfence removes marks no takeover has consumed. NAMESPACE is DISTORT's release
namespace (default ${DEFAULT_NAMESPACE}).`;

const BUNDLE_USAGE = `usage: kubectl distort support-bundle [-n NAMESPACE] [--output-path PATH] [--tail-lines N]

Writes every DISTORT object, the PVs, PVCs, StorageClasses and VolumeAttachments of DISTORT
volumes, Nodes, CSINodes, the release namespace's Pods, ConfigMaps, Secrets (values redacted) and
Events, Events about DISTORT objects, and the logs of every container in NAMESPACE (default
${DEFAULT_NAMESPACE}). PATH ending in .tar.gz or .tgz is an archive, anything else a directory;
default ./distort-support-<time>.tar.gz. Secret values, and anything shaped like a key
(DH-HMAC-CHAP, TLS PSK, private keys, tokens), are replaced by <redacted> in every file.`;

export interface Io {
  out: (s: string) => Promise<unknown>;
  err: (s: string) => Promise<unknown>;
}

/** Ports a test replaces: the exec that runs `nvme version`, the clock. */
export interface Deps {
  readonly exec?: Exec;
  readonly now?: () => Date;
  readonly cwd?: string;
}

function contextNamespace(conn: KubeConnection): string {
  const ctx = conn.kc.getContextObject(conn.kc.getCurrentContext());
  return ctx?.namespace || "default";
}

async function describe(
  argv: readonly string[],
  io: Io,
  env: Readonly<Record<string, string | undefined>>,
): Promise<number> {
  const { values, positionals: pos } = parseCommand(argv, KUBE_OPTIONS);
  if (values.help) {
    await io.out(`${DESCRIBE_USAGE}\n`);
    return EXIT.ok;
  }
  const [what, name] = positionals(pos, ["a resource (volume)", "a PVC name"]) as [string, string];
  if (!["volume", "volumes", "pvc"].includes(what))
    throw new UsageError(`cannot describe ${JSON.stringify(what)}: only "volume PVC"`);
  const output = parseOutput(values.output);
  if (values.namespace !== undefined) namespaceOf(values.namespace, "");
  const conn = openCluster(values.kubeconfig, env);
  const ns = namespaceOf(values.namespace, contextNamespace(conn));
  const chain = buildVolumeChain(await fetchVolumeChain(conn, ns, name));
  await io.out(output === "text" ? renderVolumeChain(chain) : renderData(chain, output as DataFormat));
  return chain.healthy ? EXIT.ok : EXIT.unhealthy;
}

async function fence(
  argv: readonly string[],
  io: Io,
  env: Readonly<Record<string, string | undefined>>,
  on: boolean,
): Promise<number> {
  const { values, positionals: pos } = parseCommand(argv, {
    ...KUBE_OPTIONS,
    "all-namespaces": { type: "boolean", short: "A" },
    "dry-run": { type: "boolean" },
  });
  if (values.help) {
    await io.out(`${FENCE_USAGE}\n`);
    return EXIT.ok;
  }
  const [node] = positionals(pos, ["NODE"]) as [string];
  if (values.namespace !== undefined && values["all-namespaces"])
    throw new UsageError("--namespace and --all-namespaces cannot be used together");
  const output = parseOutput(values.output);
  const ns = values["all-namespaces"] ? null : namespaceOf(values.namespace, DEFAULT_NAMESPACE);
  const conn = openCluster(values.kubeconfig, env);
  const results = await setFenced(conn, node, ns, on, values["dry-run"] === true);
  await io.out(
    output === "text"
      ? renderFence(node, on, results)
      : renderData(
          { kind: on ? "DistortFence" : "DistortUnfence", node, attachments: results },
          output as DataFormat,
        ),
  );
  return EXIT.ok;
}

async function supportBundle(
  argv: readonly string[],
  io: Io,
  env: Readonly<Record<string, string | undefined>>,
  deps: Deps,
): Promise<number> {
  const { values, positionals: pos } = parseCommand(argv, {
    kubeconfig: KUBE_OPTIONS.kubeconfig,
    namespace: KUBE_OPTIONS.namespace,
    help: KUBE_OPTIONS.help,
    "output-path": { type: "string" },
    "tail-lines": { type: "string" },
  });
  if (values.help) {
    await io.out(`${BUNDLE_USAGE}\n`);
    return EXIT.ok;
  }
  positionals(pos, []);
  const tail = values["tail-lines"] ?? "10000";
  if (!/^\d+$/.test(tail) || Number(tail) < 1)
    throw new UsageError(`--tail-lines must be a whole number >= 1, not ${JSON.stringify(tail)}`);
  const now = (deps.now ?? (() => new Date()))();
  const stamp = now
    .toISOString()
    .replace(/[-:]/g, "")
    .replace(/\.\d+Z$/, "Z");
  const top = `distort-support-${stamp}`;
  const dest = values["output-path"] ?? `${deps.cwd ?? process.cwd()}/${top}.tar.gz`;
  const ns = namespaceOf(values.namespace, DEFAULT_NAMESPACE);
  const conn = openCluster(values.kubeconfig, env);
  const { files, manifest } = await collectBundle(conn, { namespace: ns, tailLines: Number(tail), now });
  writeBundle(files, dest, top, now);
  await io.out(`${dest}\n`);
  await io.err(
    `wrote ${files.length} files from ${conn.server}${manifest.skipped.length ? `; could not read: ${manifest.skipped.map((s) => s.what).join(", ")}` : ""}\n`,
  );
  return EXIT.ok;
}

/** Runs `kubectl distort ARGV`; returns the exit code and writes only to io. */
export async function main(
  argv: readonly string[],
  io: Io,
  env: Readonly<Record<string, string | undefined>> = process.env,
  deps: Deps = {},
): Promise<number> {
  const [cmd, ...rest] = argv;
  const known = ["status", "describe", "preflight", "fence", "unfence", "support-bundle", "completion"];
  const prog = `kubectl distort${cmd && known.includes(cmd) ? ` ${cmd}` : ""}`;
  try {
    switch (cmd) {
      case undefined:
      case "help":
      case "-h":
      case "--help":
        await io.out(`${USAGE}\n`);
        return cmd === undefined ? EXIT.usage : EXIT.ok;
      case "status":
        return await statusMain(rest, io, env, "kubectl distort status");
      case "describe":
        return await describe(rest, io, env);
      case "preflight":
        return await preflightCommand(rest, io, deps.exec);
      case "fence":
        return await fence(rest, io, env, true);
      case "unfence":
        return await fence(rest, io, env, false);
      case "support-bundle":
        return await supportBundle(rest, io, env, deps);
      case "completion": {
        const [shell, ...more] = rest;
        if (more.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(more[0])}`);
        await io.out(completionScript(shell));
        return EXIT.ok;
      }
      default:
        throw new UsageError(`unknown command ${JSON.stringify(cmd)}`);
    }
  } catch (err) {
    if (err instanceof UsageError) {
      await io.err(`${prog}: ${err.message}\n`);
      if (/^(unexpected|unknown|missing)/.test(err.message)) await io.err(`run ${prog} --help for usage\n`);
      return EXIT.usage;
    }
    if (err instanceof NotFoundError) {
      await io.err(`${prog}: ${err.message}\n`);
      return EXIT.notFound;
    }
    await io.err(`${prog}: ${err instanceof Error ? err.message : String(err)}\n`);
    return EXIT.usage;
  }
}

if (import.meta.main) {
  const code = await main(process.argv.slice(2), {
    out: (s) => Bun.write(Bun.stdout, s),
    err: (s) => Bun.write(Bun.stderr, s),
  });
  process.exit(code);
}
