// Leader terms against a real kube-apiserver: of two candidates only one runs a term at a time, a
// stopped leader's term is stopped before the other's starts, readiness follows the term, and
// without election one term runs until stop().

import { afterAll, beforeAll, expect, test } from "bun:test";
import { eventually, type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { realClock } from "../clock.ts";
import { StorageError } from "../errors.ts";
import { silentLogger } from "../log.ts";
import { type LeaderTerms, runLeaderTerms } from "./leader-terms.ts";

let tc: TestCluster;
beforeAll(async () => {
  tc = await testCluster();
}, 300_000);
afterAll(async () => {
  await tc?.stop();
});

test("one term at a time across candidates; a stopped leader hands over", async () => {
  const ns = await tc.namespace("terms");
  const log: string[] = [];
  let active = 0;
  let maxActive = 0;
  const candidate = (id: string): LeaderTerms =>
    runLeaderTerms({
      conn: tc.conn,
      clock: realClock,
      logger: silentLogger,
      election: {
        namespace: ns,
        name: "terms-lease",
        identity: id,
        leaseDurationMs: 3000,
        renewDeadlineMs: 2000,
        retryPeriodMs: 500,
      },
      start: async (signal) => {
        active++;
        maxActive = Math.max(maxActive, active);
        log.push(`start ${id}`);
        expect(signal.aborted).toBe(false);
        return {
          stop: async () => {
            active--;
            log.push(`stop ${id}`);
          },
        };
      },
    });
  const a = candidate("a");
  const b = candidate("b");
  try {
    await eventually(() => log.length === 1, 20_000, "a first term");
    const first = (log[0] as string).slice("start ".length);
    const [leader, standby] = first === "a" ? [a, b] : [b, a];
    expect(leader.leading).toBe(true);
    expect(leader.ready).toBe(true);
    expect(standby.leading).toBe(false);
    expect(standby.ready).toBe(true);
    await leader.stop();
    expect(leader.leading).toBe(false);
    await eventually(() => log.length === 3, 20_000, "the standby's term");
    const other = first === "a" ? "b" : "a";
    expect(log).toEqual([`start ${first}`, `stop ${first}`, `start ${other}`]);
    expect(standby.leading).toBe(true);
    expect(maxActive).toBe(1);
  } finally {
    await Promise.all([a.stop(), b.stop()]);
  }
  expect(active).toBe(0);
});

test("without election one term runs until stop; a failed start ends the term", async () => {
  let stopped = 0;
  const one = runLeaderTerms({
    conn: tc.conn,
    clock: realClock,
    logger: silentLogger,
    start: async () => ({
      stop: async () => {
        stopped++;
      },
    }),
  });
  await eventually(() => one.leading && one.ready, 5000, "the term");
  await one.stop();
  await one.stop();
  expect(stopped).toBe(1);
  expect(one.leading).toBe(false);

  const leadingSeen: boolean[] = [];
  const failing = runLeaderTerms({
    conn: tc.conn,
    clock: realClock,
    logger: silentLogger,
    start: async () => {
      throw new StorageError("unavailable", "caches never synced");
    },
    onLeading: (l) => leadingSeen.push(l),
  });
  await eventually(() => leadingSeen.length === 2, 5000, "the failed term to end");
  expect(leadingSeen).toEqual([true, false]);
  expect(failing.leading).toBe(false);
  await failing.stop();
});
