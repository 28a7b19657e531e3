// StorageClass parameter parsing: defaults, every refusal with a message naming the parameter.
import { expect, test } from "bun:test";
import { StorageError } from "../../lib/errors.ts";
import { parseParameters } from "./parameters.ts";

const NS = "distort-system";

test("defaults fill an empty map", () => {
  expect(parseParameters({}, NS)).toEqual({
    params: { backend: "spdk", volumeManager: "partition", transport: "rdma" },
    provisioner: {},
  });
});

test("every known parameter parses; provisioner keys are collected, not refused", () => {
  const r = parseParameters(
    {
      backend: "kernel",
      volumeManager: "parted",
      fsType: "xfs",
      transport: "tcp",
      portalPort: "4421",
      ctrlLossTmo: "-1",
      reconnectDelay: "5",
      fastIoFailTmo: "30",
      "csi.storage.k8s.io/pvc/name": "data",
      "csi.storage.k8s.io/pvc/namespace": "app",
      "csi.storage.k8s.io/pv/name": "pvc-1",
      "csi.storage.k8s.io/something-new": "x",
    },
    NS,
  );
  expect(r.params).toEqual({
    backend: "kernel",
    volumeManager: "parted",
    fsType: "xfs",
    transport: "tcp",
    portalPort: 4421,
    ctrlLossTmo: -1,
    reconnectDelay: 5,
    fastIoFailTmo: 30,
  });
  expect(r.provisioner).toEqual({ pvcName: "data", pvcNamespace: "app", pvName: "pvc-1" });
});

test("thinProvisioning: true marks the volume thin; false and absent are the same thick record", () => {
  expect(parseParameters({ thinProvisioning: "true", volumeManager: "spdk-lvol" }, NS).params).toEqual({
    backend: "spdk",
    volumeManager: "spdk-lvol",
    transport: "rdma",
    thin: true,
  });
  expect(parseParameters({ thinProvisioning: "false" }, NS).params).toEqual(parseParameters({}, NS).params);
});

test("replicas: 2 and 3 are recorded with the spread key; 1 is the single-copy record", () => {
  expect(
    parseParameters({ replicas: "3", replicaTopologyKey: "topology.kubernetes.io/zone" }, NS).params,
  ).toEqual({
    backend: "spdk",
    volumeManager: "partition",
    transport: "rdma",
    replicas: 3,
    replicaTopologyKey: "topology.kubernetes.io/zone",
  });
  expect(parseParameters({ replicas: "2" }, NS).params.replicas).toBe(2);
  expect(parseParameters({ replicas: "2", failoverAfterSeconds: "15" }, NS).params.failoverAfterSeconds).toBe(
    15,
  );
  expect(parseParameters({ replicas: "1" }, NS).params).toEqual(parseParameters({}, NS).params);
});

const refusals: [string, Record<string, string>, string][] = [
  [
    "thinProvisioning not a boolean",
    { thinProvisioning: "yes" },
    'thinProvisioning must be "true" or "false"',
  ],
  [
    "thinProvisioning on kernel",
    { backend: "kernel", volumeManager: "parted", thinProvisioning: "true" },
    "thinProvisioning true requires backend spdk",
  ],
  ["unknown key", { copies: "3" }, 'unknown parameter "copies"'],
  ["replicas 4", { replicas: "4" }, "replicas must be 1, 2 or 3"],
  ["replicas 0", { replicas: "0" }, "replicas must be 1, 2 or 3"],
  [
    "replicas on kernel",
    { backend: "kernel", replicas: "2" },
    "replicas 2 requires backend spdk: the kernel nvmet backend has no RAID",
  ],
  ["spread key without replicas", { replicaTopologyKey: "zone" }, "replicaTopologyKey needs replicas 2 or 3"],
  [
    "failover bound without replicas",
    { failoverAfterSeconds: "30" },
    "failoverAfterSeconds needs replicas 2 or 3",
  ],
  [
    "failover bound too short",
    { replicas: "2", failoverAfterSeconds: "1" },
    "failoverAfterSeconds must be at least 5",
  ],
  ["failover bound not a number", { replicas: "2", failoverAfterSeconds: "soon" }, "whole number of seconds"],
  [
    "spread key not a label key",
    { replicas: "2", replicaTopologyKey: "no spaces" },
    "replicaTopologyKey must be a label key",
  ],
  ["several unknown keys", { b: "1", a: "2" }, 'unknown parameters "a", "b"'],
  ["bad backend", { backend: "ceph" }, "backend must be spdk or kernel"],
  ["bad volume manager", { volumeManager: "lvm" }, "volumeManager must be"],
  ["bad fsType", { fsType: "btrfs" }, "fsType must be one of ext4, xfs"],
  ["bad transport", { transport: "fc" }, "transport must be rdma or tcp"],
  ["port not a number", { portalPort: "http" }, "portalPort must be an integer"],
  ["port out of range", { portalPort: "70000" }, "portalPort must be <= 65535"],
  ["ctrlLossTmo not a number", { ctrlLossTmo: "soon" }, "ctrlLossTmo must be an integer"],
  ["ctrlLossTmo too small", { ctrlLossTmo: "-2" }, "ctrlLossTmo must be >= -1"],
  ["reconnectDelay zero", { reconnectDelay: "0" }, "reconnectDelay must be >= 1"],
  ["fastIoFailTmo too large", { fastIoFailTmo: "100000" }, "fastIoFailTmo must be <= 86400"],
  [
    "spdk-lvol on kernel",
    { backend: "kernel", volumeManager: "spdk-lvol" },
    "spdk-lvol requires backend spdk",
  ],
  ["parted on spdk", { volumeManager: "parted" }, "parted requires backend kernel"],
  ["bad secret name", { dhchapSecretName: "Not_A_Name" }, "dhchapSecretName must be a Secret name"],
  ["secret namespace without name", { dhchapSecretNamespace: NS }, "need dhchapSecretName"],
  ["secret in another namespace", { dhchapSecretName: "k", dhchapSecretNamespace: "other" }, `must be ${NS}`],
  ["a shared DH-CHAP Secret (generated keys replace it)", { dhchapSecretName: "k" }, "use dhchapMode"],
  ["bad dhchapMode", { dhchapMode: "mutual" }, "dhchapMode must be none, unidirectional or bidirectional"],
  ["bad dhchapHash", { dhchapMode: "unidirectional", dhchapHash: "md5" }, "dhchapHash must be sha256"],
  [
    "bad dhchapGroup",
    { dhchapMode: "bidirectional", dhchapGroup: "ffdhe1024" },
    "dhchapGroup must be one of",
  ],
  ["dhchapHash without a mode", { dhchapHash: "sha256" }, "need dhchapMode"],
  ["bad tls", { transport: "tcp", tls: "yes" }, "tls must be required or none"],
  ["tls on rdma", { tls: "required" }, "tls required needs transport tcp"],
  [
    "tls on the kernel backend",
    { backend: "kernel", volumeManager: "parted", transport: "tcp", tls: "required" },
    "not supported on backend kernel",
  ],
];

test("dhchapMode: none adds nothing; a mode fills hash and group defaults", () => {
  expect(parseParameters({ dhchapMode: "none" }, NS).params.dhchap).toBeUndefined();
  expect(parseParameters({ dhchapMode: "unidirectional" }, NS).params.dhchap).toEqual({
    mode: "unidirectional",
    hash: "sha256",
    dhgroup: "null",
  });
  expect(
    parseParameters({ dhchapMode: "bidirectional", dhchapHash: "sha512", dhchapGroup: "ffdhe3072" }, NS)
      .params.dhchap,
  ).toEqual({ mode: "bidirectional", hash: "sha512", dhgroup: "ffdhe3072" });
  expect(
    parseParameters({ backend: "kernel", volumeManager: "parted", dhchapMode: "unidirectional" }, NS).params
      .dhchap,
  ).toEqual({ mode: "unidirectional", hash: "sha256", dhgroup: "null" });
});

for (const [name, raw, says] of refusals) {
  test(`refuses: ${name}`, () => {
    let err: unknown;
    try {
      parseParameters(raw, NS);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("invalid");
    expect((err as StorageError).message).toContain(says);
  });
}

test("tls: required on tcp is recorded, none (the default) leaves it out", () => {
  expect(parseParameters({ transport: "tcp", tls: "required" }, NS).params.tls).toBe("required");
  expect(parseParameters({ transport: "tcp", tls: "none" }, NS).params.tls).toBeUndefined();
  expect(parseParameters({ transport: "tcp" }, NS).params.tls).toBeUndefined();
});
