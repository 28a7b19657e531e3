// The chart values contract without helm: values.schema.json is exactly what the generator renders,
// values.yaml and every examples/*.yaml satisfy ValuesSchema, and for each value a binary reads,
// anything the schema admits the binary's own config parser admits too (and, where the bounds
// are meant to be the same, the other way round). docs/install.md documents every key.
import { describe, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import * as v from "valibot";
import { parse } from "yaml";
import { parseAgentConfig } from "../agent/config.ts";
import { parseCsiConfig } from "../csi/config.ts";
import { parseParameters } from "../csi/controller/parameters.ts";
import { parseCoreMask } from "../lib/spdk/core-mask.ts";
import { parseConfig as parseManagerConfig } from "../manager/config.ts";
import { VALUES_SCHEMA_PATH, ValuesSchema, valuesJsonSchema } from "../scripts/gen-values-schema.ts";

const CHART = join(import.meta.dir, "distort");
const defaults = parse(readFileSync(join(CHART, "values.yaml"), "utf8")) as Record<string, unknown>;
const exampleFiles = readdirSync(join(CHART, "examples")).filter((f) => f.endsWith(".yaml"));

type Obj = Record<string, unknown>;
const isObj = (x: unknown): x is Obj => typeof x === "object" && x !== null && !Array.isArray(x);

/** Helm's coalescing: maps merge key by key, anything else (lists included) replaces. */
function merge(base: unknown, over: unknown): unknown {
  if (!isObj(base) || !isObj(over)) return structuredClone(over);
  const out: Obj = structuredClone(base);
  for (const [k, val] of Object.entries(over)) out[k] = k in out ? merge(out[k], val) : structuredClone(val);
  return out;
}

/** Defaults with `path` (dotted; numeric parts index lists) set to `value`. */
function withValue(path: string, value: unknown): Obj {
  const out = structuredClone(defaults);
  const parts = path.split(".");
  let cur: Obj = out;
  for (const p of parts.slice(0, -1)) cur = cur[p] as Obj;
  cur[parts.at(-1) as string] = value;
  return out;
}

function get(values: Obj, path: string): unknown {
  return path.split(".").reduce<unknown>((o, p) => (o as Obj)[p], values);
}

const valuesAccept = (values: Obj) => v.safeParse(ValuesSchema, values).success;
const succeeds = (fn: () => unknown) => {
  try {
    fn();
    return true;
  } catch {
    return false;
  }
};

// How each binary would see a value, as the templates render it (String(x) into env or a flag).
const agentAccepts = (env: Record<string, string>) =>
  succeeds(() => parseAgentConfig({ NODE_NAME: "node-a", ...env }));
const managerAccepts = (env: Record<string, string>) =>
  succeeds(() => parseManagerConfig(env, { hostname: "h", randomSuffix: "r" }));
const csiAccepts = (flag: string, value: string) =>
  succeeds(() => parseCsiConfig([`--${flag}=${value}`, "--mode=controller"], {}));

interface Binding {
  /** Value path in values.yaml. */
  path: string;
  /** What the binary does with the rendered value. */
  binary: (rendered: string) => boolean;
  /** Values to try, beyond the default. */
  candidates: unknown[];
  /** Schema and binary bounds are meant to coincide (else the schema may only be stricter). */
  exact: boolean;
}

const BINDINGS: Binding[] = [
  {
    path: "agent.reportPeriodMs",
    binary: (s) => agentAccepts({ DISTORT_REPORT_PERIOD_MS: s }),
    candidates: [0, 999, 1000, 3_600_000, 3_600_001, 1.5, -1],
    exact: true,
  },
  {
    path: "agent.verifyPeriodMs",
    binary: (s) => agentAccepts({ DISTORT_VERIFY_PERIOD_MS: s }),
    candidates: [999, 1000, 3_600_000, 3_600_001],
    exact: true,
  },
  {
    path: "agent.rebuild.maxBandwidthMBps",
    binary: (s) => agentAccepts({ DISTORT_REBUILD_MAX_BANDWIDTH_MB_SEC: s }),
    candidates: [0, 1, 16, 1_000_000, 1_000_001, -1, 1.5],
    exact: true,
  },
  {
    path: "agent.rebuild.perNode",
    binary: (s) => agentAccepts({ DISTORT_REBUILDS_PER_NODE: s }),
    candidates: [0, 1, 64, 65, -1, 2.5],
    exact: true,
  },
  {
    path: "agent.portal.port",
    binary: (s) => agentAccepts({ DISTORT_PORTAL_PORT: s }),
    candidates: [0, 1, 4420, 65535, 65536],
    exact: true,
  },
  {
    path: "agent.healthPort",
    binary: (s) => agentAccepts({ DISTORT_HEALTH_PORT: s }),
    candidates: [0, 1, 65535, 65536],
    exact: false, // the agent allows 0 (any port) for tests; a DaemonSet needs a fixed one
  },
  {
    path: "agent.spdk.coreMask",
    // The agent's env check, then the supervisor's parse before nvmf_tgt starts.
    binary: (s) => agentAccepts({ DISTORT_SPDK_CORE_MASK: s }) && succeeds(() => parseCoreMask(s)),
    candidates: [
      "0x1",
      "0x0",
      "0x000",
      "0x0F",
      "0xf0",
      "3",
      "0x",
      "[0-3]",
      "0xg",
      `0x${"f".repeat(256)}`,
      `0x1${"0".repeat(256)}`,
    ],
    exact: true,
  },
  {
    path: "agent.portal.address",
    binary: (s) => agentAccepts(s === "" ? {} : { DISTORT_PORTAL_ADDRESS: s }),
    candidates: ["", "192.0.2.10", "999.1.1.1", "fe80::1", "2001:db8::1", "1::2::3", "host.example"],
    exact: true,
  },
  {
    path: "agent.backends",
    binary: (s) => agentAccepts({ DISTORT_BACKENDS: s }),
    candidates: [["spdk"], ["kernel"], ["kernel", "spdk"], ["nvmet"], []],
    exact: true,
  },
  {
    path: "logLevel",
    binary: (s) =>
      agentAccepts({ DISTORT_LOG_LEVEL: s }) &&
      managerAccepts({ DISTORT_LOG_LEVEL: s }) &&
      csiAccepts("log-level", s),
    candidates: ["debug", "warn", "error", "trace", "INFO"],
    exact: true,
  },
  {
    path: "manager.workers",
    binary: (s) => managerAccepts({ DISTORT_WORKERS: s }),
    candidates: [0, 1, 256, 257],
    exact: true,
  },
  {
    path: "manager.placementWorkers",
    binary: (s) => managerAccepts({ DISTORT_PLACEMENT_WORKERS: s }),
    candidates: [0, 1, 256, 257],
    exact: true,
  },
  {
    path: "manager.spreadPolicy",
    binary: (s) => managerAccepts({ DISTORT_SPREAD_POLICY: s }),
    candidates: ["least-loaded-node", "round-robin"],
    exact: true,
  },
  {
    path: "manager.thinLvstoreFullPercent",
    binary: (s) => managerAccepts({ DISTORT_THIN_LVSTORE_FULL_PERCENT: s }),
    candidates: [0, 1, 85, 100, 101],
    exact: true,
  },
  {
    path: "manager.heartbeatStalenessMs",
    binary: (s) => managerAccepts({ DISTORT_HEARTBEAT_STALENESS_MS: s }),
    candidates: [999, 1000, 10 ** 9],
    exact: true,
  },
  {
    path: "manager.resyncMs",
    binary: (s) => managerAccepts({ DISTORT_RESYNC_MS: s }),
    candidates: [-1, 0, 1],
    exact: true,
  },
  {
    path: "manager.healthPort",
    binary: (s) => managerAccepts({ DISTORT_HEALTH_PORT: s }),
    candidates: [0, 1, 65535, 65536],
    exact: false, // 0 (any port) is for tests
  },
  {
    path: "manager.leaderElection.leaseName",
    binary: (s) => managerAccepts({ DISTORT_LEASE_NAME: s }),
    candidates: ["", "x", "Upper"],
    exact: false, // a Lease name must be a DNS subdomain; the manager only checks non-empty
  },
  {
    path: "agent.spdk.hugepages.sizeMiB",
    // 0 renders no DISTORT_SPDK_MEM_SIZE_MB at all (agent.yaml).
    binary: (s) => agentAccepts(s === "0" ? {} : { DISTORT_SPDK_MEM_SIZE_MB: s }),
    candidates: [0, 1, 255, 256, 1_048_576, 1_048_577, -1],
    exact: true,
  },
  {
    path: "manager.placementBackoff.initialMs",
    binary: (s) => managerAccepts({ DISTORT_PLACEMENT_BACKOFF_INITIAL_MS: s }),
    candidates: [9, 10, 60_000, 1.5],
    exact: true,
  },
  {
    path: "manager.placementBackoff.maxMs",
    binary: (s) =>
      managerAccepts({ DISTORT_PLACEMENT_BACKOFF_INITIAL_MS: "10", DISTORT_PLACEMENT_BACKOFF_MAX_MS: s }),
    candidates: [9, 10, 60_000, 10 ** 9],
    exact: true,
  },
  {
    path: "csi.controller.orphanGraceMs",
    binary: (s) => csiAccepts("orphan-grace-ms", s),
    candidates: [-1, 0, 86_400_000, 86_400_001],
    exact: true,
  },
  {
    path: "csi.controller.orphanSweepMs",
    binary: (s) => csiAccepts("orphan-sweep-ms", s),
    candidates: [999, 1000, 3_600_000, 3_600_001],
    exact: true,
  },
  {
    path: "csi.node.stagingSweepMs",
    binary: (s) => csiAccepts("staging-sweep-ms", s),
    candidates: [0, 1, 999, 1000, 60_000, 3_600_000, 3_600_001, -1, 1.5],
    exact: true,
  },
  {
    path: "csi.defaultTimeoutMs",
    binary: (s) => csiAccepts("default-timeout-ms", s),
    candidates: [999, 1000, 3_600_000, 3_600_001],
    exact: true,
  },
  {
    path: "csi.defaultVolumeBytes",
    binary: (s) => csiAccepts("default-volume-bytes", s),
    candidates: [0, 4 * 1024 * 1024, 4 * 1024 * 1024 + 1, 3 * 1024 * 1024, 8 * 1024 * 1024],
    exact: true,
  },
  {
    path: "csi.shutdownGraceMs",
    binary: (s) => csiAccepts("shutdown-grace-ms", s),
    candidates: [-1, 0, 600_000, 600_001],
    exact: true,
  },
  {
    path: "csi.controller.healthPort",
    binary: (s) => csiAccepts("health-port", s),
    candidates: [0, 1, 65535, 65536],
    exact: false,
  },
];

const render = (x: unknown) => (Array.isArray(x) ? x.join(",") : String(x));

describe("values.schema.json", () => {
  test("is what scripts/gen-values-schema.ts generates (run `bun run gen` after changing the schema)", () => {
    // Every key, value and key order, compared in-process. The generator's only other step is
    // `biome format` (a subprocess, ~0.4 s), which changes whitespace alone; `biome check .` holds
    // the committed file to that formatting.
    const committed = JSON.parse(readFileSync(VALUES_SCHEMA_PATH, "utf8"));
    expect(JSON.stringify(committed, null, 2)).toBe(JSON.stringify(valuesJsonSchema(), null, 2));
  });

  test("values.yaml satisfies the schema", () => {
    const r = v.safeParse(ValuesSchema, defaults);
    expect(r.issues?.map((i) => `${v.getDotPath(i)}: ${i.message}`) ?? []).toEqual([]);
  });

  test.each(exampleFiles)("examples/%s satisfies the schema over values.yaml", (file) => {
    const over = parse(readFileSync(join(CHART, "examples", file), "utf8"));
    const r = v.safeParse(ValuesSchema, merge(defaults, over));
    expect(r.issues?.map((i) => `${v.getDotPath(i)}: ${i.message}`) ?? []).toEqual([]);
  });

  test("refuses misspelt keys and containers without limits", () => {
    expect(valuesAccept({ ...defaults, logLevl: "info" })).toBe(false);
    expect(valuesAccept(withValue("manager.resources", { requests: { cpu: "1", memory: "1Gi" } }))).toBe(
      false,
    );
  });
});

describe("values a binary reads agree with its own config parser", () => {
  for (const b of BINDINGS) {
    test(b.path, () => {
      const tried = [get(defaults, b.path), ...b.candidates];
      const disagreements: string[] = [];
      for (const c of tried) {
        const schema = valuesAccept(withValue(b.path, c));
        const binary = b.binary(render(c));
        if (schema && !binary) disagreements.push(`${JSON.stringify(c)}: chart accepts, binary refuses`);
        if (b.exact && !schema && binary)
          disagreements.push(`${JSON.stringify(c)}: binary accepts, chart refuses`);
      }
      expect(disagreements).toEqual([]);
      // The default itself must start the binary.
      expect(b.binary(render(get(defaults, b.path)))).toBe(true);
    });
  }
});

describe("agent.rebuild", () => {
  const issues = (path: string, value: unknown) =>
    v.safeParse(ValuesSchema, withValue(path, value)).issues?.map((i) => `${v.getDotPath(i)}: ${i.message}`);
  test.each([
    ["agent.rebuild.perNode", 65, "0 to 64"],
    ["agent.rebuild.perNode", -1, "0 to 64"],
    ["agent.rebuild.perNode", 2.5, "0 to 64"],
    ["agent.rebuild.perNode", "2", "0 to 64"],
    ["agent.rebuild.maxBandwidthMBps", -1, "0 to 1000000"],
    ["agent.rebuild.maxBandwidthMBps", 1_000_001, "0 to 1000000"],
    ["agent.rebuild.maxBandwidthMBps", 0.5, "0 to 1000000"],
  ])("%s: %p is refused, naming the value and its range", (path, value, range) => {
    expect(issues(path, value)).toEqual([`${path}: ${path} must be a whole number from ${range}`]);
  });
  test("helm enforces the same bounds: values.schema.json holds them as integer ranges", () => {
    const props = valuesJsonSchema().properties as Record<string, { properties: Record<string, unknown> }>;
    const agent = props.agent as { properties: Record<string, unknown> };
    expect(agent.properties.rebuild).toMatchObject({
      properties: {
        maxBandwidthMBps: { type: "integer", minimum: 0, maximum: 1_000_000 },
        perNode: { type: "integer", minimum: 0, maximum: 64 },
      },
      additionalProperties: false,
    });
  });
});

describe("StorageClass entries agree with the CSI controller's parameter parser", () => {
  type Sc = Obj & {
    reconnect?: Obj;
    dhchapSecret?: { name: string; key: string };
    dhchap?: { mode: string; hash?: string; dhgroup?: string };
  };
  // The parameters storage-classes.yaml renders for one entry.
  const parameters = (sc: Sc): Record<string, string> => {
    const p: Record<string, string> = {
      backend: String(sc.backend),
      volumeManager: String(sc.volumeManager),
      transport: String(sc.transport),
      "csi.storage.k8s.io/fstype": String(sc.fsType),
    };
    if (sc.portalPort !== undefined) p.portalPort = String(sc.portalPort);
    for (const [k, val] of Object.entries(sc.reconnect ?? {})) p[k] = String(val);
    if (sc.dhchap && sc.dhchap.mode !== "none") {
      p.dhchapMode = sc.dhchap.mode;
      if (sc.dhchap.hash !== undefined) p.dhchapHash = sc.dhchap.hash;
      if (sc.dhchap.dhgroup !== undefined) p.dhchapGroup = sc.dhchap.dhgroup;
    }
    if (sc.dhchapSecret) {
      p.dhchapSecretName = sc.dhchapSecret.name;
      p.dhchapSecretKey = sc.dhchapSecret.key;
    }
    return p;
  };
  // A shared DH-HMAC-CHAP Secret is validated and then refused (generated keys replace it).
  const csiAccepts = (sc: Sc) => {
    try {
      parseParameters(parameters(sc), "distort-system");
      return true;
    } catch (err) {
      if (sc.dhchapSecret && /not supported/.test(String(err))) return true;
      return false;
    }
  };
  const base = (defaults.storageClasses as Sc[])[0] as Sc;
  const classes: Sc[] = [
    ...(defaults.storageClasses as Sc[]),
    ...exampleFiles.flatMap(
      (f) => (parse(readFileSync(join(CHART, "examples", f), "utf8")).storageClasses ?? []) as Sc[],
    ),
  ];
  const variants: Sc[] = [
    { ...base, backend: "kernel", volumeManager: "spdk-lvol" },
    { ...base, backend: "spdk", volumeManager: "parted" },
    { ...base, backend: "kernel", volumeManager: "partition" },
    { ...base, transport: "fc" },
    { ...base, portalPort: 0 },
    { ...base, portalPort: 65535 },
    ...[-2, -1, 0, 86400, 86401].map((n) => ({ ...base, reconnect: { ctrlLossTmo: n } })),
    ...[0, 1, 3600, 3601].map((n) => ({ ...base, reconnect: { reconnectDelay: n } })),
    ...[-2, -1, 86400, 86401].map((n) => ({ ...base, reconnect: { fastIoFailTmo: n } })),
    { ...base, dhchapSecret: { name: "Bad_Name", key: "key" } },
    { ...base, dhchapSecret: { name: "ok", key: "k/ey" } },
    { ...base, backend: "spdk", dhchap: { mode: "bidirectional", hash: "sha384", dhgroup: "ffdhe2048" } },
    { ...base, backend: "spdk", dhchap: { mode: "unidirectional" } },
    { ...base, dhchap: { mode: "none" } },
    { ...base, dhchap: { mode: "mutual" } },
    { ...base, backend: "spdk", dhchap: { mode: "bidirectional", hash: "md5" } },
  ];
  test("every rendered class is one the controller accepts", () => {
    for (const sc of classes)
      expect({ name: sc.name, ok: csiAccepts(sc) }).toEqual({ name: sc.name, ok: true });
  });
  test("the schema admits exactly the parameter values the controller admits", () => {
    const disagreements = variants.flatMap((sc) => {
      const schema = valuesAccept(withValue("storageClasses", [sc]));
      const csi = csiAccepts(sc);
      return schema === csi ? [] : [`${JSON.stringify(parameters(sc))}: chart ${schema}, csi ${csi}`];
    });
    expect(disagreements).toEqual([]);
  });
});

describe("docs/install.md", () => {
  const doc = readFileSync(join(import.meta.dir, "..", "docs", "install.md"), "utf8");
  // Leaves of values.yaml (lists and free-form maps count as one value).
  const leaves = (o: Obj, prefix = ""): string[] =>
    Object.entries(o).flatMap(([k, val]) => {
      const p = prefix ? `${prefix}.${k}` : k;
      return isObj(val) && Object.keys(val).length > 0 && !/resources|nodeSelector|labels|affinity/.test(k)
        ? leaves(val, p)
        : [p];
    });
  test("documents every value", () => {
    const missing = leaves(defaults).filter((p) => !doc.includes(`\`${p}\``));
    expect(missing).toEqual([]);
  });
});
