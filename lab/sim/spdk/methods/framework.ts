// Framework and app-level methods: version, method list, init sequencing under --wait-for-rpc,
// reactors of the core mask, subsystems, iobuf options and spdk_kill_instance.
import * as v from "valibot";
import type { App } from "../app.ts";
import { cpumaskHex, TICK_RATE } from "../core-mask.ts";
import type { JsonValue } from "../json-stream.ts";
import { ANY_STATE, type MethodSpec, NVMF_TGT_METHOD_ORDER, RUNTIME, STARTUP } from "../method-table.ts";
import {
  bool,
  DECODE_FAILED_PARAMS,
  decode,
  decodeOptional,
  INVALID_PARAMS,
  noParams,
  str,
  u32,
} from "../params.ts";
import { Errno, RpcError } from "../rpc-error.ts";

/** spdk_get_version of v25.05.1. */
export const SPDK_VERSION: JsonValue = {
  version: "SPDK v25.05.1 git sha1 44b23be7c3",
  fields: { major: 25, minor: 5, patch: 1, suffix: "", commit: "44b23be7c3" },
};

/** spdk_get_version of a v26.01 release build (no git sha1: built from the release tarball). */
export const SPDK_VERSION_26_01: JsonValue = {
  version: "SPDK v26.01",
  fields: { major: 26, minor: 1, patch: 0, suffix: "" },
};

/** nvmf_tgt's subsystems and their dependencies (a property of the app, not of its state). */
const NVMF_TGT_SUBSYSTEMS: JsonValue = [
  { subsystem: "keyring", depends_on: [] },
  { subsystem: "iobuf", depends_on: [] },
  { subsystem: "sock", depends_on: [] },
  { subsystem: "vmd", depends_on: [] },
  { subsystem: "accel", depends_on: ["iobuf"] },
  { subsystem: "bdev", depends_on: ["accel", "keyring", "vmd", "sock", "iobuf"] },
  { subsystem: "nbd", depends_on: ["bdev"] },
  { subsystem: "scheduler", depends_on: [] },
  { subsystem: "nvmf", depends_on: ["bdev", "keyring", "sock"] },
];

const SIGNALS = ["SIGINT", "SIGTERM", "SIGQUIT", "SIGHUP", "SIGKILL", "SIGUSR1"];

/**
 * The framework methods of `app`. `implemented` is the emulator's full method table, which
 * rpc_get_methods reports in nvmf_tgt's registration order.
 */
export function frameworkMethods(app: App, implemented: () => ReadonlyMap<string, MethodSpec>): MethodSpec[] {
  return [
    {
      name: "spdk_get_version",
      states: ANY_STATE,
      handler: (req) => {
        noParams(req, "spdk_get_version method requires no parameters");
        return app.config.spdkVersion === "26.01" ? SPDK_VERSION_26_01 : SPDK_VERSION;
      },
    },
    {
      name: "rpc_get_methods",
      states: ANY_STATE,
      handler: (req) => {
        const p = decodeOptional(
          req,
          v.strictObject({ current: v.optional(bool), include_aliases: v.optional(bool) }),
          INVALID_PARAMS,
        );
        const table = implemented();
        return NVMF_TGT_METHOD_ORDER.filter((name) => {
          const spec = table.get(name);
          return spec !== undefined && (!p.current || spec.states.includes(app.state));
        });
      },
    },
    {
      name: "framework_start_init",
      states: STARTUP,
      handler: async (req) => {
        noParams(req, "framework_start_init requires no parameters");
        await app.startInit();
        return true;
      },
    },
    {
      name: "framework_wait_init",
      states: ANY_STATE,
      handler: (req) => {
        noParams(req, "framework_wait_init requires no parameters");
        if (app.state === "runtime") return true;
        return app.whenRuntime().then(() => true);
      },
    },
    {
      name: "framework_get_reactors",
      states: RUNTIME,
      handler: (req) => {
        noParams(req, "`framework_get_reactors` requires no arguments");
        return reactors(app);
      },
    },
    {
      // lib/event/app_rpc.c rpc_thread_get_stats: every SPDK thread with its busy and idle ticks.
      name: "thread_get_stats",
      states: RUNTIME,
      handler: (req) => {
        noParams(req, "'thread_get_stats' requires no arguments");
        return threadStats(app);
      },
    },
    {
      name: "framework_get_subsystems",
      states: RUNTIME,
      handler: (req) => {
        noParams(req, "'framework_get_subsystems' requires no arguments");
        return NVMF_TGT_SUBSYSTEMS;
      },
    },
    {
      name: "iobuf_set_options",
      states: STARTUP,
      handler: (req) => {
        const p = decode(
          req,
          v.strictObject({
            small_pool_count: v.optional(u32),
            large_pool_count: v.optional(u32),
            small_bufsize: v.optional(u32),
            large_bufsize: v.optional(u32),
            enable_numa: v.optional(bool),
          }),
          DECODE_FAILED_PARAMS,
        );
        const next = {
          small_pool_count: p.small_pool_count ?? app.iobuf.small_pool_count,
          large_pool_count: p.large_pool_count ?? app.iobuf.large_pool_count,
          small_bufsize: p.small_bufsize ?? app.iobuf.small_bufsize,
          large_bufsize: p.large_bufsize ?? app.iobuf.large_bufsize,
        };
        // spdk_iobuf_set_opts' lower bounds; below them it returns -EINVAL.
        if (
          next.small_pool_count < 64 ||
          next.large_pool_count < 8 ||
          next.small_bufsize < 4096 ||
          next.large_bufsize < 8192
        ) {
          throw RpcError.errno(Errno.EINVAL);
        }
        app.iobuf = next;
        return true;
      },
    },
    {
      name: "spdk_kill_instance",
      states: RUNTIME,
      handler: (req) => {
        const p = decode(req, v.strictObject({ sig_name: str }), INVALID_PARAMS);
        const sig = SIGNALS.find((s) => s === p.sig_name);
        if (!sig) throw RpcError.invalidParams();
        // The reply is queued first, then the signal lands (SIGKILL never lets it out).
        if (sig === "SIGKILL") {
          app.hooks.kill(sig);
          return new Promise(() => {});
        }
        setTimeout(() => app.hooks.kill(sig), 5);
        return true;
      },
    },
  ];
}

function reactors(app: App): JsonValue {
  const { clock, cores } = app.config;
  const ticks = (ms: number) => Math.max(0, Math.round((ms / 1000) * TICK_RATE));
  const elapsed = ticks(clock.now() - app.startedAt);
  const cpu = process.cpuUsage();
  const busy = Math.min(elapsed, ticks((cpu.user + cpu.system) / 1000));
  let threadId = 1;
  const all = cpumaskHex(cores);
  return {
    tick_rate: TICK_RATE,
    pid: process.pid,
    reactors: cores.map((lcore, i) => {
      const threads: JsonValue[] = [];
      if (i === 0) threads.push({ name: "app_thread", id: threadId++, cpumask: all, elapsed });
      threads.push({
        name: `nvmf_tgt_poll_group_${String(i).padStart(3, "0")}`,
        id: threadId++,
        cpumask: cpumaskHex([lcore]),
        elapsed,
      });
      return {
        lcore,
        tid: process.pid + i,
        busy: i === 0 ? busy : 0,
        idle: i === 0 ? elapsed - busy : elapsed,
        in_interrupt: false,
        irq: 0,
        // Clock ticks (1/100 s) of CPU time, charged to the main reactor.
        sys: i === 0 ? Math.round(cpu.system / 10_000) : 0,
        usr: i === 0 ? Math.round(cpu.user / 10_000) : 0,
        lw_threads: threads,
      };
    }),
  };
}

/**
 * thread_get_stats: the threads framework_get_reactors lists (app_thread, then one poll group per
 * reactor), with the busy/idle split of the reactor each runs on; the pollers an idle nvmf_tgt
 * has (app_thread: 2 timed; a poll group: 3 active, 8 timed in the v25.05.1 transcript).
 */
function threadStats(app: App): JsonValue {
  const r = reactors(app) as {
    tick_rate: number;
    reactors: { busy: number; idle: number; lw_threads: { name: string; id: number; cpumask: string }[] }[];
  };
  const threads: JsonValue[] = [];
  for (const reactor of r.reactors) {
    const n = reactor.lw_threads.length;
    for (const t of reactor.lw_threads) {
      const app_thread = t.name === "app_thread";
      threads.push({
        name: t.name,
        id: t.id,
        cpumask: t.cpumask,
        busy: Math.round(reactor.busy / n),
        idle: Math.round(reactor.idle / n),
        active_pollers_count: app_thread ? 0 : 3,
        timed_pollers_count: app_thread ? 2 : 8,
        paused_pollers_count: 0,
      });
    }
  }
  return { tick_rate: r.tick_rate, threads };
}
