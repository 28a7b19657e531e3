// Configuration of distort-csi's two sidecar modes, DISTORT's own equivalents of
// node-driver-registrar (--mode=registrar) and livenessprobe (--mode=liveness): the upstream
// sidecars' flags, read the way Go's flag package reads them, validated with valibot.
import { isAbsolute } from "node:path";
import * as v from "valibot";
import { goDuration, wholeNumber } from "../../lib/config-schemas.ts";
import { StorageError } from "../../lib/errors.ts";

export type SidecarMode = "registrar" | "liveness";
const SIDECAR_MODES: readonly string[] = ["registrar", "liveness"];

/** An option: its flag, the environment variables consulted when the flag is absent, a default. */
interface Option {
  flag: string;
  env: readonly string[];
  default: string | undefined;
  help: string;
}

const COMMON = {
  mode: { flag: "mode", env: [], default: undefined, help: "registrar or liveness" },
  // Upstream's default; the chart always passes it.
  csiAddress: {
    flag: "csi-address",
    env: [],
    default: "/run/csi/socket",
    help: "the CSI driver's socket (path or unix:///path)",
  },
  logLevel: {
    flag: "log-level",
    env: ["DISTORT_LOG_LEVEL"],
    default: "info",
    help: "debug, info, warn or error",
  },
} as const satisfies Record<string, Option>;

const REGISTRAR_OPTIONS = {
  ...COMMON,
  kubeletRegistrationPath: {
    flag: "kubelet-registration-path",
    env: [],
    default: undefined,
    help: "the CSI socket's path on the node, which kubelet dials (required)",
  },
  pluginRegistrationPath: {
    flag: "plugin-registration-path",
    env: [],
    default: "/registration",
    help: "kubelet's plugins_registry as mounted here; <driver>-reg.sock is created in it",
  },
  httpEndpoint: { flag: "http-endpoint", env: [], default: "", help: "[host]:port of /healthz; empty: none" },
  timeout: { flag: "timeout", env: [], default: "1s", help: "deadline of each call to the CSI driver" },
  // Upstream waits forever; a bound turns a driver that never comes up into a container restart
  // the operator can see.
  csiWaitTimeout: {
    flag: "csi-wait-timeout",
    env: ["DISTORT_REGISTRAR_CSI_WAIT_TIMEOUT"],
    default: "2m",
    help: "how long to wait for the CSI driver to answer GetPluginInfo at start",
  },
} as const satisfies Record<string, Option>;

const LIVENESS_OPTIONS = {
  ...COMMON,
  httpEndpoint: {
    flag: "http-endpoint",
    env: [],
    default: "",
    help: "[host]:port of /healthz; empty: :<health-port>",
  },
  healthPort: {
    flag: "health-port",
    env: [],
    default: "9808",
    help: "port of /healthz when --http-endpoint is empty (upstream, deprecated there)",
  },
  probeTimeout: { flag: "probe-timeout", env: [], default: "1s", help: "deadline of each CSI Probe" },
} as const satisfies Record<string, Option>;

export interface HttpEndpoint {
  /** Interface to bind; an empty host in the flag means every IPv4 interface (0.0.0.0). */
  host: string;
  /** 0 picks a free port. */
  port: number;
}

export interface RegistrarConfig {
  /** Absolute path of the CSI driver's socket as this container sees it. */
  csiSocketPath: string;
  /** The endpoint GetInfo reports: the CSI socket's path on the node, which kubelet dials. */
  kubeletRegistrationPath: string;
  /** Directory (kubelet's plugins_registry as mounted here) that receives <driver>-reg.sock. */
  registrationDir: string;
  /** Where /healthz is served; undefined: not at all. */
  http?: HttpEndpoint;
  /** Deadline of each call to the CSI driver. */
  callTimeoutMs: number;
  /** How long startup waits for the driver to answer GetPluginInfo before giving up. */
  csiWaitMs: number;
  logLevel: "debug" | "info" | "warn" | "error";
}

export interface LivenessConfig {
  csiSocketPath: string;
  http: HttpEndpoint;
  /** Deadline of each CSI Probe a /healthz request makes. */
  probeTimeoutMs: number;
  logLevel: "debug" | "info" | "warn" | "error";
}

const socketPath = (flag: string) =>
  v.pipe(
    v.string(),
    v.transform((s) => (s.startsWith("unix://") ? s.slice("unix://".length) : s)),
    v.check(isAbsolute, `${flag} must be an absolute path or unix:///absolute/path`),
  );

const absPath = (flag: string) => v.pipe(v.string(), v.check(isAbsolute, `${flag} must be an absolute path`));

const IPV4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;
const isIp = (s: string) =>
  IPV4.test(s) ? s.split(".").every((o) => Number(o) <= 255) : /^[0-9a-fA-F:.]+$/.test(s) && s.includes(":");

/**
 * "[host]:port" as Go's net.Listen takes it: ":9808", "127.0.0.1:9808", "[::1]:9808",
 * "localhost:9808". Empty host means all IPv4 interfaces; the host must otherwise be an IP or
 * localhost (nothing here resolves names). The empty string is undefined (no endpoint given).
 */
const httpEndpoint = (flag: string) =>
  v.pipe(
    v.string(),
    v.rawTransform(({ dataset, addIssue, NEVER }): HttpEndpoint | undefined => {
      if (dataset.value === "") return undefined;
      const m = /^(?:\[([^\]]*)\]|([^:[\]]*)):(\d{1,5})$/.exec(dataset.value);
      const host = m?.[1] ?? m?.[2];
      const port = Number(m?.[3]);
      if (!m || host === undefined || port > 65535) {
        addIssue({ message: `${flag} must be [host]:port, e.g. :9809 or 127.0.0.1:9809` });
        return NEVER;
      }
      if (host !== "" && host !== "localhost" && !isIp(host)) {
        addIssue({ message: `${flag} host must be empty, localhost or an IP address` });
        return NEVER;
      }
      const bind = host === "" ? "0.0.0.0" : host === "localhost" ? "127.0.0.1" : host;
      return { host: bind, port } satisfies HttpEndpoint;
    }),
  );

const LogLevelSchema = v.picklist(["debug", "info", "warn", "error"], "must be debug, info, warn or error");

const RegistrarSchema = v.object({
  mode: v.literal("registrar"),
  csiAddress: socketPath("--csi-address"),
  logLevel: LogLevelSchema,
  kubeletRegistrationPath: v.pipe(
    v.string("--kubelet-registration-path is required: the CSI socket's path on the node"),
    v.check(isAbsolute, "--kubelet-registration-path must be an absolute path on the node"),
  ),
  pluginRegistrationPath: absPath("--plugin-registration-path"),
  httpEndpoint: httpEndpoint("--http-endpoint"),
  timeout: goDuration(1, 600_000, "--timeout"),
  csiWaitTimeout: goDuration(0, 86_400_000, "--csi-wait-timeout"),
});

const LivenessSchema = v.object({
  mode: v.literal("liveness"),
  csiAddress: socketPath("--csi-address"),
  logLevel: LogLevelSchema,
  httpEndpoint: httpEndpoint("--http-endpoint"),
  healthPort: wholeNumber(0, 65535, "--health-port"),
  probeTimeout: goDuration(1, 600_000, "--probe-timeout"),
});

/**
 * The sidecar mode `argv` asks for (a --mode=registrar or --mode=liveness flag, or -mode, or
 * "--mode registrar"), or undefined when it asks for none: then argv is the CSI driver's own.
 */
export function sidecarModeOf(argv: readonly string[]): SidecarMode | undefined {
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    const m = /^--?mode(?:=(.*))?$/.exec(a);
    if (!m) continue;
    const value = m[1] ?? argv[i + 1];
    return value !== undefined && SIDECAR_MODES.includes(value) ? (value as SidecarMode) : undefined;
  }
  return undefined;
}

/**
 * Reads flags as Go's flag package does for string flags: "-flag=value", "--flag=value",
 * "-flag value", "--flag value"; "--" ends the flags. Unknown flags, positional arguments, a
 * missing value and a repeated flag are errors.
 */
function readFlags<K extends string>(
  argv: readonly string[],
  options: Record<K, Option>,
  what: string,
): Partial<Record<K, string>> {
  const byFlag = new Map<string, K>(Object.entries<Option>(options).map(([k, o]) => [o.flag, k as K]));
  const out: Partial<Record<K, string>> = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    if (arg === "--") {
      if (i + 1 < argv.length)
        throw new StorageError("invalid", `${what}: unexpected argument ${JSON.stringify(argv[i + 1])}`);
      break;
    }
    const m = /^--?([^=-][^=]*)(?:=(.*))?$/s.exec(arg);
    if (!m) throw new StorageError("invalid", `${what}: unexpected argument ${JSON.stringify(arg)}`);
    const flag = m[1] as string;
    const key = byFlag.get(flag);
    if (key === undefined) throw new StorageError("invalid", `${what}: unknown flag --${flag}`);
    let value = m[2];
    if (value === undefined) {
      value = argv[++i];
      if (value === undefined) throw new StorageError("invalid", `${what}: --${flag} needs a value`);
    }
    if (out[key] !== undefined) throw new StorageError("invalid", `${what}: --${flag} given twice`);
    out[key] = value;
  }
  return out;
}

function parseWith<K extends string, T>(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
  options: Record<K, Option>,
  schema: v.GenericSchema<Record<string, string | undefined>, T>,
  what: string,
): T {
  const flags = readFlags(argv, options, what);
  const raw: Record<string, string | undefined> = {};
  for (const [k, o] of Object.entries<Option>(options)) {
    const fromEnv = o.env.map((e) => env[e]).find((x) => x !== undefined && x !== "");
    raw[k] = flags[k as K] ?? fromEnv ?? o.default;
  }
  const r = v.safeParse(schema, raw);
  if (r.success) return r.output;
  const msgs = r.issues.map((i) => {
    const k = v.getDotPath(i);
    const flag = k !== null && k in options ? `--${(options as Record<string, Option>)[k]?.flag}` : undefined;
    // Messages that already name their flag stand alone; valibot's generic ones get the flag.
    return flag && !i.message.includes(flag) ? `${flag}: ${i.message}` : i.message;
  });
  throw new StorageError("invalid", `${what} configuration: ${msgs.join("; ")}`);
}

/**
 * The registrar's configuration from `argv` (without the program name; it must contain
 * --mode=registrar) and `env`. Throws StorageError("invalid") naming every bad flag.
 */
export function parseRegistrarConfig(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
): RegistrarConfig {
  const c = parseWith(argv, env, REGISTRAR_OPTIONS, RegistrarSchema, "registrar");
  return {
    csiSocketPath: c.csiAddress,
    kubeletRegistrationPath: c.kubeletRegistrationPath,
    registrationDir: c.pluginRegistrationPath.replace(/(.)\/+$/, "$1"),
    ...(c.httpEndpoint === undefined ? {} : { http: c.httpEndpoint }),
    callTimeoutMs: c.timeout,
    csiWaitMs: c.csiWaitTimeout,
    logLevel: c.logLevel,
  };
}

/**
 * The liveness probe's configuration from `argv` (it must contain --mode=liveness) and `env`.
 * As upstream, an empty --http-endpoint serves on all interfaces at --health-port. Throws
 * StorageError("invalid") naming every bad flag.
 */
export function parseLivenessConfig(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
): LivenessConfig {
  const c = parseWith(argv, env, LIVENESS_OPTIONS, LivenessSchema, "liveness");
  return {
    csiSocketPath: c.csiAddress,
    http: c.httpEndpoint ?? { host: "0.0.0.0", port: c.healthPort },
    probeTimeoutMs: c.probeTimeout,
    logLevel: c.logLevel,
  };
}

const usageOf = (options: Record<string, Option>) =>
  Object.values(options)
    .map((o) => `  --${o.flag.padEnd(27)} ${o.help}${o.default ? ` (default ${o.default})` : ""}`)
    .join("\n");

export const SIDECAR_USAGE = `usage: distort-csi --mode=registrar [flag=value ...]   (node-driver-registrar's flags)
${usageOf(REGISTRAR_OPTIONS)}
usage: distort-csi --mode=liveness [flag=value ...]    (livenessprobe's flags)
${usageOf(LIVENESS_OPTIONS)}`;
