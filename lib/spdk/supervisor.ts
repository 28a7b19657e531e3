// The nvmf_tgt supervisor: adopts a target already serving the RPC socket when its reactors match
// the configured core mask, otherwise starts one with --wait-for-rpc and initialises it
// transactionally; then pings it and restarts a process it started when it dies or hangs.

import * as v from "valibot";
import type { Clock } from "../clock.ts";
import { StorageError } from "../errors.ts";
import type { Logger } from "../log.ts";
import type { Counter, Gauge, Histogram, Registry } from "../metrics.ts";
import type { SpdkRpc } from "./client.ts";
import { type CoreMask, coreMaskOfReactors, parseCoreMask, sameCores } from "./core-mask.ts";
import { SpdkError } from "./errors.ts";
import { type IobufSetOptionsParams, SpdkMethods } from "./methods.ts";
import { IobufSetOptionsParams as IobufSchema } from "./params.ts";
import type {
  ChildProcess,
  ProcessExit,
  ProcessInspector,
  ProcessRunner,
  SocketFiles,
} from "./process-runner.ts";

/** Where the supervisor stands with the target on its socket. */
export type SupervisorState =
  /** Nothing usable serves the socket (never started, failed, died, refused, or stopped). */
  | "down"
  /** A probe, adoption or start is in progress. */
  | "starting"
  /** A process this supervisor started is initialised and answering. */
  | "started"
  /** A process somebody else started is initialised, answering, and runs the configured mask. */
  | "adopted";

/** An RPC connection the supervisor owns and closes; SpdkClient is one. */
export interface SupervisorRpc extends SpdkRpc {
  /** Fails pending calls and releases the connection; idempotent. */
  close(): Promise<void>;
}

/** Options applied only to a process in the --wait-for-rpc phase, before framework_start_init. */
export interface StartupOptions {
  iobuf?: IobufSetOptionsParams;
  /** nvmf_set_max_subsystems: one subsystem per exported volume, plus discovery. */
  maxSubsystems?: number;
}

export interface NvmfTgtSupervisorOptions {
  /**
   * argv prefix that runs nvmf_tgt, e.g. ["/usr/local/bin/nvmf_tgt"] or [bun, "emulator-cli.ts"];
   * may be empty when launch is false.
   */
  command: readonly string[];
  /**
   * false: never start a target, only adopt (and initialise) the one another container or the
   * host runs on the socket, waiting for it while none answers. A target lost and found again is
   * treated as a new one (onRestart), since a process restarted by someone else is only ever
   * seen as an answer on a new connection. Default true.
   */
  launch?: boolean;
  /** The RPC socket nvmf_tgt serves (-r). */
  socketPath: string;
  /** Node-global reactor core mask, "0x3" or "[0,2-3]"; passed as -m in canonical hex. */
  coreMask: string;
  /** More nvmf_tgt arguments (e.g. ["--no-huge", "-s", "1024"]); never -m, -r, --wait-for-rpc. */
  extraArgs?: readonly string[];
  startupOptions?: StartupOptions;
  /**
   * Opens a fresh client on socketPath. The supervisor opens one per probe and one per target
   * process it supervises, so reconnect backoff from a dead process never slows the next one.
   */
  openClient: () => SupervisorRpc;
  runner: ProcessRunner;
  inspector: ProcessInspector;
  sockets: SocketFiles;
  clock: Clock;
  logger: Logger;
  /** Registers distort_nvmf_tgt_* series when given. */
  metrics?: Registry;
  /** Period of the background liveness ping. Default 5000. */
  livenessPeriodMs?: number;
  /** Deadline of one liveness ping (spdk_get_version) and of the initial probe. Default 2000. */
  pingTimeoutMs?: number;
  /** Consecutive failed pings after which the target counts as hung. Default 3. */
  unresponsiveLimit?: number;
  /**
   * Delay before the n-th consecutive restart attempt: none for the first (a target lost after a
   * healthy run is replaced as fast as it can start, since every export waits for it), then
   * initialMs * 2^(n-2), at most maxMs, so a crash loop still backs off. The count resets once a
   * target has answered pings for maxMs. Default 500 / 30000.
   */
  restartBackoff?: { initialMs: number; maxMs: number };
  /** Bound from spawn to an initialised target (socket answer, startup options, init). Default 60000. */
  readyTimeoutMs?: number;
  /** Interval between readiness probes of a starting process. Default 100. */
  readinessPollMs?: number;
  /** How long a process gets to exit after SIGTERM before SIGKILL. Default 5000. */
  stopGraceMs?: number;
  /**
   * Called after every start that brought up a NEW target: a process this supervisor spawned, or
   * an adopted one it had to take through framework_start_init. Its runtime NVMe-oF state
   * (transports, subsystems, listeners, hosts) is empty, while lvol metadata on the drives
   * survived; the agent re-verifies and re-exports every partition. Calls never overlap, run
   * after the supervisor is "started" (so the hook may call ensureRunning), and are not awaited
   * by ensureRunning. A hook that throws is logged and not retried: the agent's periodic
   * reconcile repairs what it missed.
   */
  onRestart?: () => void | Promise<void>;
}

const Ms = (min: number) => v.pipe(v.number(), v.integer(), v.minValue(min));
const NonEmpty = v.pipe(v.string(), v.minLength(1));
const OptionsSchema = v.object({
  command: v.array(NonEmpty),
  socketPath: v.pipe(NonEmpty, v.startsWith("/", "socketPath must be absolute")),
  extraArgs: v.optional(v.array(v.string()), []),
  startupOptions: v.optional(
    v.strictObject({
      iobuf: v.optional(IobufSchema),
      maxSubsystems: v.optional(v.pipe(v.number(), v.integer(), v.minValue(1))),
    }),
    {},
  ),
  livenessPeriodMs: v.optional(Ms(10), 5000),
  pingTimeoutMs: v.optional(Ms(1), 2000),
  unresponsiveLimit: v.optional(Ms(1), 3),
  restartBackoff: v.optional(
    v.pipe(
      v.object({ initialMs: Ms(0), maxMs: Ms(0) }),
      v.check((b) => b.maxMs >= b.initialMs, "restartBackoff.maxMs must be >= restartBackoff.initialMs"),
    ),
    { initialMs: 500, maxMs: 30_000 },
  ),
  readyTimeoutMs: v.optional(Ms(1), 60_000),
  readinessPollMs: v.optional(Ms(1), 100),
  stopGraceMs: v.optional(Ms(0), 5000),
});

/** Arguments the supervisor sets itself; in extraArgs they would contradict what it verifies. */
const RESERVED_ARGS = [
  "-m",
  "--cpumask",
  "-r",
  "--rpc-socket",
  "--wait-for-rpc",
  "--no-rpc-server",
  "--lcores",
];

function reservedArg(arg: string): string | undefined {
  return RESERVED_ARGS.find(
    (r) =>
      arg === r ||
      (r.startsWith("--") ? arg.startsWith(`${r}=`) : arg.startsWith(r) && arg.length > r.length),
  );
}

// After SIGKILL only an uninterruptible sleep keeps a process around; do not wait forever.
const KILL_WAIT_MS = 5000;
// Lines of target output kept to explain a failed start.
const TAIL_LINES = 20;

/** One process the supervisor looks after (or tries to), from probe or spawn to its end. */
interface Target {
  readonly kind: "managed" | "adopted";
  readonly child: ChildProcess | undefined;
  pid: number | undefined;
  rpc: SupervisorRpc | undefined;
  methods: SpdkMethods | undefined;
  /** The connection generation the target was adopted over (adopted targets only). */
  generation?: number | undefined;
  phase: "starting" | "ready" | "ending";
  readyAt: number;
  misses: number;
  readonly tail: string[];
}

export interface SupervisorMetrics {
  up: Gauge;
  starts: Counter<"outcome">;
  losses: Counter<"reason">;
  pingFailures: Counter;
  startupSeconds: Histogram;
}

/** The supervisor's families on `r` (registered with reuse, so the agent may pre-register them). */
export function nvmfTgtMetrics(r: Registry): SupervisorMetrics {
  return {
    up: r.gauge({
      name: "distort_nvmf_tgt_up",
      help: "1 while nvmf_tgt is initialised and answering",
      reuse: true,
    }),
    starts: r.counter({
      name: "distort_nvmf_tgt_starts_total",
      help: "Attempts to bring nvmf_tgt up, by outcome (started, adopted, failed)",
      labelNames: ["outcome"],
      reuse: true,
    }),
    losses: r.counter({
      name: "distort_nvmf_tgt_failures_total",
      help: "nvmf_tgt processes lost while serving, by reason (exited, unresponsive)",
      labelNames: ["reason"],
      reuse: true,
    }),
    pingFailures: r.counter({
      name: "distort_nvmf_tgt_ping_failures_total",
      help: "Liveness pings that got no answer",
      reuse: true,
    }),
    startupSeconds: r.histogram({
      name: "distort_nvmf_tgt_startup_seconds",
      help: "Time from spawning nvmf_tgt to an initialised target",
      buckets: [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      reuse: true,
    }),
  };
}

function describeExit(exit: ProcessExit): string {
  return exit.signal ? `killed by ${exit.signal}` : `exited with code ${exit.code}`;
}

/** SPDK's -1 "Method may only be called before/after framework is initialized". */
function isPhaseError(err: unknown): boolean {
  return err instanceof SpdkError && err.code === -1;
}

/**
 * Supervises the node's nvmf_tgt on one RPC socket.
 *
 * Readiness is a successful RPC round trip, never the socket file. A target that answers is
 * adopted only when framework_get_reactors shows exactly the configured lcores (a target still
 * in --wait-for-rpc is first taken through startup options, framework_start_init and
 * framework_wait_init); otherwise StorageError("precondition") names both masks and the target
 * is left running. With nothing answering, it spawns `command -m <mask> -r <socket>
 * --wait-for-rpc <extraArgs>` (under PR_SET_PDEATHSIG when the runner can), waits for an answer,
 * applies startup options, initialises the framework and checks the reactors. Any failure on
 * that path terminates and reaps the spawned process (SIGTERM, SIGKILL after stopGraceMs) and
 * removes the socket file it left, so a retry starts clean. It never signals a process it did
 * not spawn.
 *
 * start() adds a liveness loop: a ping every livenessPeriodMs; a started process that exits is
 * restarted at once (after the backoff delay when the attempt before failed too), one that
 * misses unresponsiveLimit pings in a row is terminated and restarted; an adopted one that
 * stops answering is dropped (state "down"), and a process of its own is started only once
 * nothing listens on the socket any more.
 *
 * Concurrency: calls may overlap freely; one bring-up runs at a time and concurrent
 * ensureRunning() calls share it.
 */
export class NvmfTgtSupervisor {
  readonly #mask: CoreMask;
  readonly #argv: readonly string[];
  readonly #socketPath: string;
  readonly #startup: StartupOptions;
  readonly #openClient: () => SupervisorRpc;
  readonly #runner: ProcessRunner;
  readonly #inspector: ProcessInspector;
  readonly #sockets: SocketFiles;
  readonly #clock: Clock;
  readonly #log: Logger;
  readonly #metrics: SupervisorMetrics | undefined;
  readonly #onRestart: (() => void | Promise<void>) | undefined;
  readonly #livenessPeriodMs: number;
  readonly #pingTimeoutMs: number;
  readonly #unresponsiveLimit: number;
  readonly #backoff: { initialMs: number; maxMs: number };
  readonly #readyTimeoutMs: number;
  readonly #readinessPollMs: number;
  readonly #stopGraceMs: number;

  readonly #launch: boolean;
  /** An adopted target was lost; the next one adopted counts as new (launch false). */
  #lostAdopted = false;
  #state: SupervisorState = "down";
  #target: Target | undefined;
  #bringUp: Promise<void> | undefined;
  #ping: Promise<void> | undefined;
  #failures = 0;
  #loop = false;
  #ticking = false;
  #cancelTick: () => void = () => {};
  #hooks: Promise<void> = Promise.resolve();
  /** Cleanup after an unexpected exit; a restart waits for it so it never unlinks a new socket. */
  #exitCleanup: Promise<void> = Promise.resolve();
  #stopped: Promise<void> | undefined;
  readonly #abort = new AbortController();

  /**
   * Validates everything up front and starts nothing. Throws StorageError("invalid") for a bad
   * core mask (empty, zero, malformed, out of range), command, socket path, extra argument that
   * the supervisor sets itself, startup option or timing.
   */
  constructor(opts: NvmfTgtSupervisorOptions) {
    this.#mask = parseCoreMask(opts.coreMask);
    const parsed = v.safeParse(OptionsSchema, {
      command: opts.command,
      socketPath: opts.socketPath,
      extraArgs: opts.extraArgs,
      startupOptions: opts.startupOptions,
      livenessPeriodMs: opts.livenessPeriodMs,
      pingTimeoutMs: opts.pingTimeoutMs,
      unresponsiveLimit: opts.unresponsiveLimit,
      restartBackoff: opts.restartBackoff,
      readyTimeoutMs: opts.readyTimeoutMs,
      readinessPollMs: opts.readinessPollMs,
      stopGraceMs: opts.stopGraceMs,
    });
    if (!parsed.success) {
      const issue = parsed.issues[0];
      throw new StorageError(
        "invalid",
        `nvmf_tgt supervisor options: ${v.getDotPath(issue) ?? "<root>"}: ${issue.message}`,
      );
    }
    const o = parsed.output;
    this.#launch = opts.launch ?? true;
    if (this.#launch && o.command.length === 0) {
      throw new StorageError(
        "invalid",
        "nvmf_tgt supervisor options: command must name the nvmf_tgt executable",
      );
    }
    for (const arg of o.extraArgs) {
      const r = reservedArg(arg);
      if (r !== undefined) {
        throw new StorageError(
          "invalid",
          `nvmf_tgt supervisor options: extraArgs must not contain ${r} ("${arg}"): the supervisor sets the core mask, RPC socket and --wait-for-rpc itself and verifies them`,
        );
      }
    }
    this.#socketPath = o.socketPath;
    this.#argv = [...o.command, "-m", this.#mask.hex, "-r", o.socketPath, "--wait-for-rpc", ...o.extraArgs];
    this.#startup = o.startupOptions;
    this.#livenessPeriodMs = o.livenessPeriodMs;
    this.#pingTimeoutMs = o.pingTimeoutMs;
    this.#unresponsiveLimit = o.unresponsiveLimit;
    this.#backoff = o.restartBackoff;
    this.#readyTimeoutMs = o.readyTimeoutMs;
    this.#readinessPollMs = o.readinessPollMs;
    this.#stopGraceMs = o.stopGraceMs;
    this.#openClient = opts.openClient;
    this.#runner = opts.runner;
    this.#inspector = opts.inspector;
    this.#sockets = opts.sockets;
    this.#clock = opts.clock;
    this.#onRestart = opts.onRestart;
    this.#log = opts.logger.with({
      component: "nvmf-tgt-supervisor",
      socket: o.socketPath,
      coreMask: this.#mask.hex,
    });
    this.#metrics = opts.metrics ? nvmfTgtMetrics(opts.metrics) : undefined;
  }

  /** Current state; see SupervisorState. */
  get state(): SupervisorState {
    return this.#state;
  }

  /** Pid of the target being served (started, or adopted and reporting its pid), else undefined. */
  get pid(): number | undefined {
    return this.#state === "started" || this.#state === "adopted" ? this.#target?.pid : undefined;
  }

  /** The argv a start runs (before any setpriv wrapper). */
  get argv(): readonly string[] {
    return this.#argv;
  }

  /**
   * Resolves once an initialised target with the configured mask answers on the socket,
   * adopting or starting one as described on the class. Idempotent: with a target up it costs
   * one ping. Rejects with StorageError: "precondition" (another target with a different mask
   * serves the socket, or the socket is answered by a process other than the one spawned),
   * "unavailable" (the target up does not answer this ping, something listens but does not
   * answer, the process could not start or exited, or the supervisor is stopped), "timeout"
   * (not ready within readyTimeoutMs), or the kind of the startup RPC that failed. After any
   * rejection no process started by this call remains. Every call makes its own attempt (callers
   * retrying in a loop bring their own backoff); concurrent calls share one attempt.
   */
  async ensureRunning(): Promise<void> {
    this.#assertNotStopped();
    if (this.#bringUp) return this.#bringUp;
    const target = this.#target;
    if (target?.phase === "ready") {
      await this.#pingTarget(target);
      return;
    }
    return this.#startBringUp();
  }

  /**
   * Starts the background loop (idempotent): the first tick runs at once and brings the target
   * up if it is down. Failures are logged and retried with backoff, never thrown.
   */
  start(): void {
    this.#assertNotStopped();
    if (this.#loop) return;
    this.#loop = true;
    this.#schedule(0);
  }

  /**
   * Stops the loop and any bring-up in flight (a process that bring-up spawned is terminated),
   * waits for a running onRestart hook, and closes the supervisor's connections. With
   * killManaged (default true) a process this supervisor started is terminated (SIGTERM, then
   * SIGKILL after stopGraceMs) and reaped; with false it is left running (under
   * PR_SET_PDEATHSIG it still dies with this process). An adopted process is never signalled.
   * Idempotent; later ensureRunning() calls reject with "unavailable".
   */
  stop(opts: { killManaged?: boolean } = {}): Promise<void> {
    this.#stopped ??= this.#doStop(opts.killManaged ?? true);
    return this.#stopped;
  }

  async #doStop(killManaged: boolean): Promise<void> {
    this.#abort.abort(new StorageError("unavailable", "nvmf_tgt supervisor stopped"));
    this.#loop = false;
    this.#cancelTick();
    await this.#bringUp?.catch(() => {});
    await this.#ping?.catch(() => {});
    await this.#exitCleanup;
    const target = this.#target;
    this.#target = undefined;
    if (target) {
      if (target.kind === "managed" && killManaged) {
        await this.#discard(target, "supervisor stopped").catch((err) =>
          this.#log.error("nvmf_tgt did not stop", { err, pid: target.pid }),
        );
      } else {
        target.phase = "ending";
        await target.rpc?.close();
        if (target.kind === "managed") this.#log.info("leaving nvmf_tgt running", { pid: target.pid });
      }
    }
    this.#setState("down");
    await this.#hooks;
  }

  #assertNotStopped(): void {
    if (this.#stopped) throw new StorageError("unavailable", "nvmf_tgt supervisor stopped");
  }

  #setState(s: SupervisorState): void {
    this.#state = s;
    this.#metrics?.up.set({}, s === "started" || s === "adopted" ? 1 : 0);
  }

  /** n-th consecutive attempt's delay; 0 when nothing or only the latest attempt has failed. */
  #backoffDelay(): number {
    if (this.#failures <= 1) return 0;
    // Waiting for someone else's target costs one connect attempt: look often.
    if (!this.#launch) return Math.min(this.#backoff.initialMs, 1000);
    const { initialMs, maxMs } = this.#backoff;
    return Math.min(maxMs, initialMs * 2 ** Math.min(this.#failures - 2, 40));
  }

  // --- bring-up ---------------------------------------------------------------------------------

  #startBringUp(): Promise<void> {
    const p = this.#doBringUp().finally(() => {
      if (this.#bringUp === p) this.#bringUp = undefined;
    });
    this.#bringUp = p;
    return p;
  }

  async #doBringUp(): Promise<void> {
    this.#setState("starting");
    let outcome: "started" | "adopted" | "failed" = "failed";
    let fresh = false;
    try {
      await this.#exitCleanup;
      const probe = await this.#probe();
      if (probe === "silent") {
        throw new StorageError(
          "unavailable",
          `something listens on ${this.#socketPath} but does not answer spdk_get_version within ${this.#pingTimeoutMs} ms (a target initialising or hung); not starting a second nvmf_tgt`,
          { details: { socketPath: this.#socketPath } },
        );
      }
      if (probe === "absent") {
        if (!this.#launch) {
          throw new StorageError(
            "unavailable",
            `no nvmf_tgt answers on ${this.#socketPath}, and this agent starts none (the target runs in a container of its own): waiting for it`,
            { details: { socketPath: this.#socketPath } },
          );
        }
        await this.#start();
        outcome = "started";
        fresh = true;
      } else {
        fresh = await this.#adopt(probe);
        outcome = "adopted";
        if (this.#lostAdopted) {
          // Whatever answers now may be a new process someone else started and initialised: its
          // subsystems cannot be assumed, so every export is verified again.
          this.#log.info("nvmf_tgt found again after it was lost; re-verifying every export");
          fresh = true;
          this.#lostAdopted = false;
        }
      }
    } catch (err) {
      this.#failures++;
      this.#setState("down");
      throw err;
    } finally {
      this.#metrics?.starts.inc({ outcome });
    }
    if (fresh) this.#notifyRestart();
  }

  /** Is anything serving the socket? "silent": a connection but no reply in time. */
  async #probe(): Promise<"absent" | "silent" | { rpc: SupervisorRpc; methods: SpdkMethods }> {
    const rpc = this.#openClient();
    const methods = new SpdkMethods(rpc);
    try {
      await methods.spdkGetVersion({ timeoutMs: this.#pingTimeoutMs, signal: this.#abort.signal });
      return { rpc, methods };
    } catch (err) {
      // An error reply is still an answer (e.g. a target whose --rpcs-allowed omits the method).
      if (err instanceof SpdkError) return { rpc, methods };
      await rpc.close();
      this.#throwIfStopped();
      const kind = err instanceof StorageError ? err.kind : "internal";
      if (kind === "timeout") return "silent";
      if (kind === "unavailable") return "absent";
      // A reply that is not SPDK's (or a bug): something is there, so do not start a rival.
      throw new StorageError(kind, `probing ${this.#socketPath}: ${(err as Error).message}`, { cause: err });
    }
  }

  /** Adopts the answering target; true when it had to be initialised (a new target). */
  async #adopt(conn: { rpc: SupervisorRpc; methods: SpdkMethods }): Promise<boolean> {
    const { rpc, methods } = conn;
    const deadline = this.#clock.now() + this.#readyTimeoutMs;
    let initialised = false;
    try {
      let reactors: Awaited<ReturnType<SpdkMethods["frameworkGetReactors"]>>;
      try {
        reactors = await methods.frameworkGetReactors(this.#callOpts(deadline));
      } catch (err) {
        if (!isPhaseError(err)) throw err;
        // Still in --wait-for-rpc: its reactors are unknown until init, which nobody else is
        // going to finish for it.
        this.#log.info("nvmf_tgt on the socket waits for framework_start_init; initialising it");
        await this.#initialise(methods, deadline);
        initialised = true;
        reactors = await methods.frameworkGetReactors(this.#callOpts(deadline));
      }
      const running = coreMaskOfReactors(reactors);
      if (!sameCores(running, this.#mask)) {
        throw new StorageError(
          "precondition",
          `nvmf_tgt already serving ${this.#socketPath}${reactors.pid === undefined ? "" : ` (pid ${reactors.pid})`} runs reactors on core mask ${running.hex}, but the configured core mask is ${this.#mask.hex}; it was not started by this supervisor, so it is neither adopted nor stopped: stop it or configure ${running.hex}`,
          {
            details: {
              socketPath: this.#socketPath,
              runningMask: running.hex,
              configuredMask: this.#mask.hex,
              pid: reactors.pid,
            },
          },
        );
      }
      this.#target = {
        kind: "adopted",
        child: undefined,
        pid: reactors.pid,
        rpc,
        methods,
        phase: "ready",
        readyAt: this.#clock.now(),
        misses: 0,
        tail: [],
      };
      if (!this.#launch) this.#target.generation = rpc.connectionGeneration;
      this.#setState("adopted");
      this.#log.info("adopted running nvmf_tgt", { pid: reactors.pid, initialised });
      if (!initialised && (this.#startup.iobuf || this.#startup.maxSubsystems)) {
        this.#log.info("startup options not applied: the adopted target was already initialised");
      }
      return initialised;
    } catch (err) {
      await rpc.close();
      this.#throwIfStopped();
      throw err;
    }
  }

  /** Startup-only options, framework_start_init, framework_wait_init. */
  async #initialise(methods: SpdkMethods, deadline: number, step?: (s: string) => void): Promise<void> {
    if (this.#startup.iobuf) {
      step?.("iobuf_set_options");
      await methods.iobufSetOptions(this.#startup.iobuf, this.#callOpts(deadline));
    }
    if (this.#startup.maxSubsystems) {
      step?.("nvmf_set_max_subsystems");
      await methods.nvmfSetMaxSubsystems(this.#startup.maxSubsystems, this.#callOpts(deadline));
    }
    step?.("framework_start_init");
    try {
      await methods.frameworkStartInit(this.#callOpts(deadline));
    } catch (err) {
      // Somebody initialised it meanwhile: framework_wait_init below confirms.
      if (!isPhaseError(err)) throw err;
    }
    step?.("framework_wait_init");
    await methods.frameworkWaitInit(this.#callOpts(deadline));
  }

  async #start(): Promise<void> {
    const started = this.#clock.now();
    const deadline = started + this.#readyTimeoutMs;
    const tail: string[] = [];
    const out = this.#log.with({ source: "nvmf_tgt" });
    let child: ChildProcess;
    try {
      child = this.#runner.spawn(this.#argv, {
        dieWithParent: true,
        onOutput: (stream, line) => {
          tail.push(line);
          if (tail.length > TAIL_LINES) tail.shift();
          out.info("nvmf_tgt output", { stream, line });
        },
      });
    } catch (err) {
      throw new StorageError(
        "unavailable",
        `cannot start nvmf_tgt (${this.#argv.join(" ")}): ${(err as Error).message}`,
        {
          cause: err,
          details: { argv: this.#argv },
        },
      );
    }
    this.#log.info("spawned nvmf_tgt", {
      pid: child.pid,
      argv: child.argv,
      diesWithAgent: this.#runner.dieWithParent,
    });
    const target: Target = {
      kind: "managed",
      child,
      pid: child.pid,
      rpc: undefined,
      methods: undefined,
      phase: "starting",
      readyAt: 0,
      misses: 0,
      tail,
    };
    void child.exited.then((exit) => this.#onExit(target, exit));
    let step = "waiting for the RPC socket to answer";
    try {
      const conn = await this.#waitForAnswer(child, deadline);
      target.rpc = conn.rpc;
      target.methods = conn.methods;
      await this.#untilExit(
        child,
        this.#initialise(conn.methods, deadline, (s) => (step = s)),
      );
      step = "framework_get_reactors";
      const reactors = await this.#untilExit(
        child,
        conn.methods.frameworkGetReactors(this.#callOpts(deadline)),
      );
      if (reactors.pid !== undefined) {
        step = "checking which process answers";
        await this.#checkAnsweredBy(child.pid, reactors.pid);
      }
      const running = coreMaskOfReactors(reactors);
      if (!sameCores(running, this.#mask)) {
        throw new StorageError(
          "precondition",
          `it was started with -m ${this.#mask.hex} but reports reactors on ${running.hex}`,
          { details: { runningMask: running.hex, configuredMask: this.#mask.hex } },
        );
      }
      if (child.exit) throw this.#exitedError(child.exit);
    } catch (err) {
      await this.#discard(target, `startup failed at ${step}`).catch((e) =>
        this.#log.error("could not clean up after a failed nvmf_tgt start", { err: e, pid: child.pid }),
      );
      this.#throwIfStopped();
      const cause = err instanceof StorageError ? err : undefined;
      const output = tail.length > 0 ? `; last output: ${tail.slice(-5).join(" | ")}` : "";
      throw new StorageError(
        cause?.kind ?? "internal",
        `nvmf_tgt (pid ${child.pid}) failed at ${step}: ${(err as Error).message ?? String(err)}${output}; the process was stopped and reaped`,
        { cause: err, details: { pid: child.pid, step, argv: this.#argv, exit: child.exit } },
      );
    }
    target.phase = "ready";
    target.readyAt = this.#clock.now();
    this.#target = target;
    this.#setState("started");
    this.#metrics?.startupSeconds.observe({}, (target.readyAt - started) / 1000);
    this.#log.info("nvmf_tgt ready", { pid: child.pid, startupMs: target.readyAt - started });
  }

  /** Polls spdk_get_version on fresh connections until one answers, the child exits, or time is up. */
  async #waitForAnswer(
    child: ChildProcess,
    deadline: number,
  ): Promise<{ rpc: SupervisorRpc; methods: SpdkMethods }> {
    let last = "";
    for (;;) {
      if (child.exit) throw this.#exitedError(child.exit);
      const remaining = deadline - this.#clock.now();
      if (remaining <= 0) {
        throw new StorageError(
          "timeout",
          `no answer on ${this.#socketPath} within ${this.#readyTimeoutMs} ms${last ? ` (last probe: ${last})` : ""}`,
        );
      }
      const rpc = this.#openClient();
      const methods = new SpdkMethods(rpc);
      try {
        await this.#untilExit(
          child,
          methods.spdkGetVersion({
            timeoutMs: Math.min(this.#pingTimeoutMs, remaining),
            signal: this.#abort.signal,
          }),
        );
        return { rpc, methods };
      } catch (err) {
        if (err instanceof SpdkError) return { rpc, methods };
        last = (err as Error).message;
        await rpc.close();
        this.#throwIfStopped();
        if (child.exit) throw this.#exitedError(child.exit);
      }
      await this.#untilExit(
        child,
        this.#sleep(Math.min(this.#readinessPollMs, deadline - this.#clock.now())),
      );
    }
  }

  /** The socket must be served by the process spawned (or a process it forked), not a stranger. */
  async #checkAnsweredBy(childPid: number, reportedPid: number): Promise<void> {
    let pid: number | undefined = reportedPid;
    for (let depth = 0; pid !== undefined && pid > 1 && depth < 8; depth++) {
      if (pid === childPid) return;
      pid = await this.#inspector.parentPid(pid);
    }
    throw new StorageError(
      "precondition",
      `the socket is served by pid ${reportedPid}, not by the process started (pid ${childPid}) or one it forked`,
      { details: { reportedPid, childPid } },
    );
  }

  /** Rejects as soon as `child` exits, whatever `p` does. */
  #untilExit<T>(child: ChildProcess, p: Promise<T>): Promise<T> {
    return Promise.race([p, child.exited.then((exit) => Promise.reject(this.#exitedError(exit)))]);
  }

  #exitedError(exit: ProcessExit): StorageError {
    return new StorageError("unavailable", `the process ${describeExit(exit)}`, { details: { exit } });
  }

  #callOpts(deadline: number): { timeoutMs: number; signal: AbortSignal } {
    return { timeoutMs: Math.max(1, deadline - this.#clock.now()), signal: this.#abort.signal };
  }

  #throwIfStopped(): void {
    if (this.#abort.signal.aborted) throw new StorageError("unavailable", "nvmf_tgt supervisor stopped");
  }

  /** Sleeps on the clock; rejects when the supervisor stops. */
  #sleep(ms: number): Promise<void> {
    return this.#clock.sleep(ms, this.#abort.signal);
  }

  // --- ending a target ------------------------------------------------------------------------

  /**
   * Forgets `target`; for a process this supervisor spawned, also terminates and reaps it and
   * removes the socket file it left behind. Rejects only when the process survives SIGKILL.
   */
  async #discard(target: Target, why: string): Promise<void> {
    target.phase = "ending";
    if (this.#target === target) this.#target = undefined;
    await target.rpc?.close();
    const child = target.child;
    if (!child) return;
    const exit = await this.#terminate(child, why);
    this.#log.info("nvmf_tgt stopped", { pid: child.pid, why, exit: describeExit(exit) });
    await this.#removeStaleSocket();
  }

  async #terminate(child: ChildProcess, why: string): Promise<ProcessExit> {
    if (child.exit) return child.exit;
    this.#log.info("terminating nvmf_tgt", { pid: child.pid, why });
    child.kill("SIGTERM");
    const graceful = await this.#waitExit(child, this.#stopGraceMs);
    if (graceful) return graceful;
    this.#log.warn("nvmf_tgt ignored SIGTERM; sending SIGKILL", {
      pid: child.pid,
      graceMs: this.#stopGraceMs,
    });
    child.kill("SIGKILL");
    const killed = await this.#waitExit(child, KILL_WAIT_MS);
    if (killed) return killed;
    throw new StorageError(
      "internal",
      `nvmf_tgt pid ${child.pid} is still there ${KILL_WAIT_MS} ms after SIGKILL (uninterruptible sleep?)`,
      { details: { pid: child.pid } },
    );
  }

  /** The exit within `ms`, or undefined. Deliberately not cut short by stop(): stop needs it. */
  async #waitExit(child: ChildProcess, ms: number): Promise<ProcessExit | undefined> {
    if (child.exit) return child.exit;
    const timer = new AbortController();
    try {
      return await Promise.race([child.exited, this.#clock.sleep(ms, timer.signal).then(() => undefined)]);
    } finally {
      timer.abort();
    }
  }

  async #removeStaleSocket(): Promise<void> {
    const outcome = await this.#sockets.removeIfStale(this.#socketPath);
    if (outcome === "removed") this.#log.info("removed stale RPC socket", { socketPath: this.#socketPath });
  }

  /** A started process ended: expected while ending, a failure while serving. */
  #onExit(target: Target, exit: ProcessExit): void {
    if (target.phase !== "ready" || this.#target !== target) return;
    this.#log.error("nvmf_tgt exited", {
      pid: target.pid,
      exit: describeExit(exit),
      lastOutput: target.tail.slice(-5),
    });
    this.#metrics?.losses.inc({ reason: "exited" });
    this.#failures++;
    target.phase = "ending";
    this.#target = undefined;
    this.#setState("down");
    this.#exitCleanup = (async () => {
      await target.rpc?.close();
      await this.#removeStaleSocket();
    })().catch((err) => this.#log.warn("cleanup after nvmf_tgt exit failed", { err }));
    this.#rescheduleSoon();
  }

  // --- liveness ---------------------------------------------------------------------------------

  /** One ping of the target; concurrent callers share it. Counts a miss on failure and rejects. */
  #pingTarget(target: Target): Promise<void> {
    if (this.#ping) return this.#ping;
    const p = this.#doPing(target).finally(() => {
      if (this.#ping === p) this.#ping = undefined;
    });
    this.#ping = p;
    return p;
  }

  async #doPing(target: Target): Promise<void> {
    const methods = target.methods as SpdkMethods;
    try {
      await methods.spdkGetVersion({ timeoutMs: this.#pingTimeoutMs, signal: this.#abort.signal });
      const now = target.rpc?.connectionGeneration;
      if (target.generation !== undefined && now !== undefined && now !== target.generation) {
        // The client reconnected under the ping: the process that answered may not be the one
        // adopted (a target container restarted, empty), so it is adopted afresh.
        this.#log.warn("adopted nvmf_tgt answered over a new connection; adopting it again", {
          pid: target.pid,
        });
        this.#metrics?.losses.inc({ reason: "reconnected" });
        this.#lostAdopted = true;
        await this.#discard(target, "reconnected");
        this.#setState("down");
        this.#rescheduleSoon();
        throw new StorageError(
          "unavailable",
          `nvmf_tgt on ${this.#socketPath} was reached over a new connection`,
        );
      }
      target.misses = 0;
      if (this.#failures > 0 && this.#clock.now() - target.readyAt >= this.#backoff.maxMs) this.#failures = 0;
      return;
    } catch (err) {
      this.#throwIfStopped();
      if (this.#target !== target || target.phase !== "ready") {
        throw new StorageError("unavailable", `nvmf_tgt on ${this.#socketPath} is gone`, { cause: err });
      }
      target.misses++;
      this.#metrics?.pingFailures.inc();
      this.#log.warn("nvmf_tgt did not answer a ping", {
        pid: target.pid,
        misses: target.misses,
        limit: this.#unresponsiveLimit,
        err,
      });
      if (target.misses >= this.#unresponsiveLimit) await this.#giveUpOn(target);
      throw new StorageError(
        "unavailable",
        `nvmf_tgt on ${this.#socketPath} did not answer (${target.misses} missed pings in a row): ${(err as Error).message}`,
        { cause: err, details: { pid: target.pid, misses: target.misses } },
      );
    }
  }

  /** The target missed unresponsiveLimit pings in a row. */
  async #giveUpOn(target: Target): Promise<void> {
    this.#metrics?.losses.inc({ reason: "unresponsive" });
    this.#failures++;
    if (target.kind === "managed") {
      this.#log.error("nvmf_tgt is unresponsive; restarting it", { pid: target.pid, misses: target.misses });
      this.#setState("down");
      await this.#discard(target, "unresponsive").catch((err) =>
        this.#log.error("could not stop unresponsive nvmf_tgt", { err, pid: target.pid }),
      );
    } else {
      const alive = target.pid === undefined ? "unknown" : await this.#inspector.state(target.pid);
      this.#log.error("adopted nvmf_tgt is unresponsive; it is not ours to restart", {
        pid: target.pid,
        process: alive,
        misses: target.misses,
      });
      this.#lostAdopted = true;
      await this.#discard(target, "unresponsive");
      this.#setState("down");
    }
    this.#rescheduleSoon();
  }

  #schedule(ms: number): void {
    this.#cancelTick();
    this.#cancelTick = this.#clock.setTimeout(() => void this.#tick(), ms);
  }

  /** After a loss: the next tick comes after the backoff delay rather than a full period. */
  #rescheduleSoon(): void {
    if (this.#loop && !this.#ticking) this.#schedule(this.#backoffDelay());
  }

  async #tick(): Promise<void> {
    this.#cancelTick = () => {};
    if (!this.#loop) return;
    this.#ticking = true;
    const target = this.#target;
    try {
      if (target?.phase === "ready") await this.#pingTarget(target);
      else await (this.#bringUp ?? this.#startBringUp());
    } catch (err) {
      // A missed ping has been logged where it was counted.
      if (!this.#abort.signal.aborted && target?.phase !== "ready") {
        this.#log.warn("nvmf_tgt not up", { err, retryInMs: this.#backoffDelay() });
      }
    } finally {
      this.#ticking = false;
      if (this.#loop)
        this.#schedule(this.#target?.phase === "ready" ? this.#livenessPeriodMs : this.#backoffDelay());
    }
  }

  // --- hooks --------------------------------------------------------------------------------------

  #notifyRestart(): void {
    const hook = this.#onRestart;
    if (!hook) return;
    this.#hooks = this.#hooks.then(async () => {
      if (this.#abort.signal.aborted) return;
      try {
        await hook();
      } catch (err) {
        this.#log.error("onRestart hook failed; the periodic reconcile will repair exports", { err });
      }
    });
  }
}
