// NQN syntax checks: the forms DISTORT generates and SPDK accepts, and the ones SPDK refuses.

import { expect, test } from "bun:test";
import { nqnProblem } from "./nqn.ts";

test.each([
  "nqn.2026-02.io.distort:volume-vol-3f2a9c",
  "nqn.2016-06.io.spdk:cnode1",
  "nqn.2016-06.io.spdk:host-allowed",
  "nqn.2014-08.org.nvmexpress.discovery",
  "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555",
  "nqn.2014-08.org.nvmexpress:uuid:A2B9ECA3-73D0-4826-92FC-14B6E16A3DAE",
])("%s is well-formed", (nqn) => {
  expect(nqnProblem(nqn)).toBeUndefined();
});

test.each([
  ["not-a-valid-nqn", /not of the form/],
  ["nqn.2014-08.org.nvmexpress:uuid:allowed-host-0001", /is not a UUID/],
  ["nqn.2014-08.org.nvmexpress:uuid:", /is not a UUID/],
  ["nqn.2026-02.io.distort", /not of the form/],
  ["nqn.2026-02.io.distort:", /not of the form/],
  ["nqn.2026-02.io.distort-:v", /domain label "distort-"/],
  [`nqn.2026-02.${"a".repeat(64)}.io:v`, /at most 63 characters/],
  ["nqn.26-02.io.distort:v", /not of the form/],
  ["nqn.2026-02.9io.distort:v", /domain label "9io"/],
  [`nqn.2026-02.io.distort:${"x".repeat(210)}`, /longer than 223 bytes/],
])("%s is refused", (nqn, why) => {
  expect(nqnProblem(nqn)).toMatch(why);
});
