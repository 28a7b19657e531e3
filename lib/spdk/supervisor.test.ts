// NvmfTgtSupervisor against fake ports on a ManualClock: a scripted target world (which process
// answers the socket, in which framework phase, with which reactors), a fake runner whose
// children exit on signals, and recording inspector and socket ports.

import { describe, expect, test } from "bun:test";
import { ManualClock, settle } from "../clock.ts";
import { StorageError } from "../errors.ts";
import { silentLogger } from "../log.ts";
import { Registry } from "../metrics.ts";
import type { CallOptions } from "./client.ts";
import { SpdkError } from "./errors.ts";
import type {
  ChildProcess,
  ProcessExit,
  ProcessInspector,
  ProcessRunner,
  ProcessState,
  SocketFiles,
  SpawnOptions,
} from "./process-runner.ts";
import { NvmfTgtSupervisor, type NvmfTgtSupervisorOptions, type SupervisorRpc } from "./supervisor.ts";

const SOCK = "/run/distort/spdk.sock";
const PHASE_ERR = "Method may only be called after framework is initialized using framework_start_init RPC.";
const START_ERR =
  "Method may only be called before framework is initialized. Use --wait-for-rpc command line parameter and then issue this RPC.";

/** A process serving the socket, as the fake RPC world sees it. */
interface FakeTarget {
  pid: number;
  cores: number[];
  phase: "startup" | "runtime";
  /** Accepts connections but never answers. */
  hung: boolean;
  alive: boolean;
}

interface Call {
  method: string;
  params: object | undefined;
  conn: number;
}

function coresOf(hex: string): number[] {
  const out: number[] = [];
  let bits = BigInt(hex);
  for (let c = 0; bits > 0n; c++, bits >>= 1n) if (bits & 1n) out.push(c);
  return out;
}

class FakeChild implements ChildProcess {
  readonly signals: string[] = [];
  exit: ProcessExit | undefined;
  readonly exited: Promise<ProcessExit>;
  #resolve!: (e: ProcessExit) => void;
  ignoreTerm = false;
  target: FakeTarget | undefined;

  constructor(
    readonly world: World,
    readonly pid: number,
    readonly argv: readonly string[],
    readonly opts: SpawnOptions,
  ) {
    this.exited = new Promise((r) => {
      this.#resolve = r;
    });
  }

  kill(signal: "SIGTERM" | "SIGKILL"): void {
    if (this.exit) return;
    this.signals.push(signal);
    if (signal === "SIGTERM" && this.ignoreTerm) return;
    this.end({ code: null, signal });
  }

  /** Dies on its own (kill -9 from outside, a crash). */
  crash(): void {
    this.end({ code: null, signal: "SIGKILL" });
  }

  end(exit: ProcessExit): void {
    if (this.exit) return;
    this.exit = exit;
    if (this.target) this.target.alive = false;
    if (this.world.serving === this.target) this.world.serving = undefined;
    this.#resolve(exit);
  }
}

/** How a spawned child behaves. */
interface ChildScript {
  /** Ms until it answers on the socket; undefined: never. */
  bootMs?: number;
  /** Reactors it reports; default the -m it was given. */
  cores?: number[];
  /** Pid it reports in framework_get_reactors; default its own. */
  reportPid?: number;
  /** Exits with this code right after spawning. */
  exitAtOnce?: number;
  ignoreTerm?: boolean;
}

class World {
  readonly clock = new ManualClock(1_000_000);
  readonly calls: Call[] = [];
  readonly children: FakeChild[] = [];
  readonly spawnTimes: number[] = [];
  readonly socketCleanups: string[] = [];
  serving: FakeTarget | undefined;
  /** Method -> error to answer with (once per entry). */
  readonly failures = new Map<string, Error[]>();
  script: ChildScript = { bootMs: 30 };
  spawnError: Error | undefined;
  nextPid = 1000;
  conns = 0;
  /** Clients reconnect, as SpdkClient does, to whatever serves the socket after their target died. */
  reconnecting = false;
  opened = 0;
  closed = 0;
  readonly parents = new Map<number, number>();
  readonly states = new Map<number, ProcessState>();

  /** A foreign target already serving the socket. */
  foreign(cores: number[], phase: "startup" | "runtime" = "runtime", pid = 4242): FakeTarget {
    this.serving = { pid, cores, phase, hung: false, alive: true };
    this.states.set(pid, "alive");
    return this.serving;
  }

  failOnce(method: string, err: Error): void {
    this.failures.set(method, [...(this.failures.get(method) ?? []), err]);
  }

  methods(): string[] {
    return this.calls.map((c) => c.method);
  }

  /** Methods called, consecutive duplicates of spdk_get_version folded into one. */
  folded(): string[] {
    return this.methods().filter((m, i, all) => !(m === "spdk_get_version" && all[i - 1] === m));
  }

  readonly runner: ProcessRunner = {
    dieWithParent: true,
    spawn: (argv, opts = {}) => {
      this.spawnTimes.push(this.clock.now());
      if (this.spawnError) throw this.spawnError;
      const child = new FakeChild(this, this.nextPid++, argv, opts);
      this.children.push(child);
      const s = this.script;
      child.ignoreTerm = s.ignoreTerm ?? false;
      if (s.exitAtOnce !== undefined) {
        const code = s.exitAtOnce;
        queueMicrotask(() => child.end({ code, signal: null }));
        return child;
      }
      const m = argv.indexOf("-m");
      const target: FakeTarget = {
        pid: s.reportPid ?? child.pid,
        cores: s.cores ?? coresOf(argv[m + 1] as string),
        phase: argv.includes("--wait-for-rpc") ? "startup" : "runtime",
        hung: false,
        alive: true,
      };
      child.target = target;
      if (s.bootMs !== undefined) {
        this.clock.setTimeout(() => {
          if (!child.exit) this.serving = target;
        }, s.bootMs);
      }
      return child;
    },
  };

  readonly inspector: ProcessInspector = {
    state: async (pid) => this.states.get(pid) ?? "gone",
    parentPid: async (pid) => this.parents.get(pid),
  };

  readonly sockets: SocketFiles = {
    removeIfStale: async (path) => {
      this.socketCleanups.push(path);
      return "removed";
    },
  };

  openClient = (): SupervisorRpc => {
    const this_ = this;
    this.opened++;
    const conn = ++this.conns;
    let bound: FakeTarget | undefined;
    let generation: number | undefined;
    let closed = false;
    const pending = new Set<(err: Error) => void>();
    return {
      get connectionGeneration() {
        return this_.reconnecting ? generation : undefined;
      },
      serialize: (_key, fn) => fn(),
      close: async () => {
        if (closed) return;
        closed = true;
        this.closed++;
        for (const fail of pending) fail(new StorageError("unavailable", "client closed"));
      },
      call: (method: string, params?: object, opts: CallOptions = {}) => {
        this.calls.push({ method, params, conn });
        if (closed) return Promise.reject(new StorageError("unavailable", "client closed"));
        if (bound && !bound.alive && this.reconnecting && this.serving) bound = undefined;
        if (!bound) {
          if (!this.serving) {
            return Promise.reject(
              new StorageError("unavailable", `${method}: cannot reach SPDK`, {
                details: { reason: "connect-failed" },
              }),
            );
          }
          bound = this.serving;
          generation = (generation ?? 0) + 1;
        }
        const target = bound;
        if (!target.alive) {
          return Promise.reject(
            new StorageError("unavailable", `${method}: connection lost`, {
              details: { reason: "closed-by-server" },
            }),
          );
        }
        return new Promise((resolve, reject) => {
          let cancel = () => {};
          const fail = (err: Error) => {
            cancel();
            pending.delete(fail);
            opts.signal?.removeEventListener("abort", onAbort);
            reject(err);
          };
          const onAbort = () => fail(new StorageError("timeout", `${method} cancelled`));
          opts.signal?.addEventListener("abort", onAbort, { once: true });
          pending.add(fail);
          cancel = this.clock.setTimeout(
            () => fail(new StorageError("timeout", `${method}: no reply within ${opts.timeoutMs} ms`)),
            opts.timeoutMs ?? 30_000,
          );
          if (target.hung) return;
          queueMicrotask(() => {
            if (!pending.has(fail)) return;
            try {
              const result = this.#answer(target, method);
              cancel();
              pending.delete(fail);
              resolve(result);
            } catch (err) {
              fail(err as Error);
            }
          });
        });
      },
    };
  };

  #answer(t: FakeTarget, method: string): unknown {
    const injected = this.failures.get(method)?.shift();
    if (injected) throw injected;
    switch (method) {
      case "spdk_get_version":
        return { version: "SPDK v25.05.1", fields: { major: 25, minor: 5, patch: 1, suffix: "" } };
      case "framework_get_reactors":
        if (t.phase !== "runtime") throw new SpdkError(method, -1, PHASE_ERR);
        return { tick_rate: 2_450_000_000, pid: t.pid, reactors: t.cores.map((lcore) => ({ lcore })) };
      case "iobuf_set_options":
      case "nvmf_set_max_subsystems":
        if (t.phase !== "startup") throw new SpdkError(method, -1, START_ERR);
        return true;
      case "framework_start_init":
        if (t.phase !== "startup") throw new SpdkError(method, -1, START_ERR);
        t.phase = "runtime";
        return true;
      case "framework_wait_init":
        if (t.phase !== "runtime") throw new Error("fake: framework_wait_init would block forever");
        return true;
      default:
        throw new SpdkError(method, -32601, "Method not found");
    }
  }

  supervisor(over: Partial<NvmfTgtSupervisorOptions> = {}): NvmfTgtSupervisor {
    return new NvmfTgtSupervisor({
      command: ["/opt/spdk/bin/nvmf_tgt"],
      socketPath: SOCK,
      coreMask: "0x3",
      openClient: this.openClient,
      runner: this.runner,
      inspector: this.inspector,
      sockets: this.sockets,
      clock: this.clock,
      logger: silentLogger,
      readyTimeoutMs: 2000,
      readinessPollMs: 20,
      pingTimeoutMs: 200,
      stopGraceMs: 300,
      livenessPeriodMs: 1000,
      restartBackoff: { initialMs: 100, maxMs: 800 },
      ...over,
    });
  }

  /** Advances the clock until `p` settles (at most limitMs of fake time). */
  async drive<T>(p: Promise<T>, stepMs = 10, limitMs = 120_000): Promise<T> {
    let done = false;
    p.then(
      () => (done = true),
      () => (done = true),
    );
    await settle();
    for (let t = 0; !done && t < limitMs; t += stepMs) await this.clock.advanceAsync(stepMs);
    return p;
  }

  /** Advances fake time by `ms` in steps, letting async work run. */
  async run(ms: number, stepMs = 10): Promise<void> {
    for (let t = 0; t < ms; t += stepMs) await this.clock.advanceAsync(stepMs);
  }
}

async function rejection(p: Promise<unknown>): Promise<StorageError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(StorageError);
    return err as StorageError;
  }
  throw new Error("expected a rejection");
}

const START_SEQUENCE = [
  "spdk_get_version", // probe: nothing answers, then readiness polls until the child answers
  "iobuf_set_options",
  "framework_start_init",
  "framework_wait_init",
  "framework_get_reactors",
];

describe("options", () => {
  test("a zero, malformed or unbounded mask is refused before any port is used", () => {
    for (const coreMask of ["0x0", "", "3", "[]", "[1024]"]) {
      const w = new World();
      let err: unknown;
      try {
        w.supervisor({ coreMask });
      } catch (e) {
        err = e;
      }
      expect((err as StorageError).kind).toBe("invalid");
      expect(w.opened + w.spawnTimes.length).toBe(0);
    }
  });

  test("arguments the supervisor owns, bad paths and timings are refused", () => {
    const w = new World();
    const bad: Partial<NvmfTgtSupervisorOptions>[] = [
      { extraArgs: ["-m", "0x1"] },
      { extraArgs: ["--cpumask=0x1"] },
      { extraArgs: ["-m0x1"] },
      { extraArgs: ["-r", "/x.sock"] },
      { extraArgs: ["--rpc-socket=/x.sock"] },
      { extraArgs: ["--wait-for-rpc"] },
      { extraArgs: ["--lcores", "0@1"] },
      { socketPath: "spdk.sock" },
      { command: [] },
      { command: [""] },
      { livenessPeriodMs: 0 },
      { restartBackoff: { initialMs: 500, maxMs: 100 } },
      { startupOptions: { iobuf: { small_pool_count: 0 } } },
    ];
    for (const o of bad) expect(() => w.supervisor(o)).toThrow(StorageError);
    const ok = w.supervisor({ extraArgs: ["--no-huge", "-s", "1024", "--mem-size=512"] });
    expect(ok.argv).toEqual([
      "/opt/spdk/bin/nvmf_tgt",
      "-m",
      "0x3",
      "-r",
      SOCK,
      "--wait-for-rpc",
      "--no-huge",
      "-s",
      "1024",
      "--mem-size=512",
    ]);
    expect(ok.state).toBe("down");
  });

  test("the list form is passed to nvmf_tgt in canonical hex", () => {
    expect(new World().supervisor({ coreMask: "[0,2-3]" }).argv.slice(1, 3)).toEqual(["-m", "0xd"]);
  });
});

describe("adopting a target already on the socket", () => {
  test("same reactors: adopted with one version and one reactors call, nothing spawned, no hook", async () => {
    const w = new World();
    w.foreign([0, 1]);
    let hooks = 0;
    const s = w.supervisor({ onRestart: () => void hooks++ });
    await w.drive(s.ensureRunning());
    expect(s.state).toBe("adopted");
    expect(s.pid).toBe(4242);
    expect(w.methods()).toEqual(["spdk_get_version", "framework_get_reactors"]);
    expect(w.spawnTimes).toEqual([]);
    await w.drive(s.ensureRunning());
    expect(w.methods().slice(2)).toEqual(["spdk_get_version"]);
    await w.drive(s.stop());
    expect(hooks).toBe(0);
    expect(w.serving?.alive).toBe(true);
    expect(w.socketCleanups).toEqual([]);
  });

  test("the list form matches the same lcores in hex", async () => {
    const w = new World();
    w.foreign([0, 2, 3]);
    const s = w.supervisor({ coreMask: "[0,2-3]" });
    await w.drive(s.ensureRunning());
    expect(s.state).toBe("adopted");
  });

  test("a target waiting in --wait-for-rpc is initialised, then checked; that is a new target", async () => {
    const w = new World();
    w.foreign([0, 1], "startup");
    let hooks = 0;
    const s = w.supervisor({
      startupOptions: { iobuf: { small_pool_count: 8192, large_pool_count: 1024 }, maxSubsystems: 4096 },
      onRestart: () => void hooks++,
    });
    await w.drive(s.ensureRunning());
    expect(w.methods()).toEqual([
      "spdk_get_version",
      "framework_get_reactors",
      "iobuf_set_options",
      "nvmf_set_max_subsystems",
      "framework_start_init",
      "framework_wait_init",
      "framework_get_reactors",
    ]);
    expect(w.calls[2]?.params).toEqual({ small_pool_count: 8192, large_pool_count: 1024 });
    expect(w.calls[3]?.params).toEqual({ max_subsystems: 4096 });
    expect(s.state).toBe("adopted");
    await w.drive(s.stop());
    expect(hooks).toBe(1);
  });

  test("different reactors: refused with both masks named, target left alone, nothing spawned", async () => {
    const w = new World();
    const t = w.foreign([0, 1, 2, 3]);
    const s = w.supervisor();
    const err = await rejection(w.drive(s.ensureRunning()));
    expect(err.kind).toBe("precondition");
    expect(err.message).toContain("0xf");
    expect(err.message).toContain("0x3");
    expect(err.message).toContain("pid 4242");
    expect(err.details).toMatchObject({ runningMask: "0xf", configuredMask: "0x3" });
    expect(s.state).toBe("down");
    expect(w.spawnTimes).toEqual([]);
    expect(w.socketCleanups).toEqual([]);
    expect(t.alive).toBe(true);
    expect(w.serving).toBe(t);
    expect(w.closed).toBe(w.opened);
  });

  test("a subset of the configured cores is a mismatch too", async () => {
    const w = new World();
    w.foreign([0]);
    const err = await rejection(w.drive(w.supervisor().ensureRunning()));
    expect(err.kind).toBe("precondition");
  });

  test("a reply that is not SPDK's is an error, not an empty socket: nothing is spawned", async () => {
    const w = new World();
    w.foreign([0, 1]);
    w.failOnce("spdk_get_version", new StorageError("internal", "spdk_get_version: unexpected reply"));
    const err = await rejection(w.drive(w.supervisor().ensureRunning()));
    expect(err.kind).toBe("internal");
    expect(err.message).toContain("probing");
    expect(w.spawnTimes).toEqual([]);
  });

  test("something that accepts but never answers is not adopted and no second target is started", async () => {
    const w = new World();
    w.foreign([0, 1]).hung = true;
    const s = w.supervisor();
    const err = await rejection(w.drive(s.ensureRunning()));
    expect(err.kind).toBe("unavailable");
    expect(err.message).toContain("does not answer");
    expect(w.spawnTimes).toEqual([]);
  });
});

describe("starting a target", () => {
  test("spawns with the mask, socket and --wait-for-rpc, then runs the exact startup sequence", async () => {
    const w = new World();
    let hooks = 0;
    const s = w.supervisor({
      extraArgs: ["--no-huge", "-s", "1024"],
      startupOptions: { iobuf: { small_pool_count: 8192 } },
      onRestart: () => void hooks++,
    });
    const p = s.ensureRunning();
    expect(s.state).toBe("starting");
    await w.drive(p);
    expect(s.state).toBe("started");
    const child = w.children[0] as FakeChild;
    expect(w.children).toHaveLength(1);
    expect(child.argv).toEqual([
      "/opt/spdk/bin/nvmf_tgt",
      "-m",
      "0x3",
      "-r",
      SOCK,
      "--wait-for-rpc",
      "--no-huge",
      "-s",
      "1024",
    ]);
    expect(child.opts.dieWithParent).toBe(true);
    expect(w.folded()).toEqual(START_SEQUENCE);
    // The child boots after 30 ms and is polled every 20 ms: at least one poll found nothing.
    expect(w.methods().filter((m) => m === "spdk_get_version").length).toBeGreaterThanOrEqual(3);
    expect(w.calls.find((c) => c.method === "iobuf_set_options")?.params).toEqual({ small_pool_count: 8192 });
    expect(s.pid).toBe(child.pid);
    await settle();
    expect(hooks).toBe(1);
    expect(child.signals).toEqual([]);
  });

  test("without startup options no iobuf call is made", async () => {
    const w = new World();
    await w.drive(w.supervisor().ensureRunning());
    expect(w.folded()).toEqual(START_SEQUENCE.filter((m) => m !== "iobuf_set_options"));
  });

  test("concurrent ensureRunning calls share one start", async () => {
    const w = new World();
    const s = w.supervisor();
    await w.drive(Promise.all([s.ensureRunning(), s.ensureRunning(), s.ensureRunning()]));
    expect(w.children).toHaveLength(1);
    expect(s.state).toBe("started");
  });

  test("a process that does not start at all leaves nothing to clean and state down", async () => {
    const w = new World();
    w.spawnError = new Error("ENOENT: no such file");
    const s = w.supervisor();
    const err = await rejection(w.drive(s.ensureRunning()));
    expect(err.kind).toBe("unavailable");
    expect(err.message).toContain("ENOENT");
    expect(s.state).toBe("down");
  });

  interface FailureCase {
    name: string;
    setup: (w: World) => void;
    kind: string;
    message: string;
  }
  const failures: FailureCase[] = [
    {
      name: "iobuf_set_options fails",
      setup: (w) =>
        w.failOnce("iobuf_set_options", new SpdkError("iobuf_set_options", -22, "Invalid argument")),
      kind: "invalid",
      message: "failed at iobuf_set_options",
    },
    {
      name: "framework_start_init fails",
      setup: (w) =>
        w.failOnce(
          "framework_start_init",
          new SpdkError("framework_start_init", -32603, "framework_initialization failed"),
        ),
      kind: "internal",
      message: "failed at framework_start_init",
    },
    {
      name: "framework_wait_init times out",
      setup: (w) =>
        w.failOnce("framework_wait_init", new StorageError("timeout", "framework_wait_init: no reply")),
      kind: "timeout",
      message: "failed at framework_wait_init",
    },
    {
      name: "framework_get_reactors fails",
      setup: (w) => w.failOnce("framework_get_reactors", new StorageError("unavailable", "connection lost")),
      kind: "unavailable",
      message: "failed at framework_get_reactors",
    },
    {
      name: "the reactors are not the mask it was given",
      setup: (w) => {
        w.script = { bootMs: 30, cores: [0] };
      },
      kind: "precondition",
      message: "reports reactors on 0x1",
    },
    {
      name: "the socket is answered by a stranger",
      setup: (w) => {
        w.script = { bootMs: 30, reportPid: 777 };
        w.parents.set(777, 1);
      },
      kind: "precondition",
      message: "served by pid 777",
    },
    {
      name: "the socket never answers",
      setup: (w) => {
        w.script = {};
      },
      kind: "timeout",
      message: "no answer on",
    },
    {
      name: "the process ignores SIGTERM after a failure",
      setup: (w) => {
        w.script = { bootMs: 30, ignoreTerm: true };
        w.failOnce(
          "framework_start_init",
          new SpdkError("framework_start_init", -32603, "framework_initialization failed"),
        );
      },
      kind: "internal",
      message: "failed at framework_start_init",
    },
  ];
  for (const f of failures) {
    test(`${f.name}: the started process is terminated and reaped, the socket cleaned, a retry starts fresh`, async () => {
      const w = new World();
      f.setup(w);
      let hooks = 0;
      const s = w.supervisor({
        startupOptions: { iobuf: { small_pool_count: 8192 } },
        onRestart: () => void hooks++,
      });
      const err = await rejection(w.drive(s.ensureRunning()));
      expect(err.kind as string).toBe(f.kind);
      expect(err.message).toContain(f.message);
      expect(err.message).toContain("stopped and reaped");
      const child = w.children[0] as FakeChild;
      expect(child.signals[0]).toBe("SIGTERM");
      if (f.name.includes("ignores SIGTERM")) expect(child.signals).toEqual(["SIGTERM", "SIGKILL"]);
      expect(child.exit).toBeDefined();
      expect(w.socketCleanups).toEqual([SOCK]);
      expect(s.state).toBe("down");
      expect(w.closed).toBe(w.opened);
      // The retry (failures were one-shot; scripts reset) spawns a new process and succeeds.
      w.script = { bootMs: 30 };
      w.parents.clear();
      await w.drive(s.ensureRunning());
      expect(w.children).toHaveLength(2);
      expect(s.state).toBe("started");
      expect(s.pid).toBe(w.children[1]?.pid);
      await settle();
      expect(hooks).toBe(1);
    });
  }

  test("a process that exits at once fails the start without waiting for the deadline", async () => {
    const w = new World();
    w.script = { exitAtOnce: 1 };
    const s = w.supervisor({ readyTimeoutMs: 60_000 });
    const started = w.clock.now();
    const err = await rejection(w.drive(s.ensureRunning()));
    expect(err.kind).toBe("unavailable");
    expect(err.message).toContain("exited with code 1");
    expect(w.clock.now() - started).toBeLessThan(100);
    expect((w.children[0] as FakeChild).signals).toEqual([]);
    expect(w.socketCleanups).toEqual([SOCK]);
  });

  test("a process forked by the command (a wrapper) may serve the socket", async () => {
    const w = new World();
    w.script = { bootMs: 30, reportPid: 5555 };
    w.parents.set(5555, 1000);
    const s = w.supervisor();
    await w.drive(s.ensureRunning());
    expect(s.state).toBe("started");
  });

  test("stop() during a start terminates the process being started", async () => {
    const w = new World();
    w.script = {};
    const s = w.supervisor();
    const failed = rejection(s.ensureRunning());
    await w.run(100);
    await w.drive(s.stop());
    const err = await failed;
    expect(err.message).toContain("stopped");
    expect((w.children[0] as FakeChild).signals).toEqual(["SIGTERM"]);
    expect(s.state).toBe("down");
    await expect(s.ensureRunning()).rejects.toThrow("stopped");
  });
});

describe("liveness and restarts", () => {
  test("a started process that dies after a healthy run is restarted at once and onRestart runs again", async () => {
    const w = new World();
    let hooks = 0;
    const s = w.supervisor({ onRestart: () => void hooks++ });
    s.start();
    await w.run(100);
    expect(s.state).toBe("started");
    expect(hooks).toBe(1);
    const first = w.children[0] as FakeChild;
    first.crash();
    await settle();
    expect(s.state).toBe("down");
    expect(w.socketCleanups).toEqual([SOCK]);
    const diedAt = w.clock.now();
    await w.run(200);
    expect(w.children).toHaveLength(2);
    // No backoff for a first loss: every export waits for the new target.
    expect((w.spawnTimes[1] as number) - diedAt).toBe(0);
    expect(s.state).toBe("started");
    expect(hooks).toBe(2);
    await w.drive(s.stop());
  });

  test("restart delays double up to the cap and reset once a target stays healthy", async () => {
    const w = new World();
    w.spawnError = new Error("EAGAIN");
    const s = w.supervisor();
    s.start();
    await w.run(4000);
    const gaps = w.spawnTimes.slice(1).map((t, i) => t - (w.spawnTimes[i] as number));
    // The first retry is immediate, repeated failures back off from initialMs up to maxMs.
    expect(gaps.slice(0, 6)).toEqual([0, 100, 200, 400, 800, 800]);
    // Recovery: the next attempt succeeds and the target stays up longer than maxMs.
    w.spawnError = undefined;
    await w.run(1000);
    expect(s.state).toBe("started");
    await w.run(2500); // pings every 1000 ms; healthy for >= maxMs resets the count
    const child = w.children.at(-1) as FakeChild;
    child.crash();
    await settle();
    const diedAt = w.clock.now();
    await w.run(300);
    expect((w.spawnTimes.at(-1) as number) - diedAt).toBe(0);
    await w.drive(s.stop());
  });

  test("a crash soon after a restart backs off further: crash-loop protection", async () => {
    const w = new World();
    const s = w.supervisor();
    s.start();
    await w.run(100);
    const delays: number[] = [];
    for (let i = 0; i < 4; i++) {
      const child = w.children.at(-1) as FakeChild;
      child.crash();
      await settle();
      const diedAt = w.clock.now();
      const before = w.children.length;
      while (w.children.length === before) await w.clock.advanceAsync(10);
      delays.push((w.spawnTimes.at(-1) as number) - diedAt);
      await w.run(100);
    }
    expect(delays).toEqual([0, 100, 200, 400]);
    await w.drive(s.stop());
  });

  test("a started process that stops answering is terminated after the miss limit and replaced", async () => {
    const w = new World();
    let hooks = 0;
    const s = w.supervisor({ unresponsiveLimit: 3, onRestart: () => void hooks++ });
    s.start();
    await w.run(100);
    const first = w.children[0] as FakeChild;
    (first.target as FakeTarget).hung = true;
    await w.run(2500); // two periods: two misses
    expect(first.signals).toEqual([]);
    expect(s.state).toBe("started");
    await w.run(1000); // third miss
    await w.run(400);
    expect(first.signals).toEqual(["SIGTERM"]);
    expect(w.children).toHaveLength(2);
    expect(s.state).toBe("started");
    expect(hooks).toBe(2);
    await w.drive(s.stop());
  });

  test("an adopted target that stops answering is dropped, never signalled, and no rival is started", async () => {
    const w = new World();
    const t = w.foreign([0, 1]);
    let hooks = 0;
    const s = w.supervisor({ unresponsiveLimit: 2, onRestart: () => void hooks++ });
    s.start();
    await w.run(50);
    expect(s.state).toBe("adopted");
    t.hung = true;
    await w.run(2500);
    // Dropped: the loop keeps probing (state "starting" while a probe runs), never adopting a
    // silent listener and never spawning beside it.
    expect(s.state).not.toBe("adopted");
    expect(s.pid).toBeUndefined();
    await w.run(3000);
    expect(w.spawnTimes).toEqual([]); // the socket still has a (silent) listener
    // Once it is really gone the supervisor starts its own target.
    t.alive = false;
    w.serving = undefined;
    await w.run(2000);
    expect(w.children).toHaveLength(1);
    expect(s.state).toBe("started");
    expect(hooks).toBe(1);
    await w.drive(s.stop());
  });

  test("ensureRunning on a silent started target counts misses and rejects with unavailable", async () => {
    const w = new World();
    const s = w.supervisor({ unresponsiveLimit: 2 });
    await w.drive(s.ensureRunning());
    const child = w.children[0] as FakeChild;
    (child.target as FakeTarget).hung = true;
    const e1 = await rejection(w.drive(s.ensureRunning()));
    expect(e1.kind).toBe("unavailable");
    expect(child.signals).toEqual([]);
    await rejection(w.drive(s.ensureRunning()));
    expect(child.signals).toEqual(["SIGTERM"]);
    expect(s.state).toBe("down");
    await w.drive(s.ensureRunning());
    expect(w.children).toHaveLength(2);
  });

  test("a failing onRestart hook is logged and does not take the target down", async () => {
    const w = new World();
    const s = w.supervisor({
      onRestart: () => {
        throw new Error("re-export failed");
      },
    });
    await w.drive(s.ensureRunning());
    await settle();
    expect(s.state).toBe("started");
    await w.drive(s.stop());
  });

  test("the hook may call ensureRunning without deadlock", async () => {
    const w = new World();
    let inner: Promise<void> | undefined;
    const s = w.supervisor({
      onRestart: () => {
        inner = s.ensureRunning();
        return inner;
      },
    });
    await w.drive(s.ensureRunning());
    await w.run(50);
    expect(inner).toBeDefined();
    await inner;
    await w.drive(s.stop());
  });
});

describe("adopt only (launch false): the target runs in a container of its own", () => {
  test("an empty command is refused unless launch is false", () => {
    const w = new World();
    expect(() => w.supervisor({ command: [] })).toThrow(/command must name the nvmf_tgt executable/);
    expect(() => w.supervisor({ command: [], launch: false })).not.toThrow();
  });

  test("nothing on the socket: no process is started; the target is adopted and initialised when it comes", async () => {
    const w = new World();
    let hooks = 0;
    const s = w.supervisor({ command: [], launch: false, onRestart: () => void hooks++ });
    const err = await rejection(w.drive(s.ensureRunning()));
    expect(err.kind).toBe("unavailable");
    expect(err.message).toContain("starts none");
    s.start();
    await w.run(5000);
    expect(s.state).toBe("down");
    expect(w.spawnTimes).toEqual([]);
    w.foreign([0, 1], "startup", 777);
    await w.run(1500);
    expect(s.state).toBe("adopted");
    expect(s.pid).toBe(777);
    expect(w.methods()).toContain("framework_start_init");
    expect(hooks).toBe(1);
    expect(w.spawnTimes).toEqual([]);
    await w.drive(s.stop());
  });

  test("a target that dies and comes back (its container restarted) is adopted again as a new target", async () => {
    const w = new World();
    let hooks = 0;
    const first = w.foreign([0, 1], "runtime", 501);
    const s = w.supervisor({
      command: [],
      launch: false,
      unresponsiveLimit: 2,
      onRestart: () => void hooks++,
    });
    s.start();
    await w.run(50);
    expect(s.state).toBe("adopted");
    expect(hooks).toBe(0); // already initialised: nothing lost yet
    first.alive = false;
    w.serving = undefined;
    await w.run(4000);
    expect(s.state).not.toBe("adopted");
    w.foreign([0, 1], "startup", 502);
    await w.run(1500);
    expect([s.state, s.pid, hooks]).toEqual(["adopted", 502, 1]);
    expect(w.spawnTimes).toEqual([]);
    await w.drive(s.stop());
  });

  test("a replacement seen only as a reconnect between two pings is adopted again and counts as new", async () => {
    const w = new World();
    w.reconnecting = true;
    let hooks = 0;
    const first = w.foreign([0, 1], "runtime", 601);
    const s = w.supervisor({ command: [], launch: false, onRestart: () => void hooks++ });
    s.start();
    await w.run(50);
    expect([s.state, s.pid]).toEqual(["adopted", 601]);
    // Between pings the process is replaced by one someone else already initialised: every ping
    // still gets an answer, only over a new connection.
    first.alive = false;
    w.foreign([0, 1], "runtime", 602);
    await w.run(2500);
    expect([s.state, s.pid, hooks]).toEqual(["adopted", 602, 1]);
    expect(w.spawnTimes).toEqual([]);
    await w.drive(s.stop());
  });

  test("an adopted target that keeps its connection stays adopted and runs no hook", async () => {
    const w = new World();
    w.reconnecting = true;
    let hooks = 0;
    w.foreign([0, 1], "runtime", 701);
    const s = w.supervisor({ command: [], launch: false, onRestart: () => void hooks++ });
    s.start();
    await w.run(10_000);
    expect([s.state, s.pid, hooks]).toEqual(["adopted", 701, 0]);
    await w.drive(s.stop());
  });
});

describe("stop", () => {
  test("terminates and reaps a started process and removes its socket", async () => {
    const w = new World();
    const s = w.supervisor();
    await w.drive(s.ensureRunning());
    await w.drive(s.stop());
    const child = w.children[0] as FakeChild;
    expect(child.signals).toEqual(["SIGTERM"]);
    expect(child.exit).toEqual({ code: null, signal: "SIGTERM" });
    expect(w.socketCleanups).toEqual([SOCK]);
    expect(s.state).toBe("down");
    expect(w.closed).toBe(w.opened);
    await w.drive(s.stop()); // idempotent
    expect(child.signals).toEqual(["SIGTERM"]);
  });

  test("SIGKILL follows when SIGTERM is ignored for stopGraceMs", async () => {
    const w = new World();
    w.script = { bootMs: 30, ignoreTerm: true };
    const s = w.supervisor({ stopGraceMs: 300 });
    await w.drive(s.ensureRunning());
    const before = w.clock.now();
    await w.drive(s.stop());
    const child = w.children[0] as FakeChild;
    expect(child.signals).toEqual(["SIGTERM", "SIGKILL"]);
    expect(w.clock.now() - before).toBeGreaterThanOrEqual(300);
  });

  test("killManaged false leaves the process running; an adopted one is never signalled", async () => {
    const w = new World();
    const s = w.supervisor();
    await w.drive(s.ensureRunning());
    await w.drive(s.stop({ killManaged: false }));
    expect((w.children[0] as FakeChild).signals).toEqual([]);
    expect((w.children[0] as FakeChild).exit).toBeUndefined();

    const w2 = new World();
    const t = w2.foreign([0, 1]);
    const s2 = w2.supervisor();
    await w2.drive(s2.ensureRunning());
    await w2.drive(s2.stop());
    expect(t.alive).toBe(true);
    expect(w2.socketCleanups).toEqual([]);
  });

  test("stop() ends the loop: a later crash is not restarted", async () => {
    const w = new World();
    const s = w.supervisor();
    s.start();
    await w.run(100);
    await w.drive(s.stop({ killManaged: false }));
    (w.children[0] as FakeChild).crash();
    await w.run(3000);
    expect(w.children).toHaveLength(1);
    expect(w.clock.pendingTimers).toBe(0);
    expect(() => s.start()).toThrow("stopped");
  });
});

test("metrics count starts, losses and pings and expose up", async () => {
  const w = new World();
  const metrics = new Registry();
  const s = w.supervisor({ metrics, unresponsiveLimit: 1 });
  s.start();
  await w.run(100);
  const up = metrics.gauge({
    name: "distort_nvmf_tgt_up",
    help: "1 while nvmf_tgt is initialised and answering",
    reuse: true,
  });
  expect(up.get()).toBe(1);
  (w.children[0] as FakeChild).crash();
  await w.run(300);
  const starts = metrics.counter<"outcome">({
    name: "distort_nvmf_tgt_starts_total",
    help: "Attempts to bring nvmf_tgt up, by outcome (started, adopted, failed)",
    labelNames: ["outcome"],
    reuse: true,
  });
  expect(starts.get({ outcome: "started" })).toBe(2);
  const losses = metrics.counter<"reason">({
    name: "distort_nvmf_tgt_failures_total",
    help: "nvmf_tgt processes lost while serving, by reason (exited, unresponsive)",
    labelNames: ["reason"],
    reuse: true,
  });
  expect(losses.get({ reason: "exited" })).toBe(1);
  await w.drive(s.stop());
  expect(up.get()).toBe(0);
});
