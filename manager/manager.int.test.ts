// Manager lifecycle against a real kube-apiserver: a start abandoned while the caches are still
// listing (leadership lost during startup) winds down promptly instead of holding up the next
// campaign, and a running manager stops promptly.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { realClock } from "../lib/clock.ts";
import { silentLogger } from "../lib/log.ts";
import { Registry } from "../lib/metrics.ts";
import { parseConfig } from "./config.ts";
import { startManager } from "./manager.ts";
import { harness } from "./testdata/harness.ts";

let tc: TestCluster;
beforeAll(async () => {
  tc = await testCluster();
}, 300_000);
afterAll(async () => {
  await tc?.stop();
});

const noEvents = { record: async () => {} };
/**
 * A watch left open would hold a stop up until the server ends it: at least 300 s (the caches
 * ask for a random timeout between 300 and 600 s). Stopping in under a fifth of that proves the
 * watch was closed, however busy the machine is.
 */
const LEAKED_WATCH_MS = 300_000;
const PROMPT_MS = LEAKED_WATCH_MS / 5;

test("a start abandoned during the first list rejects and winds down promptly", async () => {
  const h = await harness(tc, "abandon");
  const config = parseConfig(h.env(), { hostname: "t", randomSuffix: "x" });
  for (const delayMs of [0, 2, 10]) {
    const ctl = new AbortController();
    const t0 = Date.now();
    const started = startManager({
      conn: tc.conn,
      config,
      clock: realClock,
      logger: silentLogger,
      registry: new Registry(),
      events: noEvents,
      signal: ctl.signal,
    });
    await Bun.sleep(delayMs);
    ctl.abort(new Error("leadership lost"));
    const outcome = await started.then(
      async (m) => {
        await m.stop(); // the lists won the race: a normal stop
        return "started";
      },
      (err: Error) => err.message,
    );
    expect(["leadership lost", "started"]).toContain(outcome);
    expect(Date.now() - t0).toBeLessThan(PROMPT_MS);
  }
}, 200_000);

test("a running manager stops promptly", async () => {
  const h = await harness(tc, "stop");
  await h.createDevice("d");
  const m = await h.start();
  const t0 = Date.now();
  await m.stop();
  expect(Date.now() - t0).toBeLessThan(PROMPT_MS);
}, 200_000);
