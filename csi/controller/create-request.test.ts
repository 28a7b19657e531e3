// CreateVolume planning: every refusal before any API call, and the partition a plan builds.
import { expect, test } from "bun:test";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import * as v from "valibot";
import { NVMePartitionSchema } from "../../api/index.ts";
import {
  CreateVolumeRequestSchema,
  VolumeCapability_AccessMode_Mode as Mode,
} from "../../gen/csi/v1/csi_pb.ts";
import { StorageError } from "../../lib/errors.ts";
import { buildPartition, planCreateVolume } from "./create-request.ts";
import { Annotations, PROVISIONED_BY_LABEL, readRecord } from "./fingerprint.ts";

const NS = "distort-system";
const opts = { namespace: NS, defaultVolumeBytes: 1 << 30 };
const mountCap = {
  accessType: { case: "mount" as const, value: { fsType: "ext4" } },
  accessMode: { mode: Mode.SINGLE_NODE_WRITER },
};
const req = (over: MessageInitShape<typeof CreateVolumeRequestSchema> = {}) =>
  create(CreateVolumeRequestSchema, { name: "pvc-1", volumeCapabilities: [mountCap], ...over });

const refusals: [string, ReturnType<typeof req>, string, string][] = [
  ["no name", req({ name: "" }), "invalid", "name is required"],
  ["129-byte name", req({ name: "n".repeat(129) }), "invalid", "129 bytes"],
  ["no capabilities", req({ volumeCapabilities: [] }), "invalid", "volume_capabilities is required"],
  [
    "multi-node writer on a filesystem",
    req({ volumeCapabilities: [{ ...mountCap, accessMode: { mode: Mode.MULTI_NODE_MULTI_WRITER } }] }),
    "invalid",
    "raw block volumes only",
  ],
  [
    "multi-node single writer",
    req({ volumeCapabilities: [{ ...mountCap, accessMode: { mode: Mode.MULTI_NODE_SINGLE_WRITER } }] }),
    "invalid",
    "not supported",
  ],
  [
    "capacity out of range",
    req({ capacityRange: { requiredBytes: 5n << 20n, limitBytes: 7n << 20n } }),
    "out-of-range",
    "multiple",
  ],
  ["unknown parameter", req({ parameters: { copies: "3" } }), "invalid", "unknown parameter"],
  ["malformed parameter", req({ parameters: { ctrlLossTmo: "abc" } }), "invalid", "ctrlLossTmo"],
  ["fsType clash", req({ parameters: { fsType: "xfs" } }), "invalid", "contradicts"],
  ["unknown mutable parameter", req({ mutableParameters: { iops: "1" } }), "invalid", "mutable_parameters"],
  [
    "IOPS limit off SPDK's step",
    req({ parameters: { "qos.rwIops": "2500" } }),
    "invalid",
    "multiple of 1000",
  ],
  [
    "limits on the kernel backend",
    req({ parameters: { backend: "kernel" }, mutableParameters: { "qos.wMBps": "10" } }),
    "invalid",
    "no per-namespace rate limits",
  ],
  [
    "mkfsOptions forcing",
    req({ parameters: { mkfsOptions: "-F" } }),
    "invalid",
    'mkfsOptions for ext4: option "-F"',
  ],
  [
    "mkfsOptions of the other filesystem",
    req({
      parameters: { fsType: "xfs", mkfsOptions: "-b 4096" },
      volumeCapabilities: [{ ...mountCap, accessType: { case: "mount", value: { fsType: "" } } }],
    }),
    "invalid",
    'value "4096" of -b',
  ],
  [
    "mkfsOptions for a mount of unknown filesystem",
    req({
      parameters: { mkfsOptions: "-b 4096" },
      volumeCapabilities: [{ ...mountCap, accessType: { case: "mount", value: { fsType: "" } } }],
    }),
    "invalid",
    "needs the filesystem known",
  ],
  [
    "clone on kernel",
    req({
      parameters: { backend: "kernel" },
      volumeContentSource: { type: { case: "volume", value: { volumeId: "x" } } },
    }),
    "invalid",
    "needs backend spdk",
  ],
  [
    "snapshot source without id",
    req({ volumeContentSource: { type: { case: "snapshot", value: { snapshotId: "" } } } }),
    "invalid",
    "source id is required",
  ],
  ["empty content source", req({ volumeContentSource: {} }), "invalid", "must name a volume or a snapshot"],
  [
    "bad topology",
    req({ accessibilityRequirements: { requisite: [{ segments: { "bad key": "x" } }] } }),
    "invalid",
    "segment key",
  ],
];
for (const [name, r, kind, says] of refusals) {
  test(`refuses: ${name}`, () => {
    let err: unknown;
    try {
      planCreateVolume(r, opts);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind as string).toBe(kind);
    expect((err as StorageError).message).toContain(says);
  });
}

test("a 128-byte name is accepted and hashed into a partition name", () => {
  const plan = planCreateVolume(req({ name: "n".repeat(128) }), opts);
  expect(plan.partitionName).toMatch(/^csi-[0-9a-f]{24}$/);
});

test("the plan builds an unplaced partition the API schema accepts, with the request recorded", () => {
  const plan = planCreateVolume(
    req({
      capacityRange: { requiredBytes: 10n << 20n },
      parameters: {
        transport: "tcp",
        portalPort: "4421",
        ctrlLossTmo: "30",
        "csi.storage.k8s.io/pvc/name": "data",
      },
      accessibilityRequirements: { requisite: [{ segments: { zone: "a" } }] },
    }),
    opts,
  );
  const p = buildPartition(plan, NS);
  expect(v.safeParse(NVMePartitionSchema, p).success).toBe(true);
  expect(p.metadata).toMatchObject({
    name: "pvc-1",
    namespace: NS,
    labels: { [PROVISIONED_BY_LABEL]: "csi" },
  });
  expect(p.metadata.annotations?.[Annotations.pvcName]).toBe("data");
  expect(p.metadata.annotations?.[Annotations.fingerprint]).toBe(plan.fingerprint);
  expect(p.spec).toEqual({
    sizeBytes: 12 << 20,
    backend: "spdk",
    volumeManager: "partition",
    targetOptions: { transport: "tcp", portalPort: 4421 },
    topology: { requisite: [{ segments: { zone: "a" } }] },
  });
  expect(readRecord(p.metadata.annotations)).toEqual(plan.record);
});

test("equal requests plan equal fingerprints; provisioner metadata does not count", () => {
  const a = planCreateVolume(req({ parameters: { "csi.storage.k8s.io/pvc/name": "x" } }), opts);
  const b = planCreateVolume(req({ parameters: { backend: "spdk", transport: "rdma" } }), opts);
  expect(a.fingerprint).toBe(b.fingerprint);
  const c = planCreateVolume(req({ capacityRange: { requiredBytes: 2n << 30n } }), opts);
  expect(c.fingerprint).not.toBe(a.fingerprint);
});

test("mkfsOptions are normalized and recorded; a block volume ignores them", () => {
  const plan = planCreateVolume(req({ parameters: { mkfsOptions: "  -b 4096\t -E nodiscard " } }), opts);
  expect(plan.record.params.mkfsOptions).toBe("-b 4096 -E nodiscard");
  const block = planCreateVolume(
    req({
      parameters: { mkfsOptions: "-K" },
      volumeCapabilities: [
        { accessType: { case: "block", value: {} }, accessMode: { mode: Mode.SINGLE_NODE_WRITER } },
      ],
    }),
    opts,
  );
  expect(block.record.params.mkfsOptions).toBe("-K");
  expect(readRecord(buildPartition(plan, NS).metadata.annotations)?.params.mkfsOptions).toBe(
    "-b 4096 -E nodiscard",
  );
});

test("StorageClass qos.* with the VolumeAttributesClass's on top become spec.qos, outside the fingerprint", () => {
  const plan = planCreateVolume(
    req({
      parameters: { "qos.rwIops": "4000", "qos.wMBps": "30" },
      mutableParameters: { "qos.wMBps": "20" },
    }),
    opts,
  );
  const p = buildPartition(plan, NS);
  expect(v.safeParse(NVMePartitionSchema, p).success).toBe(true);
  expect(p.spec.qos).toEqual({ rwIosPerSec: 4000, wMBytesPerSec: 20 });
  // A later ModifyVolume changes spec.qos: a retried CreateVolume must still find its volume.
  expect(plan.fingerprint).toBe(planCreateVolume(req(), opts).fingerprint);
  // All-zero limits on the kernel backend are unlimited, which nvmet is: no spec.qos at all.
  const kernel = planCreateVolume(req({ parameters: { backend: "kernel", "qos.rMBps": "0" } }), opts);
  expect(buildPartition(kernel, NS).spec.qos).toBeUndefined();
});

test("thinProvisioning true becomes spec.thinProvisioning and changes the fingerprint; false is thick", () => {
  const thin = planCreateVolume(req({ parameters: { thinProvisioning: "true" } }), opts);
  const p = buildPartition(thin, NS);
  expect(v.safeParse(NVMePartitionSchema, p).success).toBe(true);
  expect(p.spec.thinProvisioning).toBe(true);
  expect(readRecord(p.metadata.annotations)?.params.thin).toBe(true);
  // The same name asked for thick is another volume (ALREADY_EXISTS), not this one.
  expect(thin.fingerprint).not.toBe(planCreateVolume(req(), opts).fingerprint);
  const thick = planCreateVolume(req({ parameters: { thinProvisioning: "false" } }), opts);
  expect(buildPartition(thick, NS).spec.thinProvisioning).toBeUndefined();
  expect(thick.fingerprint).toBe(planCreateVolume(req(), opts).fingerprint);
});
