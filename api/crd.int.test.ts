// The generated CRDs in a real kube-apiserver: every one is Established and serves a valid object
// with its status, and every validation rule rejects a violating create or update with a message
// that names the field.

import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import * as k8s from "@kubernetes/client-node";
import { readCrds } from "../lab/cluster/crds.ts";
import { type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { StorageError } from "../lib/errors.ts";
import { type KubeObject, ResourceClient } from "../lib/kube/resource.ts";
import {
  exampleNVMeDevice,
  exampleNVMeDeviceClaim,
  exampleNVMePartition,
  exampleNVMeSnapshot,
  exampleNVMeVolumeAttachment,
  exampleRDMAStorageNode,
} from "./examples.ts";
import { type KindName, kinds } from "./kinds.ts";

let tc: TestCluster;
let ns: string;
let seq = 0;
beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("crd");
}, 300_000);
afterAll(async () => {
  await tc?.stop();
});

type Obj = KubeObject & { spec: Record<string, unknown>; status?: Record<string, unknown> };
const EXAMPLES: Record<KindName, () => Obj> = {
  NVMeDevice: exampleNVMeDevice as () => Obj,
  NVMeDeviceClaim: exampleNVMeDeviceClaim as () => Obj,
  NVMePartition: exampleNVMePartition as () => Obj,
  NVMeSnapshot: exampleNVMeSnapshot as () => Obj,
  NVMeVolumeAttachment: exampleNVMeVolumeAttachment as () => Obj,
  RDMAStorageNode: exampleRDMAStorageNode as () => Obj,
};

function client(kind: KindName): ResourceClient<Obj> {
  return new ResourceClient(tc.conn, kinds[kind] as never);
}

/** A fresh copy of the kind's example with a unique name and no server-owned metadata. */
function fresh(kind: KindName): Obj {
  const ex = EXAMPLES[kind]();
  const scoped = kinds[kind].scope === "Namespaced";
  return {
    ...ex,
    metadata: { name: `${kind.toLowerCase()}-${++seq}`, ...(scoped ? { namespace: ns } : {}) },
  };
}

/** Creates the object (spec only) then writes its status; returns what the server stored. */
async function createWithStatus(kind: KindName, obj: Obj): Promise<Obj> {
  const c = client(kind);
  const { status, ...rest } = obj;
  const created = await c.create(rest as Obj);
  return status ? c.replaceStatus({ ...created, status }) : created;
}

async function rejection(p: Promise<unknown>): Promise<StorageError> {
  const err = await p.then(
    () => undefined,
    (e) => e,
  );
  if (!(err instanceof StorageError)) throw new Error(`expected a rejection, got ${err ?? "success"}`);
  return err;
}

test("every CRD is Established with its names accepted", async () => {
  const api = tc.conn.api(k8s.ApiextensionsV1Api);
  const files = readCrds();
  expect(files.map((c) => c.spec.names.kind).sort()).toEqual(Object.keys(kinds).sort());
  for (const crd of files) {
    const live = await api.readCustomResourceDefinition({ name: crd.metadata?.name as string });
    const conds = Object.fromEntries((live.status?.conditions ?? []).map((c) => [c.type, c.status]));
    expect(conds).toMatchObject({ Established: "True", NamesAccepted: "True" });
    expect(live.status?.acceptedNames?.kind).toBe(crd.spec.names.kind);
    // The stored schema is the generated one, CEL rules and enums included (nothing dropped on the way).
    const raw = (await (
      await tc.conn.request(`/apis/apiextensions.k8s.io/v1/customresourcedefinitions/${crd.metadata?.name}`)
    ).json()) as {
      spec: { versions: { schema: unknown }[] };
    };
    expect(raw.spec.versions.map((v) => v.schema)).toEqual(crd.spec.versions.map((v) => v.schema));
  }
});

describe("a valid example of each kind is accepted, status included", () => {
  for (const kind of Object.keys(kinds) as KindName[]) {
    test(kind, async () => {
      const stored = await createWithStatus(kind, fresh(kind));
      expect(stored.status).toBeDefined();
      // The status subresource keeps spec and status writes apart.
      const c = client(kind);
      const viaMain = await c.replace({ ...stored, status: undefined } as Obj);
      expect(viaMain.status).toEqual(stored.status);
    });
  }
});

interface CreateCase {
  kind: KindName;
  name: string;
  mutate(o: Obj): void;
  /** Substrings the server's message must contain: the field path, and the rule's wording. */
  expect: string[];
}

const CREATE_CASES: CreateCase[] = [
  {
    kind: "NVMeDeviceClaim",
    name: "empty serial",
    mutate: (o) => {
      o.spec.serial = "";
    },
    expect: ["spec.serial"],
  },
  {
    kind: "NVMePartition",
    name: "zero size",
    mutate: (o) => {
      o.spec.sizeBytes = 0;
    },
    expect: ["spec.sizeBytes"],
  },
  {
    kind: "NVMePartition",
    name: "negative size",
    mutate: (o) => {
      o.spec.sizeBytes = -4096;
    },
    expect: ["spec.sizeBytes"],
  },
  {
    kind: "NVMePartition",
    name: "unknown backend",
    mutate: (o) => {
      o.spec.backend = "ceph";
    },
    expect: ["spec.backend", "Unsupported value"],
  },
  {
    kind: "NVMePartition",
    name: "unknown volume manager",
    mutate: (o) => {
      o.spec.volumeManager = "lvm";
    },
    expect: ["spec.volumeManager", "Unsupported value"],
  },
  {
    kind: "NVMePartition",
    name: "spdk-lvol on the kernel backend",
    mutate: (o) => {
      o.spec.backend = "kernel";
      o.spec.volumeManager = "spdk-lvol";
      o.spec.targetOptions = { transport: "rdma" };
    },
    expect: ["spec.volumeManager spdk-lvol requires spec.backend spdk"],
  },
  {
    kind: "NVMePartition",
    name: "parted on the spdk backend",
    mutate: (o) => {
      o.spec.volumeManager = "parted";
    },
    expect: ["spec.volumeManager parted requires spec.backend kernel"],
  },
  {
    kind: "NVMePartition",
    name: "node without device serial",
    mutate: (o) => {
      delete o.spec.deviceSerial;
    },
    expect: ["spec.nodeName and spec.deviceSerial must be set together"],
  },
  {
    kind: "NVMePartition",
    name: "core mask on the kernel backend",
    mutate: (o) => {
      o.spec.backend = "kernel";
    },
    expect: ["spec.targetOptions.coreMask requires spec.backend spdk"],
  },
  {
    kind: "NVMePartition",
    name: "unknown transport",
    mutate: (o) => {
      o.spec.targetOptions = { transport: "fc" };
    },
    expect: ["spec.targetOptions.transport", "Unsupported value"],
  },
  {
    kind: "NVMePartition",
    name: "portal port out of range",
    mutate: (o) => {
      o.spec.targetOptions = { transport: "tcp", portalPort: 70000 };
    },
    expect: ["spec.targetOptions.portalPort"],
  },
  {
    kind: "NVMePartition",
    name: "IOPS limit not a multiple of 1000",
    mutate: (o) => {
      o.spec.qos = { rwIosPerSec: 1500 };
    },
    expect: ["spec.qos.rwIosPerSec must be a multiple of 1000"],
  },
  {
    kind: "NVMePartition",
    name: "QoS on the kernel backend",
    mutate: (o) => {
      o.spec.backend = "kernel";
      o.spec.volumeManager = "parted";
      o.spec.qos = { rMBytesPerSec: 10 };
    },
    expect: ["spec.qos requires spec.backend spdk"],
  },
  {
    kind: "NVMePartition",
    name: "thin on the kernel backend",
    mutate: (o) => {
      o.spec.backend = "kernel";
      o.spec.volumeManager = "parted";
      o.spec.thinProvisioning = true;
    },
    expect: ["spec.thinProvisioning requires spec.backend spdk"],
  },
  {
    kind: "NVMeDeviceClaim",
    name: "overcommit ratio below 1",
    mutate: (o) => {
      o.spec.overcommitRatio = 0.5;
    },
    expect: ["spec.overcommitRatio"],
  },
  {
    kind: "NVMeDevice",
    name: "empty device serial",
    mutate: (o) => {
      o.spec.serial = "";
    },
    expect: ["spec.serial"],
  },
  {
    kind: "NVMeDevice",
    name: "malformed PCI address",
    mutate: (o) => {
      o.spec.pciAddress = "3b:00";
    },
    expect: ["spec.pciAddress"],
  },
  {
    kind: "NVMeDevice",
    name: "zero capacity",
    mutate: (o) => {
      o.spec.allocatableBytes = 0;
    },
    expect: ["spec.allocatableBytes"],
  },
  {
    kind: "NVMeVolumeAttachment",
    name: "host NQN not an NQN",
    mutate: (o) => {
      o.spec.hostNQN = "node-b";
    },
    expect: ["spec.hostNQN"],
  },
  {
    kind: "NVMeVolumeAttachment",
    name: "empty attachment id",
    mutate: (o) => {
      o.spec.attachmentId = "";
    },
    expect: ["spec.attachmentId"],
  },
];

describe("create-time validation", () => {
  for (const c of CREATE_CASES) {
    test(`${c.kind}: ${c.name}`, async () => {
      const obj = fresh(c.kind);
      delete obj.status;
      c.mutate(obj);
      const err = await rejection(client(c.kind).create(obj));
      expect(err.kind).toBe("invalid");
      for (const s of c.expect) expect(err.message).toContain(s);
    });
  }
});

interface UpdateCase {
  kind: KindName;
  name: string;
  /** Which write: the main resource (spec) or the status subresource. */
  via: "spec" | "status";
  mutate(o: Obj): void;
  expect: string;
}

const UPDATE_CASES: UpdateCase[] = [
  {
    kind: "NVMeDeviceClaim",
    name: "serial changed",
    via: "spec",
    mutate: (o) => {
      o.spec.serial = "OTHER";
    },
    expect: "spec.serial is immutable",
  },
  {
    kind: "NVMeDevice",
    name: "serial changed",
    via: "spec",
    mutate: (o) => {
      o.spec.serial = "OTHER";
    },
    expect: "spec.serial is immutable",
  },
  {
    kind: "NVMeDevice",
    name: "node changed",
    via: "spec",
    mutate: (o) => {
      o.spec.nodeName = "node-z";
    },
    expect: "spec.nodeName is immutable",
  },
  {
    kind: "NVMePartition",
    name: "backend changed",
    via: "spec",
    mutate: (o) => {
      o.spec.backend = "kernel";
    },
    expect: "spec.backend is immutable",
  },
  {
    kind: "NVMePartition",
    name: "volume manager changed",
    via: "spec",
    mutate: (o) => {
      o.spec.volumeManager = "spdk-lvol";
    },
    expect: "spec.volumeManager is immutable",
  },
  {
    kind: "NVMePartition",
    name: "node moved",
    via: "spec",
    mutate: (o) => {
      o.spec.nodeName = "node-z";
    },
    expect: "spec.nodeName is immutable once set",
  },
  {
    kind: "NVMePartition",
    name: "placement cleared",
    via: "spec",
    mutate: (o) => {
      delete o.spec.nodeName;
      delete o.spec.deviceSerial;
    },
    expect: "spec.nodeName is immutable once set",
  },
  {
    kind: "NVMePartition",
    name: "device serial changed",
    via: "spec",
    mutate: (o) => {
      o.spec.deviceSerial = "OTHER";
    },
    expect: "spec.deviceSerial is immutable once set",
  },
  {
    kind: "NVMePartition",
    name: "size shrunk",
    via: "spec",
    mutate: (o) => {
      o.spec.sizeBytes = (o.spec.sizeBytes as number) - 4 * 1024 * 1024;
    },
    expect: "spec.sizeBytes may not shrink",
  },
  {
    kind: "NVMePartition",
    name: "target options changed",
    via: "spec",
    mutate: (o) => {
      o.spec.targetOptions = { transport: "tcp" };
    },
    expect: "spec.targetOptions is immutable",
  },
  {
    kind: "NVMePartition",
    name: "thick made thin",
    via: "spec",
    mutate: (o) => {
      o.spec.thinProvisioning = true;
    },
    expect: "spec.thinProvisioning is immutable",
  },
  {
    kind: "NVMeVolumeAttachment",
    name: "partition name changed",
    via: "spec",
    mutate: (o) => {
      o.spec.partitionName = "other";
    },
    expect: "spec.partitionName is immutable",
  },
  {
    kind: "NVMeVolumeAttachment",
    name: "partition UID changed",
    via: "spec",
    mutate: (o) => {
      o.spec.partitionUID = "11111111-1111-4111-8111-111111111111";
    },
    expect: "spec.partitionUID is immutable",
  },
  {
    kind: "RDMAStorageNode",
    name: "node changed",
    via: "spec",
    mutate: (o) => {
      o.spec.nodeName = "node-z";
    },
    expect: "spec.nodeName is immutable",
  },
  {
    kind: "NVMePartition",
    name: "external id changed",
    via: "status",
    mutate: (o) => {
      (o.status as Record<string, unknown>).externalId = "vol-other";
    },
    expect: "status.externalId is immutable once set",
  },
  {
    kind: "NVMePartition",
    name: "volume handle dropped",
    via: "status",
    mutate: (o) => {
      delete (o.status as Record<string, unknown>).volumeHandle;
    },
    expect: "status.volumeHandle is immutable once set",
  },
  {
    kind: "NVMePartition",
    name: "portal IP not an IP",
    via: "status",
    mutate: (o) => {
      (o.status as Record<string, unknown>).portalIP = "storage-a";
    },
    expect: "status.portalIP must be an IPv4 or IPv6 address",
  },
  {
    kind: "NVMeDevice",
    name: "claimed without claimRef",
    via: "status",
    mutate: (o) => {
      delete (o.status as Record<string, unknown>).claimRef;
    },
    expect: "status.claimRef is required when status.phase is Claimed",
  },
  {
    kind: "RDMAStorageNode",
    name: "RDMA IP not an IP",
    via: "status",
    mutate: (o) => {
      (o.status as Record<string, unknown>).rdmaIP = "999.1.1.1";
    },
    expect: "status.rdmaIP must be an IPv4 or IPv6 address",
  },
];

describe("update-time validation (immutability and status rules)", () => {
  for (const c of UPDATE_CASES) {
    test(`${c.kind}: ${c.name}`, async () => {
      const stored = await createWithStatus(c.kind, fresh(c.kind));
      const next = structuredClone(stored);
      c.mutate(next);
      const cl = client(c.kind);
      const err = await rejection(c.via === "spec" ? cl.replace(next) : cl.replaceStatus(next));
      expect(err.kind).toBe("invalid");
      expect(err.message).toContain(c.expect);
      // The rejected write changed nothing.
      const after = await cl.get(stored.metadata.name, stored.metadata.namespace);
      expect(after?.metadata.resourceVersion).toBe(stored.metadata.resourceVersion);
    });
  }
});
