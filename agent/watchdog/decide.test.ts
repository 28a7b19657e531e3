import { expect, test } from "bun:test";
import { decideWatchdog, listenersToFence } from "./decide.ts";
import { buildLease, type Lease, parseLease } from "./lease.ts";

const T = 1_000_000;
const lease = (o: Partial<Lease> = {}): Lease => ({
  version: 1,
  node: "n1",
  heartbeatMs: T,
  fenceAtMs: T + 3_000,
  nqns: ["nqn.a", "nqn.b"],
  ...o,
});

test("the deadline is the heartbeat plus the self-fence share of the smallest bound; no nexus, no deadline", () => {
  expect(
    buildLease({
      node: "n1",
      heartbeatMs: T,
      serving: [
        { nqn: "nqn.b", failoverAfterSeconds: 10 },
        { nqn: "nqn.a", failoverAfterSeconds: 5 },
        { nqn: "nqn.c", failoverAfterSeconds: undefined },
      ],
    }),
  ).toEqual({
    version: 1,
    node: "n1",
    heartbeatMs: T,
    fenceAtMs: T + 3_000,
    nqns: ["nqn.a", "nqn.b", "nqn.c"],
  });
  expect(
    buildLease({ node: "n1", heartbeatMs: T, serving: [{ nqn: "x", failoverAfterSeconds: undefined }] })
      .fenceAtMs,
  ).toBe(T + 18_000);
  expect(buildLease({ node: "n1", heartbeatMs: T, serving: [] })).toEqual({
    version: 1,
    node: "n1",
    heartbeatMs: T,
    nqns: [],
  });
});

test.each([
  ["not JSON", "{", "not JSON"],
  ["another version", JSON.stringify({ ...lease(), version: 2 }), "version"],
  ["an unknown field", JSON.stringify({ ...lease(), extra: 1 }), "extra"],
  [
    "nqns without a deadline",
    JSON.stringify({ version: 1, node: "n1", heartbeatMs: T, nqns: ["x"] }),
    "fenceAtMs",
  ],
  ["another node's", JSON.stringify(lease({ node: "n2" })), "node n2"],
  ["a negative time", JSON.stringify(lease({ heartbeatMs: -1 })), "heartbeatMs"],
])("a lease that is %s is malformed, and says why", (_what, text, why) => {
  const r = parseLease(text, "n1");
  expect(r.kind).toBe("malformed");
  expect(r.kind === "malformed" ? r.why : "").toContain(why);
});

test("a lease round-trips through its text", () => {
  expect(parseLease(JSON.stringify(lease()), "n1")).toEqual({ kind: "valid", lease: lease() });
});

test.each([
  // [what was read, remembered, now, fenced]
  ["missing, nothing remembered", { kind: "missing" } as const, undefined, T + 10_000, []],
  ["missing, an expired lease remembered", { kind: "missing" } as const, lease(), T + 10_000, []],
  ["valid, at the deadline", { kind: "valid", lease: lease() } as const, undefined, T + 3_000, []],
  [
    "valid, past the deadline",
    { kind: "valid", lease: lease() } as const,
    undefined,
    T + 3_001,
    ["nqn.a", "nqn.b"],
  ],
  [
    "valid, renewed after an expired one",
    { kind: "valid", lease: lease({ heartbeatMs: T + 2_000, fenceAtMs: T + 5_000 }) } as const,
    lease(),
    T + 4_000,
    [],
  ],
  [
    "valid, serving nothing",
    { kind: "valid", lease: lease({ fenceAtMs: undefined, nqns: [] }) } as const,
    lease(),
    T + 10_000,
    [],
  ],
  ["malformed, nothing remembered", { kind: "malformed", why: "x" } as const, undefined, T + 10_000, []],
  [
    "malformed, the last valid one expired",
    { kind: "malformed", why: "x" } as const,
    lease(),
    T + 3_001,
    ["nqn.a", "nqn.b"],
  ],
  [
    "malformed, the last valid one standing",
    { kind: "malformed", why: "x" } as const,
    lease(),
    T + 2_000,
    [],
  ],
] as const)("%s: fences %p", (_what, read, remembered, now, fenced) => {
  const d = decideWatchdog({ read, remembered, nowMs: now });
  expect(d.fence).toEqual([...fenced]);
  if (read.kind === "valid") expect(d.remembered).toEqual(read.lease);
  else expect(d.remembered).toEqual(remembered);
  expect(d.malformed).toBe(read.kind === "malformed" ? "x" : undefined);
});

test("listeners to fence: any group not inaccessible; none reporting ANA is called out; never an optimized one kept", () => {
  const addr = (traddr: string) => ({ trtype: "TCP", adrfam: "IPv4", traddr, trsvcid: "4420" });
  const plan = listenersToFence([
    { address: addr("10.0.0.1"), ana_states: [{ ana_group: 1, ana_state: "optimized" }] },
    {
      address: addr("10.0.0.2"),
      ana_states: [
        { ana_group: 1, ana_state: "inaccessible" },
        { ana_group: 2, ana_state: "non_optimized" },
      ],
    },
    { address: addr("10.0.0.3"), ana_states: [{ ana_group: 1, ana_state: "inaccessible" }] },
    { address: addr("10.0.0.4") },
  ]);
  expect(plan.set.map((a) => a.traddr)).toEqual(["10.0.0.1", "10.0.0.2"]);
  expect(plan.noAna.map((a) => a.traddr)).toEqual(["10.0.0.4"]);
});
