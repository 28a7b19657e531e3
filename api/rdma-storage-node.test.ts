// RDMAStorageNode schema: the example parses, and every constraint is reported at the field it guards.
import { describe, expect, test } from "bun:test";
import { exampleRDMAStorageNode } from "./examples.ts";
import { RDMAStorageNodeSchema } from "./rdma-storage-node.ts";
import { issuePaths, type RejectCase, withPaths } from "./testing.ts";

describe("RDMAStorageNode", () => {
  const accepts: { name: string; set: Record<string, unknown> }[] = [
    { name: "the example", set: {} },
    { name: "no status yet", set: { status: undefined } },
    { name: "empty status (no RDMA port found)", set: { status: {} } },
    { name: "tcp over IPv6", set: { "status.transport": "tcp", "status.rdmaIP": "2001:db8::5" } },
  ];
  test.each(accepts)("accepts $name", ({ set }) => {
    expect(issuePaths(RDMAStorageNodeSchema, withPaths(exampleRDMAStorageNode(), set))).toEqual([]);
  });

  const rejects: RejectCase[] = [
    { name: "empty nodeName", set: { "spec.nodeName": "" }, at: "spec.nodeName" },
    { name: "rdmaIP hostname", set: { "status.rdmaIP": "node-a" }, at: "status.rdmaIP" },
    { name: "rdmaIP with zone", set: { "status.rdmaIP": "fe80::1%eth0" }, at: "status.rdmaIP" },
    { name: "rdmaIP IPv4-mapped", set: { "status.rdmaIP": "::ffff:10.0.0.1" }, at: "status.rdmaIP" },
    { name: "rdmaIP with prefix", set: { "status.rdmaIP": "10.0.0.1/24" }, at: "status.rdmaIP" },
    { name: "unknown transport", set: { "status.transport": "ib" }, at: "status.transport" },
    { name: "negative linkSpeedMbps", set: { "status.linkSpeedMbps": -1 }, at: "status.linkSpeedMbps" },
    { name: "negative totalBytes", set: { "status.totalBytes": -1 }, at: "status.totalBytes" },
    { name: "fractional freeBytes", set: { "status.freeBytes": 0.5 }, at: "status.freeBytes" },
    { name: "negative exportCount", set: { "status.exportCount": -1 }, at: "status.exportCount" },
    {
      name: "heartbeat not RFC 3339",
      set: { "status.lastHeartbeatTime": "1700000000" },
      at: "status.lastHeartbeatTime",
    },
    {
      name: "condition with empty reason",
      set: { "status.conditions.1.reason": "" },
      at: "status.conditions.1.reason",
    },
  ];
  test.each(rejects)("rejects $name at $at", ({ set, at }) => {
    expect(issuePaths(RDMAStorageNodeSchema, withPaths(exampleRDMAStorageNode(), set))).toContain(at);
  });
});
