// Reading a node's registered host NQN: only a valid NQN counts.
import { expect, test } from "bun:test";
import { HOST_NQN_ANNOTATION, hostNQNOf } from "./host-nqn-annotation.ts";

test("a valid registered NQN is read; anything else is no registration", () => {
  const nqn = "nqn.2014-08.org.nvmexpress:uuid:7d3a0a36-6c1f-4c55-9a51-1f2b3c4d5e6f";
  expect(hostNQNOf({ [HOST_NQN_ANNOTATION]: nqn })).toBe(nqn);
  expect(hostNQNOf({ [HOST_NQN_ANNOTATION]: "not an nqn" })).toBeUndefined();
  expect(
    hostNQNOf({ [HOST_NQN_ANNOTATION]: `nqn.2014-08.org.nvmexpress:${"x".repeat(230)}` }),
  ).toBeUndefined();
  expect(hostNQNOf({})).toBeUndefined();
  expect(hostNQNOf(undefined)).toBeUndefined();
});
