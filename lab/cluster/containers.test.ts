// What the cgroup lookups return off a node: nothing for an unknown container or node, and never
// the test runner itself (the positive cases run on the real cluster, in e2e/ and e2e-cluster/).
import { expect, test } from "bun:test";
import { containerPids, containerProcess, distortProcesses } from "./containers.ts";

test("no process belongs to an unknown container ID, nor a container to a node that does not exist", () => {
  expect(containerPids(`containerd://${"0".repeat(64)}`)).toEqual([]);
  expect(containerProcess(/./, { node: "no-such-node-e3f1" })).toBeUndefined();
});

test("the test runner is no DISTORT process", () => {
  expect(distortProcesses().map((p) => p.pid)).not.toContain(process.pid);
});
