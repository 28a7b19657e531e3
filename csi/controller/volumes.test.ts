// What the ALREADY_EXISTS message of CreateVolume names as differing between two requests.
import { expect, test } from "bun:test";
import type { VolumeRecord } from "./fingerprint.ts";
import { differences } from "./volumes.ts";

const MiB = 1024 ** 2;
const base: VolumeRecord = {
  v: 1,
  sizeBytes: 8 * MiB,
  params: { backend: "spdk", volumeManager: "partition", transport: "rdma" },
  capabilities: [{ access: "mount", fsType: "ext4", mode: "SINGLE_NODE_WRITER" }],
};

test("differences: no stored record", () => {
  expect(differences(undefined, base)).toBe(
    "no recorded request (created outside CSI, or by an incompatible version)",
  );
});

test("differences: each differing part is named, in a fixed order", () => {
  const wanted: VolumeRecord = {
    ...base,
    sizeBytes: 16 * MiB,
    params: { ...base.params, transport: "tcp" },
    capabilities: [{ access: "block", mode: "SINGLE_NODE_WRITER" }],
    source: { kind: "snapshot", id: "ns/snap/u1" },
  };
  const text = differences(base, wanted);
  expect(text.split("; ")).toEqual([
    `capacity ${8 * MiB} bytes (asked: ${16 * MiB})`,
    'parameters {"backend":"spdk","transport":"rdma","volumeManager":"partition"} (asked: {"backend":"spdk","transport":"tcp","volumeManager":"partition"})',
    expect.stringMatching(/^capabilities .+ \(asked: .+\)$/),
    "another content source",
  ]);
});

test("differences: parameter key order does not count as a difference", () => {
  const reordered: VolumeRecord = {
    ...base,
    params: { transport: "rdma", volumeManager: "partition", backend: "spdk" },
  };
  expect(differences(base, reordered)).toBe("a different request");
});
