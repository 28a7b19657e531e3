// Topology matching: requisite filters, preferred ranks in order, absent requirements accept all.
import { describe, expect, test } from "bun:test";
import type { TopologyRequirement } from "../../api/index.ts";
import { topologyRank } from "./topology.ts";

const zone = (z: string, extra: Record<string, string> = {}) => ({ segments: { zone: z, ...extra } });

describe("topologyRank", () => {
  const cases: {
    name: string;
    req: TopologyRequirement | undefined;
    labels: Record<string, string>;
    want: number | undefined;
  }[] = [
    { name: "no requirement", req: undefined, labels: {}, want: 0 },
    { name: "empty requirement", req: {}, labels: { zone: "a" }, want: 0 },
    { name: "requisite matched", req: { requisite: [zone("a"), zone("b")] }, labels: { zone: "b" }, want: 0 },
    { name: "requisite missed", req: { requisite: [zone("a")] }, labels: { zone: "b" }, want: undefined },
    {
      name: "requisite needs every segment",
      req: { requisite: [zone("a", { rack: "1" })] },
      labels: { zone: "a" },
      want: undefined,
    },
    { name: "requisite on unlabelled node", req: { requisite: [zone("a")] }, labels: {}, want: undefined },
    {
      name: "empty segment map matches anything",
      req: { requisite: [{ segments: {} }] },
      labels: {},
      want: 0,
    },
    {
      name: "first preferred wins",
      req: { requisite: [zone("a"), zone("b")], preferred: [zone("b"), zone("a")] },
      labels: { zone: "b" },
      want: 0,
    },
    {
      name: "second preferred",
      req: { requisite: [zone("a"), zone("b")], preferred: [zone("b"), zone("a")] },
      labels: { zone: "a" },
      want: 1,
    },
    {
      name: "preferred missed ranks last",
      req: { preferred: [zone("a"), zone("b")] },
      labels: { zone: "c" },
      want: 2,
    },
  ];
  test.each(cases)("$name", ({ req, labels, want }) => {
    expect(topologyRank(req, labels)).toBe(want);
  });
});
