// Volume health verdicts from observations, table-driven.
import { expect, test } from "bun:test";
import type { ConnectedSubsystem } from "../host/nvme-initiator.ts";
import { assessHealth, type HealthObservation } from "./health.ts";

const sub = (...states: string[]): ConnectedSubsystem => ({
  nqn: "nqn.2026-01.io.distort:vol-1",
  hostNqn: "nqn.2026-01.io.distort:host:a",
  name: "nvme-subsys1",
  paths: states.map((state, i) => ({
    name: `nvme${i}`,
    transport: "tcp",
    traddr: "10.0.0.1",
    trsvcid: "4420",
    state,
  })),
});
const good = { path: "/stage", mounted: true, ours: true };

test.each<[string, HealthObservation, [string, string][]]>([
  ["healthy mount", { subsystem: sub("live"), deviceExists: true, staging: good }, []],
  ["healthy block", { subsystem: sub("live"), deviceExists: true }, []],
  [
    "controller gone",
    { subsystem: undefined, deviceExists: true, staging: good },
    [["INACCESSIBLE", "ControllerGone"]],
  ],
  [
    "reconnecting",
    { subsystem: sub("connecting"), deviceExists: true },
    [["INACCESSIBLE", "ControllerNotLive"]],
  ],
  [
    "one of two paths down",
    { subsystem: sub("live", "resetting"), deviceExists: true },
    [["DEGRADED", "PathDown"]],
  ],
  [
    "device gone with the controller",
    { subsystem: undefined, deviceExists: false },
    [
      ["INACCESSIBLE", "ControllerGone"],
      ["INACCESSIBLE", "DeviceMissing"],
    ],
  ],
  [
    "staging unmounted",
    { subsystem: sub("live"), deviceExists: true, staging: { ...good, mounted: false, ours: false } },
    [["INACCESSIBLE", "StagingMountMissing"]],
  ],
  [
    "staging shows another fs",
    { subsystem: sub("live"), deviceExists: true, staging: { ...good, ours: false } },
    [["INACCESSIBLE", "StagingMountForeign"]],
  ],
  [
    "staging broken",
    { subsystem: sub("live"), deviceExists: true, staging: { ...good, statfsError: "EIO" } },
    [["INACCESSIBLE", "StagingMountBroken"]],
  ],
  [
    "publish path unmounted",
    {
      subsystem: sub("live"),
      deviceExists: true,
      staging: good,
      published: { path: "/t", mounted: false, ours: false },
    },
    [["INACCESSIBLE", "PublishMountMissing"]],
  ],
])("%s", (_name, o, want) => {
  expect(assessHealth(o).map((i) => [i.status, i.reason])).toEqual(want);
});
