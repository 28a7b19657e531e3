// Which volume capabilities the controller accepts, refuses as malformed, or refuses as unsupported.
import { describe, expect, test } from "bun:test";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import {
  VolumeCapability_AccessMode_Mode as Mode,
  type VolumeCapability,
  VolumeCapabilitySchema,
} from "../../gen/csi/v1/csi_pb.ts";
import { StorageError } from "../../lib/errors.ts";
import {
  capabilityKey,
  isMultiNodeMode,
  isReaderMode,
  malformedReason,
  normalizeCapability,
  requireSupported,
  unsupportedReason,
} from "./capabilities.ts";

const cap = (init: MessageInitShape<typeof VolumeCapabilitySchema>): VolumeCapability =>
  create(VolumeCapabilitySchema, init);
const mount = (mode: Mode, fsType = "") =>
  cap({ accessType: { case: "mount", value: { fsType } }, accessMode: { mode } });
const block = (mode: Mode) => cap({ accessType: { case: "block", value: {} }, accessMode: { mode } });

describe("capability checks", () => {
  const rows: [string, VolumeCapability, "ok" | "malformed" | "unsupported", string?][] = [
    ["mount ext4 SINGLE_NODE_WRITER", mount(Mode.SINGLE_NODE_WRITER, "ext4"), "ok"],
    ["mount xfs SINGLE_NODE_SINGLE_WRITER", mount(Mode.SINGLE_NODE_SINGLE_WRITER, "xfs"), "ok"],
    ["mount default fs SINGLE_NODE_MULTI_WRITER", mount(Mode.SINGLE_NODE_MULTI_WRITER), "ok"],
    ["block SINGLE_NODE_WRITER", block(Mode.SINGLE_NODE_WRITER), "ok"],
    ["no access type", cap({ accessMode: { mode: Mode.SINGLE_NODE_WRITER } }), "malformed", "access_type"],
    ["no access mode", cap({ accessType: { case: "block", value: {} } }), "malformed", "access_mode"],
    ["UNKNOWN mode", block(Mode.UNKNOWN), "malformed", "access_mode"],
    ["block MULTI_NODE_MULTI_WRITER (live migration)", block(Mode.MULTI_NODE_MULTI_WRITER), "ok"],
    [
      "mount MULTI_NODE_MULTI_WRITER",
      mount(Mode.MULTI_NODE_MULTI_WRITER, "ext4"),
      "unsupported",
      "raw block volumes only",
    ],
    [
      "mount default fs MULTI_NODE_MULTI_WRITER",
      mount(Mode.MULTI_NODE_MULTI_WRITER),
      "unsupported",
      "raw block volumes only",
    ],
    ["mount MULTI_NODE_READER_ONLY", mount(Mode.MULTI_NODE_READER_ONLY), "ok"],
    ["block MULTI_NODE_READER_ONLY", block(Mode.MULTI_NODE_READER_ONLY), "ok"],
    ["mount xfs SINGLE_NODE_READER_ONLY", mount(Mode.SINGLE_NODE_READER_ONLY, "xfs"), "ok"],
    ["block SINGLE_NODE_READER_ONLY", block(Mode.SINGLE_NODE_READER_ONLY), "ok"],
    [
      "MULTI_NODE_SINGLE_WRITER",
      mount(Mode.MULTI_NODE_SINGLE_WRITER),
      "unsupported",
      "one writer node, only readers",
    ],
    ["btrfs", mount(Mode.SINGLE_NODE_WRITER, "btrfs"), "unsupported", '"btrfs"'],
  ];
  for (const [name, c, want, says] of rows) {
    test(name, () => {
      const malformed = malformedReason(c);
      const unsupported = malformed ? undefined : unsupportedReason(c);
      const got = malformed ? "malformed" : unsupported ? "unsupported" : "ok";
      expect(got).toBe(want);
      if (says) expect(malformed ?? unsupported).toContain(says);
    });
  }
});

test("normalization drops an empty fsType and keys capabilities stably", () => {
  expect(normalizeCapability(mount(Mode.SINGLE_NODE_WRITER))).toEqual({
    access: "mount",
    mode: "SINGLE_NODE_WRITER",
  });
  expect(capabilityKey(normalizeCapability(mount(Mode.SINGLE_NODE_WRITER, "xfs")))).toBe(
    "mount:xfs:SINGLE_NODE_WRITER",
  );
  expect(capabilityKey(normalizeCapability(block(Mode.SINGLE_NODE_MULTI_WRITER)))).toBe(
    "block::SINGLE_NODE_MULTI_WRITER",
  );
});

test("requireSupported sorts, deduplicates, and names the offending entry", () => {
  const caps = [
    block(Mode.SINGLE_NODE_WRITER),
    mount(Mode.SINGLE_NODE_WRITER, "ext4"),
    block(Mode.SINGLE_NODE_WRITER),
  ];
  expect(requireSupported(caps, "volume_capabilities").map(capabilityKey)).toEqual([
    "block::SINGLE_NODE_WRITER",
    "mount:ext4:SINGLE_NODE_WRITER",
  ]);
  const err = (() => {
    try {
      requireSupported(
        [block(Mode.SINGLE_NODE_WRITER), mount(Mode.MULTI_NODE_MULTI_WRITER, "xfs")],
        "volume_capabilities",
      );
    } catch (e) {
      return e;
    }
  })() as StorageError;
  expect(err).toBeInstanceOf(StorageError);
  expect(err.kind).toBe("invalid");
  expect(err.message).toContain("volume_capabilities[1]");
  expect(err.message).toContain("raw block volumes only");
  expect(() => requireSupported([], "volume_capabilities")).toThrow("volume_capabilities is required");
});

test("reader modes are exactly the two *_READER_ONLY modes", () => {
  const names = Object.keys(Mode).filter((k) => Number.isNaN(Number(k))) as (keyof typeof Mode)[];
  expect(names.filter(isReaderMode).sort()).toEqual(["MULTI_NODE_READER_ONLY", "SINGLE_NODE_READER_ONLY"]);
});

test("multi-node modes (one attachment per node) are exactly MULTI_NODE_READER_ONLY and MULTI_NODE_MULTI_WRITER", () => {
  const names = Object.keys(Mode).filter((k) => Number.isNaN(Number(k))) as (keyof typeof Mode)[];
  expect(names.filter(isMultiNodeMode).sort()).toEqual(["MULTI_NODE_MULTI_WRITER", "MULTI_NODE_READER_ONLY"]);
  // MULTI_NODE_SINGLE_WRITER stays refused: it would need a second attachment kind with one writer.
  expect(unsupportedReason(block(Mode.MULTI_NODE_SINGLE_WRITER))).toContain("not supported");
});
