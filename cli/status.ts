// `distort status` (`bun run status`): a user's view of DISTORT at a glance. Finds a kubeconfig,
// lists every DISTORT kind from the API server and prints cli/status-table.ts's tables or JSON.
// Exit code: 0 all healthy, 1 the UNHEALTHY table has rows, 2 usage, kubeconfig or API errors.
import { existsSync } from "node:fs";
import { homedir } from "node:os";
import { delimiter, join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { stringify } from "yaml";
import { type KindName, type KindObject, kinds } from "../api/kinds.ts";
import { StorageError } from "../lib/errors.ts";
import { connect, type KubeConnection } from "../lib/kube/connection.ts";
import { type KubeObject, kubeError, ResourceClient, type ResourceKind } from "../lib/kube/resource.ts";
import {
  buildReport,
  exitCodeFor,
  type InvalidObject,
  renderJson,
  renderTables,
  type StatusInput,
} from "./status-table.ts";

/**
 * Where the DISTORT Helm chart installs, and so where the CSI driver, agents and manager keep
 * every namespaced object; the default view when neither -n nor -A is given.
 */
export const DEFAULT_NAMESPACE = "distort-system";

/** How long the whole listing may take before the server is declared unreachable. */
const REQUEST_TIMEOUT_MS = 30_000;

const USAGE = `usage: bun run status [-- OPTIONS]   (or: bun cli/status.ts [OPTIONS])

Shows DISTORT storage nodes, devices, partitions, attachments and snapshots, and every object
with an unhealthy condition.

  --kubeconfig PATH     kubeconfig to use; default $KUBECONFIG, then .lab/cluster/kubeconfig in
                        the repository (the lab cluster), then ~/.kube/config
  -n, --namespace NS    namespace to list (default ${DEFAULT_NAMESPACE}); devices are
                        cluster-scoped and shown when they involve NS
  -A, --all-namespaces  list every namespace and every device
  --wide, -o wide       more columns (addresses, NQNs, ids) and full condition messages
  -o json, -o yaml      one JSON or YAML document instead of tables
  -h, --help            this text

Exit status: 0 everything healthy, 1 something is unhealthy (see the UNHEALTHY table),
2 usage error, no kubeconfig or the API server could not be read.`;

/** A problem the user must fix before a status can be shown; printed as is, exit code 2. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}

/** The parsed command line; defaults already applied. */
export interface StatusArgs {
  readonly kubeconfig?: string;
  /** null: all namespaces. */
  readonly namespace: string | null;
  readonly wide: boolean;
  readonly output: "table" | "json" | "yaml";
}

/** Parses argv (without the runtime and script); "help" for -h. Throws UsageError. */
export function parseStatusArgs(argv: readonly string[]): StatusArgs | "help" {
  // `bun run status -- --flag` may hand the separator through; it is not an argument.
  const args = argv[0] === "--" ? argv.slice(1) : [...argv];
  let parsed: ReturnType<typeof parse>;
  try {
    parsed = parse(args);
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    // node:util's text suggests quoting the option after "--", which would not help here.
    const unknown = /^Unknown option '([^']+)'/.exec(message);
    throw new UsageError(unknown ? `unknown option ${unknown[1]}` : message);
  }
  const { values, positionals } = parsed;
  if (values.help) return "help";
  if (positionals.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(positionals[0])}`);
  if (values.namespace !== undefined && values["all-namespaces"]) {
    throw new UsageError("--namespace and --all-namespaces cannot be used together");
  }
  if (values.namespace === "") throw new UsageError("--namespace needs a value");
  const o = values.output;
  if (o !== undefined && o !== "json" && o !== "yaml" && o !== "wide" && o !== "table") {
    throw new UsageError(`unknown output format ${JSON.stringify(o)} (use -o json, -o yaml or -o wide)`);
  }
  if ((o === "json" || o === "yaml") && values.wide)
    throw new UsageError(`--wide applies to tables, not to -o ${o}`);
  return {
    ...(values.kubeconfig === undefined ? {} : { kubeconfig: values.kubeconfig }),
    namespace: values["all-namespaces"] ? null : (values.namespace ?? DEFAULT_NAMESPACE),
    wide: values.wide === true || o === "wide",
    output: o === "json" || o === "yaml" ? o : "table",
  };
}

function parse(args: string[]) {
  return parseArgs({
    args,
    allowPositionals: true,
    strict: true,
    options: {
      kubeconfig: { type: "string" },
      namespace: { type: "string", short: "n" },
      "all-namespaces": { type: "boolean", short: "A" },
      wide: { type: "boolean" },
      output: { type: "string", short: "o" },
      help: { type: "boolean", short: "h" },
    },
  });
}

/**
 * The kubeconfig to use: the flag, else the first existing file of $KUBECONFIG (a path list, as
 * kubectl reads it; only that one file is loaded), else the lab's `.lab/cluster/kubeconfig` under
 * `repoRoot`, else ~/.kube/config. An explicit path that does not exist is an error rather than a
 * silent fallback. Throws UsageError when nothing is found.
 */
export function resolveKubeconfig(opts: {
  flag?: string;
  env?: string;
  repoRoot: string;
  home: string;
  exists?: (path: string) => boolean;
}): string {
  const exists = opts.exists ?? existsSync;
  if (opts.flag !== undefined) {
    if (!exists(opts.flag)) throw new UsageError(`kubeconfig ${opts.flag} does not exist`);
    return opts.flag;
  }
  const fromEnv = (opts.env ?? "").split(delimiter).filter((p) => p !== "");
  if (fromEnv.length > 0) {
    const found = fromEnv.find(exists);
    if (!found) throw new UsageError(`no file of KUBECONFIG=${opts.env} exists`);
    return found;
  }
  const lab = join(opts.repoRoot, ".lab", "cluster", "kubeconfig");
  if (exists(lab)) return lab;
  const home = join(opts.home, ".kube", "config");
  if (exists(home)) return home;
  throw new UsageError(
    `no kubeconfig: pass --kubeconfig PATH, set KUBECONFIG, start the lab (bun run lab) or create ${home}`,
  );
}

// Bun's fetch reports socket failures by code; these read better than the codes.
const NETWORK_CODES: Readonly<Record<string, string>> = {
  ECONNREFUSED: "connection refused",
  ConnectionRefused: "connection refused",
  ENOTFOUND: "host not found",
  EHOSTUNREACH: "host unreachable",
  ENETUNREACH: "network unreachable",
  ECONNRESET: "connection reset",
  ConnectionClosed: "connection closed",
  ETIMEDOUT: "connection timed out",
  FailedToOpenSocket: "cannot open a socket",
};

function networkCode(err: unknown): string | undefined {
  for (let e: unknown = err, depth = 0; e && depth < 5; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") return code;
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

/** One sentence for a failed listing: what could not be done, against which server, and why. */
export function describeFailure(err: unknown, server: string, what: string): string {
  const se = err instanceof StorageError ? err : kubeError(err, what);
  const status = se.details.status;
  if (status === 401) return `the API server at ${server} refused the kubeconfig's credentials (401)`;
  if (status === 403) return `not allowed to ${what} (403): ${se.message}`;
  if (status === 404) {
    return `the API server at ${server} does not serve ${what.replace(/^list /, "")}: are the DISTORT CRDs installed?`;
  }
  if (typeof status === "number")
    return `the API server at ${server} failed to ${se.message} (HTTP ${status})`;
  const code = networkCode(se.cause ?? err);
  if (code !== undefined) {
    const why = NETWORK_CODES[code];
    const detail = why ?? (/CERT|TLS|SSL|SELF_SIGNED|VERIFY/i.test(code) ? `TLS failure (${code})` : code);
    return `cannot reach the API server at ${server}: ${detail}`;
  }
  return `cannot read from the API server at ${server}: ${se.message}`;
}

/**
 * Lists one kind. A server object that fails the schema would make ResourceClient.list throw for
 * the whole kind; a status report is where such an object must show up, so on that failure the
 * raw list is read again and every object parsed on its own.
 */
async function listKind<T extends KubeObject>(
  conn: KubeConnection,
  client: ResourceClient<T>,
  namespace: string | null,
  invalid: InvalidObject[],
): Promise<T[]> {
  const ns = namespace ?? undefined;
  try {
    return (await client.list({ namespace: ns })).items;
  } catch (err) {
    if (!(err instanceof StorageError && err.kind === "invalid" && err.details.status === undefined))
      throw err;
  }
  const res = await conn.request(client.collectionPath(ns));
  if (!res.ok) throw new StorageError("unavailable", `list ${client.kind.plural}: HTTP ${res.status}`);
  const raw = (await res.json()) as { items?: unknown[] };
  const items: T[] = [];
  for (const item of raw.items ?? []) {
    try {
      items.push(client.parse(item));
    } catch (err) {
      const meta = (item as { metadata?: { name?: string; namespace?: string } }).metadata;
      invalid.push({
        kind: client.kind.kind,
        namespace: meta?.namespace ?? null,
        name: meta?.name ?? "?",
        message: err instanceof Error ? err.message : String(err),
      });
    }
  }
  return items;
}

/** Everything the report needs, read in parallel; namespaced kinds from `namespace` (null: all). */
export async function fetchStatusInput(conn: KubeConnection, namespace: string | null): Promise<StatusInput> {
  const invalid: InvalidObject[] = [];
  const list = <K extends KindName>(name: K): Promise<KindObject<K>[]> => {
    const kind = kinds[name] as unknown as ResourceKind<KindObject<K>>;
    // Devices are cluster-scoped; the report picks the ones a namespace involves.
    const ns = kind.scope === "Cluster" ? null : namespace;
    return listKind(conn, new ResourceClient(conn, kind), ns, invalid).catch((err: unknown) => {
      throw new UsageError(describeFailure(err, conn.server, `list ${kind.plural}`));
    });
  };
  const [storageNodes, devices, claims, partitions, attachments, snapshots] = await Promise.all([
    list("RDMAStorageNode"),
    list("NVMeDevice"),
    list("NVMeDeviceClaim"),
    list("NVMePartition"),
    list("NVMeVolumeAttachment"),
    list("NVMeSnapshot"),
  ]);
  return { storageNodes, devices, claims, partitions, attachments, snapshots, invalid };
}

async function withTimeout<T>(p: Promise<T>, ms: number, server: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new UsageError(`no answer from the API server at ${server} within ${ms / 1000} s`)),
      ms,
    );
  });
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Runs the command; returns the exit code instead of exiting, and writes only to out/err. */
export async function main(
  argv: readonly string[],
  io: { out: (s: string) => Promise<unknown>; err: (s: string) => Promise<unknown> },
  env: Readonly<Record<string, string | undefined>> = process.env,
  prog = "distort status",
): Promise<number> {
  try {
    const args = parseStatusArgs(argv);
    if (args === "help") {
      await io.out(
        `${prog === "distort status" ? USAGE : USAGE.replace(/^usage: .*$/m, `usage: ${prog} [OPTIONS]`)}\n`,
      );
      return 0;
    }
    const path = resolveKubeconfig({
      flag: args.kubeconfig,
      env: env.KUBECONFIG,
      repoRoot: resolve(import.meta.dir, ".."),
      home: env.HOME ?? homedir(),
    });
    let conn: KubeConnection;
    try {
      conn = connect(path);
    } catch (err) {
      throw new UsageError(
        `cannot use kubeconfig ${path}: ${err instanceof Error ? err.message : String(err)}`,
      );
    }
    const input = await withTimeout(fetchStatusInput(conn, args.namespace), REQUEST_TIMEOUT_MS, conn.server);
    const report = buildReport(input, { now: new Date(), namespace: args.namespace });
    await io.out(
      args.output === "json"
        ? renderJson(report)
        : args.output === "yaml"
          ? stringify(report, { lineWidth: 0 })
          : renderTables(report, { wide: args.wide }),
    );
    return exitCodeFor(report);
  } catch (err) {
    if (err instanceof UsageError) {
      await io.err(`${prog}: ${err.message}\n`);
      if (/^(unexpected|unknown option)/.test(err.message)) {
        await io.err("run with --help for the options\n");
      }
      return 2;
    }
    await io.err(`${prog}: ${err instanceof Error ? err.message : String(err)}\n`);
    return 2;
  }
}

if (import.meta.main) {
  const code = await main(process.argv.slice(2), {
    out: (s) => Bun.write(Bun.stdout, s),
    err: (s) => Bun.write(Bun.stderr, s),
  });
  // Exit now: a request still in flight after a timeout must not keep the process alive.
  process.exit(code);
}
