// The emulator's bdev QoS throttle on a ManualClock: per-1 ms budgets as SPDK computes them,
// arrival order, overdraw carried into the next slice, limits that apply per direction, and a
// limit change releasing waiting I/O.
import { expect, test } from "bun:test";
import { ManualClock, settle } from "../../../lib/clock.ts";
import { QosThrottle } from "./qos.ts";

const NONE = { rw_ios_per_sec: 0, rw_mbytes_per_sec: 0, r_mbytes_per_sec: 0, w_mbytes_per_sec: 0 };

/** Starts `n` admissions and returns the list that fills, in order, as they are admitted. */
function submit(
  t: QosThrottle,
  n: number,
  kind: "read" | "write",
  bytes: number,
  done: string[],
  tag: string,
) {
  for (let i = 0; i < n; i++) void t.admit(kind, bytes).then(() => done.push(`${tag}${i}`));
}

test("2000 IOPS admits two I/Os per 1 ms timeslice, in arrival order", async () => {
  const clock = new ManualClock(1000);
  const t = new QosThrottle(clock, { ...NONE, rw_ios_per_sec: 2000 });
  const done: string[] = [];
  submit(t, 5, "read", 4096, done, "r");
  await settle();
  expect(done).toEqual(["r0", "r1"]);
  await clock.advanceAsync(1);
  expect(done).toEqual(["r0", "r1", "r2", "r3"]);
  await clock.advanceAsync(1);
  expect(done).toHaveLength(5);
});

test("a byte limit lets one I/O overdraw and makes the next wait until the deficit is repaid", async () => {
  const clock = new ManualClock(0);
  // 1 MiB/s: 1048 bytes per timeslice; a 4 KiB write overdraws by 3048 bytes.
  const t = new QosThrottle(clock, { ...NONE, w_mbytes_per_sec: 1 });
  const done: string[] = [];
  submit(t, 2, "write", 4096, done, "w");
  await settle();
  expect(done).toEqual(["w0"]);
  // -3048 + 1048 + 1048 = -952 after two slices: still in deficit.
  await clock.advanceAsync(2);
  expect(done).toEqual(["w0"]);
  // +1048 more is 96 bytes of budget: the second write goes.
  await clock.advanceAsync(1);
  expect(done).toEqual(["w0", "w1"]);
});

test("a write-only limit leaves reads alone", async () => {
  const clock = new ManualClock(0);
  const t = new QosThrottle(clock, { ...NONE, w_mbytes_per_sec: 1 });
  const done: string[] = [];
  submit(t, 3, "read", 1 << 20, done, "r");
  await settle();
  expect(done).toEqual(["r0", "r1", "r2"]);
});

test("lifting the limits releases what waits; all-zero limits throttle nothing", async () => {
  const clock = new ManualClock(0);
  const t = new QosThrottle(clock, { ...NONE, rw_ios_per_sec: 1000 });
  const done: string[] = [];
  submit(t, 4, "write", 512, done, "w");
  await settle();
  expect(done).toEqual(["w0"]);
  t.setLimits(NONE);
  await settle();
  expect(done).toHaveLength(4);
  expect(t.limited).toBe(false);
});
