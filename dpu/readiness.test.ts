// Readiness: not ready while initialising or while SNAP does not answer, unhealthy (throws) only
// when the state directory is unusable; initialisation retries every part with backoff.
import { expect, test } from "bun:test";
import { ManualClock } from "../lib/clock.ts";
import { StorageError } from "../lib/errors.ts";
import { silentLogger } from "../lib/log.ts";
import type { SpdkRpc } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import type { DeviceStore } from "./devices/state-store.ts";
import { Readiness } from "./readiness.ts";

function fakes() {
  const state = { snapUp: false, storeOk: true, registered: 0, registerFails: 1 };
  const rpc: SpdkRpc = {
    async call(method) {
      if (method !== "spdk_get_version") throw new Error(`unexpected ${method}`);
      if (!state.snapUp) throw new StorageError("unavailable", "connect ENOENT");
      return { version: "SPDK v23.01", fields: { major: 23, minor: 1, patch: 0, suffix: "" } };
    },
    serialize: (_k, fn) => fn(),
  };
  const store = {
    check: async () => {
      if (!state.storeOk) throw new StorageError("internal", "state directory /s is not usable");
    },
  } as DeviceStore;
  return { state, methods: new SpdkMethods(rpc), store };
}

test("initialises once SNAP answered and every init step succeeded; probes follow SNAP", async () => {
  const { state, methods, store } = fakes();
  const clock = new ManualClock(0);
  const r = new Readiness({
    methods,
    store,
    logger: silentLogger,
    clock,
    initSteps: [
      {
        name: "register",
        run: async () => {
          if (state.registerFails-- > 0) throw new Error("apiserver down");
          state.registered++;
        },
      },
    ],
  });
  expect(await r.check()).toEqual({ ready: false, reason: "initialising" });
  const done = r.initialise();
  await clock.advanceAsync(200);
  expect(r.initialised).toBe(false);
  state.snapUp = true;
  await clock.advanceAsync(400); // SNAP answers, the step fails once
  expect(r.initialised).toBe(false);
  await clock.advanceAsync(800);
  await done;
  expect(r.initialised).toBe(true);
  expect(state.registered).toBe(1);
  expect(await r.check()).toEqual({ ready: true });
  state.snapUp = false;
  expect((await r.check()).reason).toContain("SNAP does not answer");
});

test("an unusable state directory is unhealthy, not merely unready", async () => {
  const { state, methods, store } = fakes();
  state.storeOk = false;
  const r = new Readiness({ methods, store, logger: silentLogger });
  const err = await r.check().catch((e: StorageError) => e);
  expect((err as StorageError).kind).toBe("internal");
});

test("initialise stops when aborted", async () => {
  const { methods, store } = fakes();
  const clock = new ManualClock(0);
  const r = new Readiness({ methods, store, logger: silentLogger, clock });
  const ac = new AbortController();
  const p = r.initialise(ac.signal).catch((e: unknown) => e);
  await clock.advanceAsync(1);
  ac.abort(new Error("stopping"));
  expect(((await p) as Error).message).toBe("stopping");
  expect(r.initialised).toBe(false);
});
