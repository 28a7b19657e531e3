// The node ID carries the host NQN, splits unambiguously, and reads IDs of earlier releases.
import { expect, test } from "bun:test";
import { formatNodeId, parseNodeId, sameNode } from "./csi-node-id.ts";

const NQN = "nqn.2014-08.org.nvmexpress:uuid:0d4c1d0e-1b2c-4d3e-8f40-5a6b7c8d9e0f";

test("format and parse round-trip; an NQN's own separators stay in the NQN", () => {
  const id = formatNodeId("worker-1.example.com", NQN);
  expect(id).toBe(`worker-1.example.com/${NQN}`);
  expect(parseNodeId(id)).toEqual({ nodeName: "worker-1.example.com", hostNQN: NQN });
  expect(parseNodeId("worker-1/nqn.2026-01.io.x:a/b")).toEqual({
    nodeName: "worker-1",
    hostNQN: "nqn.2026-01.io.x:a/b",
  });
});

test("a node ID of an earlier release is a bare node name, and names the same node", () => {
  expect(parseNodeId("worker-1")).toEqual({ nodeName: "worker-1" });
  expect(sameNode("worker-1", formatNodeId("worker-1", NQN))).toBe(true);
  expect(sameNode("worker-1", formatNodeId("worker-2", NQN))).toBe(false);
});

test("over CSI's 256 bytes is refused, not truncated", () => {
  expect(() => formatNodeId("n".repeat(200), NQN)).toThrow("over CSI's 256");
});
