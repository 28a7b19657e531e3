// Topology conversion and the accessible topology of a placed volume.
import { expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { TopologyRequirementSchema } from "../../gen/csi/v1/csi_pb.ts";
import { accessibleTopology, matchesSegments, toPartitionTopology } from "./topology.ts";

const req = (requisite: Record<string, string>[], preferred: Record<string, string>[] = []) =>
  create(TopologyRequirementSchema, {
    requisite: requisite.map((segments) => ({ segments })),
    preferred: preferred.map((segments) => ({ segments })),
  });

test("requirements convert to spec.topology; none converts to undefined", () => {
  expect(toPartitionTopology(undefined)).toBeUndefined();
  expect(toPartitionTopology(req([]))).toBeUndefined();
  expect(toPartitionTopology(req([{ "topology.kubernetes.io/zone": "a" }], [{ rack: "r1" }]))).toEqual({
    requisite: [{ segments: { "topology.kubernetes.io/zone": "a" } }],
    preferred: [{ segments: { rack: "r1" } }],
  });
});

const bad: [string, ReturnType<typeof req>, string][] = [
  ["empty topology", req([{}]), "at least one segment"],
  ["bad key", req([{ "bad key": "a" }]), "segment key"],
  ["bad prefix", req([{ "Bad_Prefix/zone": "a" }]), "prefix"],
  ["bad value", req([{ zone: "a b" }]), "not a label value"],
  [
    "too many segments",
    req([Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, "v"]))]),
    "at most 16",
  ],
  ["too many topologies", req(Array.from({ length: 33 }, (_, i) => ({ zone: `z${i}` }))), "at most 32"],
];
for (const [name, r, says] of bad) {
  test(`refuses ${name}`, () => {
    expect(() => toPartitionTopology(r)).toThrow(says);
  });
}

test("accessible topology: the node's values of the requested keys only", () => {
  const labels = { zone: "a", rack: "r1", unrelated: "x" };
  expect(
    accessibleTopology(
      { requisite: [{ segments: { zone: "a" } }], preferred: [{ segments: { rack: "r1" } }] },
      labels,
    ),
  ).toEqual([{ segments: { rack: "r1", zone: "a" } }]);
  expect(accessibleTopology(undefined, labels)).toEqual([]);
  expect(accessibleTopology({ requisite: [{ segments: { region: "eu" } }] }, labels)).toEqual([]);
  expect(matchesSegments({ zone: "a" }, labels)).toBe(true);
  expect(matchesSegments({ zone: "b" }, labels)).toBe(false);
  expect(matchesSegments({}, labels)).toBe(true);
});
