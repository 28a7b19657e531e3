// The orphan verdict: only a claim-annotated, unbound, unattached partition past the grace period
// whose claim is missing, deleting or replaced is deleted; every doubt keeps it.
import { describe, expect, test } from "bun:test";
import { API_VERSION, type NVMePartition } from "../../api/index.ts";
import { Annotations, PROVISIONED_BY, PROVISIONED_BY_LABEL } from "./fingerprint.ts";
import { claimOf, decideOrphan, type OrphanFacts, preliminaryVerdict, pvNameOf } from "./orphans.ts";

const CLAIM_UID = "0f8fad5b-d9cb-469f-a165-70867728950e";
const OTHER_UID = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
const PV = `pvc-${CLAIM_UID}`;
const CREATED = Date.parse("2024-05-01T10:00:00Z");
const GRACE = 120_000;

function partition(
  over: {
    annotations?: Record<string, string>;
    labels?: Record<string, string>;
    deleting?: boolean;
    created?: string;
  } = {},
) {
  const p: NVMePartition = {
    apiVersion: API_VERSION,
    kind: "NVMePartition",
    metadata: {
      name: PV,
      namespace: "distort-system",
      uid: "6d1f7c1e-0000-4000-8000-000000000002",
      creationTimestamp: over.created ?? "2024-05-01T10:00:00Z",
      labels: over.labels ?? { [PROVISIONED_BY_LABEL]: PROVISIONED_BY },
      annotations: over.annotations ?? {
        [Annotations.requestName]: PV,
        [Annotations.pvcName]: "data",
        [Annotations.pvcNamespace]: "app",
        [Annotations.pvName]: PV,
      },
      ...(over.deleting ? { deletionTimestamp: "2024-05-01T10:05:00Z" } : {}),
    },
    spec: { sizeBytes: 4 * 1024 * 1024, backend: "spdk", volumeManager: "spdk-lvol" },
  };
  return p;
}

const facts = (over: Partial<OrphanFacts> = {}): OrphanFacts => ({
  claim: { exists: false },
  hasPersistentVolume: false,
  attached: false,
  now: CREATED + GRACE,
  graceMs: GRACE,
  ...over,
});

describe("claimOf", () => {
  test("reads the claim and the UID encoded in the PV name", () => {
    expect(claimOf(partition())).toEqual({ namespace: "app", name: "data", uid: CLAIM_UID });
    expect(pvNameOf(partition())).toBe(PV);
  });

  test("falls back to the request name for the UID; no UUID there means no UID", () => {
    const noPv = partition({
      annotations: {
        [Annotations.requestName]: PV,
        [Annotations.pvcName]: "d",
        [Annotations.pvcNamespace]: "n",
      },
    });
    expect(claimOf(noPv)?.uid).toBe(CLAIM_UID);
    expect(pvNameOf(noPv)).toBe(PV);
    const odd = partition({
      annotations: {
        [Annotations.requestName]: "vol-1",
        [Annotations.pvcName]: "d",
        [Annotations.pvcNamespace]: "n",
      },
    });
    expect(claimOf(odd)).toEqual({ namespace: "n", name: "d" });
  });

  test("needs both claim annotations", () => {
    expect(claimOf(partition({ annotations: {} }))).toBeUndefined();
    expect(claimOf(partition({ annotations: { [Annotations.pvcName]: "d" } }))).toBeUndefined();
    expect(claimOf(partition({ annotations: { [Annotations.pvcNamespace]: "n" } }))).toBeUndefined();
  });
});

describe("decideOrphan", () => {
  test("a missing claim, no PV, past the grace period: delete, naming the claim", () => {
    const v = decideOrphan(partition(), facts());
    expect(v.action).toBe("delete");
    expect(v.reason).toBe(`PersistentVolumeClaim app/data (uid ${CLAIM_UID}) no longer exists`);
  });

  test("a claim being deleted, or replaced by a same-named claim with another UID: delete", () => {
    const deleting = decideOrphan(
      partition(),
      facts({ claim: { exists: true, uid: CLAIM_UID, deleting: true } }),
    );
    expect(deleting).toMatchObject({ action: "delete", reason: expect.stringContaining("is being deleted") });
    const replaced = decideOrphan(
      partition(),
      facts({ claim: { exists: true, uid: OTHER_UID, deleting: false } }),
    );
    expect(replaced).toMatchObject({
      action: "delete",
      reason: expect.stringContaining(`now is uid ${OTHER_UID}`),
    });
  });

  test("the claim with the encoded UID exists: keep", () => {
    expect(
      decideOrphan(partition(), facts({ claim: { exists: true, uid: CLAIM_UID, deleting: false } })),
    ).toEqual({
      action: "keep",
      reason: "its claim exists",
    });
  });

  test("without an encoded UID only a missing or deleting claim condemns it", () => {
    const p = partition({
      annotations: {
        [Annotations.requestName]: "vol-1",
        [Annotations.pvcName]: "d",
        [Annotations.pvcNamespace]: "n",
      },
    });
    expect(decideOrphan(p, facts({ claim: { exists: true, uid: OTHER_UID, deleting: false } })).action).toBe(
      "keep",
    );
    expect(decideOrphan(p, facts()).action).toBe("delete");
  });

  test("a PV or an attachment keeps it whatever the claim", () => {
    expect(decideOrphan(partition(), facts({ hasPersistentVolume: true }))).toEqual({
      action: "keep",
      reason: "a PersistentVolume refers to it",
    });
    expect(decideOrphan(partition(), facts({ attached: true })).action).toBe("keep");
  });

  test("no claim annotations (csi-sanity, direct CSI users): keep", () => {
    expect(decideOrphan(partition({ annotations: { [Annotations.requestName]: PV } }), facts())).toEqual({
      action: "keep",
      reason: "no claim annotations",
    });
  });

  test("younger than the grace period, an unreadable timestamp, or already deleting: keep", () => {
    expect(decideOrphan(partition(), facts({ now: CREATED + GRACE - 1 })).reason).toBe(
      "younger than the grace period",
    );
    expect(decideOrphan(partition({ created: "" }), facts()).action).toBe("keep");
    expect(decideOrphan(partition({ deleting: true }), facts()).reason).toBe("already being deleted");
    expect(decideOrphan(partition(), facts({ now: CREATED, graceMs: 0 })).action).toBe("delete");
  });

  test("preliminaryVerdict asks for lookups only when they can matter", () => {
    expect(preliminaryVerdict(partition(), CREATED + GRACE, GRACE)).toBeUndefined();
    expect(preliminaryVerdict(partition(), CREATED, GRACE)?.action).toBe("keep");
    expect(preliminaryVerdict(partition({ annotations: {} }), CREATED + GRACE, GRACE)?.action).toBe("keep");
  });
});

describe("only what the CSI controller made", () => {
  test("a claim-annotated partition without the provisioned-by label is kept, however orphaned", () => {
    for (const labels of [{}, { [PROVISIONED_BY_LABEL]: "someone-else" }] as Record<string, string>[]) {
      const p = partition({ labels });
      expect(preliminaryVerdict(p, CREATED + GRACE, GRACE)?.action).toBe("keep");
      expect(decideOrphan(p, facts()).action).toBe("keep");
    }
  });

  test("a labelled partition without the CreateVolume name annotation is kept", () => {
    const p = partition({
      annotations: { [Annotations.pvcName]: "data", [Annotations.pvcNamespace]: "app" },
    });
    expect(decideOrphan(p, facts()).action).toBe("keep");
  });

  test("the same partition with the label is collected", () => {
    expect(decideOrphan(partition(), facts()).action).toBe("delete");
  });
});
