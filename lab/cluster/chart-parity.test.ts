// chart-parity's comparison: document order, YAML formatting and comments are all it forgives;
// any object missing or added, any field changed, added or removed (a quoted number included),
// any value given beside the values file and the tag is reported, with where it is.
import { describe, expect, test } from "bun:test";
import {
  compareManifests,
  compareValues,
  diffValues,
  formatDifferences,
  parseManifest,
} from "./chart-parity.ts";

const SA = `# Source: distort/templates/rbac-agent.yaml
apiVersion: v1
kind: ServiceAccount
metadata:
  name: distort-agent
  namespace: distort-system
`;
const CLASS = `# Source: distort/templates/storage-classes.yaml
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: distort-lab
parameters:
  ctrlLossTmo: "120"
`;
const DS = `# Source: distort/templates/agent.yaml
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: distort-agent
  namespace: distort-system
spec:
  template:
    spec:
      containers:
        - name: agent
          image: distort.lab/agent-lab:abc
          env:
            - { name: DISTORT_REPORT_PERIOD_MS, value: "2000" }
        - name: nvmf-tgt
          image: distort.lab/agent-lab:abc
`;
const manifest = (...docs: string[]) => docs.map((d) => `---\n${d}`).join("");

describe("compareManifests", () => {
  test("the same objects in another order, formatting and comments: no difference", () => {
    const reordered = `---
apiVersion: apps/v1
kind: DaemonSet
metadata: { namespace: distort-system, name: distort-agent }
spec:
  template:
    spec:
      containers:
      - image: distort.lab/agent-lab:abc
        env: [{ value: "2000", name: DISTORT_REPORT_PERIOD_MS }]
        name: agent
      - { name: nvmf-tgt, image: "distort.lab/agent-lab:abc" }
---
# nothing here
---
${CLASS}---
${SA}`;
    expect(compareManifests(reordered, manifest(SA, CLASS, DS))).toEqual([]);
  });

  test("a changed field is reported with its path and both values", () => {
    const installed = manifest(
      SA,
      CLASS,
      DS.replace(
        "image: distort.lab/agent-lab:abc\n          env",
        "image: distort.lab/agent-lab:old\n          env",
      ),
    );
    expect(compareManifests(installed, manifest(SA, CLASS, DS))).toEqual([
      {
        kind: "changed",
        object: "apps/v1 DaemonSet distort-system/distort-agent",
        path: "spec.template.spec.containers[0].image",
        installed: "distort.lab/agent-lab:old",
        expected: "distort.lab/agent-lab:abc",
      },
    ]);
  });

  test("a field or list item only on one side counts; a quoted number is not a number", () => {
    const extraEnv = DS.replace(
      '            - { name: DISTORT_REPORT_PERIOD_MS, value: "2000" }\n',
      '            - { name: DISTORT_REPORT_PERIOD_MS, value: "2000" }\n            - { name: EXTRA, value: "x" }\n',
    );
    const d1 = compareManifests(manifest(extraEnv), manifest(DS));
    expect(d1).toEqual([
      {
        kind: "changed",
        object: "apps/v1 DaemonSet distort-system/distort-agent",
        path: "spec.template.spec.containers[0].env[1]",
        installed: { name: "EXTRA", value: "x" },
        expected: undefined,
      },
    ]);
    const unquoted = CLASS.replace('ctrlLossTmo: "120"', "ctrlLossTmo: 120");
    expect(compareManifests(manifest(unquoted), manifest(CLASS))).toEqual([
      {
        kind: "changed",
        object: "storage.k8s.io/v1 StorageClass -/distort-lab",
        path: "parameters.ctrlLossTmo",
        installed: 120,
        expected: "120",
      },
    ]);
  });

  test("objects missing from, or added to, the release; one name in two namespaces is two objects", () => {
    const otherNs = SA.replace("namespace: distort-system", "namespace: default");
    const diffs = compareManifests(manifest(SA, otherNs), manifest(SA, CLASS));
    expect(diffs).toEqual([
      { kind: "missing", object: "storage.k8s.io/v1 StorageClass -/distort-lab" },
      { kind: "extra", object: "v1 ServiceAccount default/distort-agent" },
    ]);
    expect(formatDifferences(diffs)).toBe(
      "missing from the release: storage.k8s.io/v1 StorageClass -/distort-lab\n" +
        "not rendered by the chart: v1 ServiceAccount default/distort-agent",
    );
  });

  test("a document twice is reported; so is a manifest that is not a list of objects", () => {
    expect(compareManifests(manifest(SA, SA), manifest(SA))).toEqual([
      { kind: "duplicate", object: "v1 ServiceAccount distort-system/distort-agent", in: "installed" },
    ]);
    expect(() => parseManifest("---\n- a\n- b\n")).toThrow("not an object");
    expect(() => parseManifest("---\nkind: [unclosed\n")).toThrow("does not parse");
    expect(parseManifest("").objects.size).toBe(0);
  });
});

describe("fields the chart generates at install", () => {
  const SECRET = `# Source: distort/templates/snapshot-metadata.yaml
apiVersion: v1
kind: Secret
metadata:
  name: distort-csi-snapshot-metadata-tls
  namespace: distort-system
  annotations:
    storage.distort.io/generated-fields: data.ca.crt,data.tls.crt,data.tls.key
type: kubernetes.io/tls
data:
  ca.crt: Q0EtMQ==
  tls.crt: Q0VSVC0x
  tls.key: S0VZLTE=
`;

  test("another generated value is no difference; an ungenerated field still is", () => {
    const regenerated = SECRET.replace("Q0EtMQ==", "Q0EtMg==").replace("S0VZLTE=", "S0VZLTI=");
    expect(compareManifests(manifest(SECRET), manifest(regenerated))).toEqual([]);
    const retyped = SECRET.replace("type: kubernetes.io/tls", "type: Opaque");
    expect(compareManifests(manifest(retyped), manifest(SECRET))).toEqual([
      {
        kind: "changed",
        object: "v1 Secret distort-system/distort-csi-snapshot-metadata-tls",
        path: "type",
        installed: "Opaque",
        expected: "kubernetes.io/tls",
      },
    ]);
  });

  test("a generated field missing or empty on one side is a difference", () => {
    const emptied = SECRET.replace("  tls.key: S0VZLTE=\n", '  tls.key: ""\n');
    expect(compareManifests(manifest(emptied), manifest(SECRET))).toEqual([
      {
        kind: "changed",
        object: "v1 Secret distort-system/distort-csi-snapshot-metadata-tls",
        path: "data.tls.key",
        installed: "",
        expected: "S0VZLTE=",
      },
    ]);
    const dropped = SECRET.replace("  tls.crt: Q0VSVC0x\n", "");
    expect(
      compareManifests(manifest(dropped), manifest(SECRET)).map((d) => d.kind === "changed" && d.path),
    ).toEqual(["data.tls.crt"]);
  });
});

describe("compareValues", () => {
  const file = {
    images: { pullPolicy: "Never", agent: { repository: "distort.lab/agent-lab", tag: "" } },
    dpu: { enabled: false },
  };

  test("the file plus the tag, and nothing else, is the same", () => {
    const installed = {
      dpu: { enabled: false },
      images: { agent: { tag: "", repository: "distort.lab/agent-lab" }, tag: "abc", pullPolicy: "Never" },
    };
    expect(compareValues(installed, file, "abc")).toEqual([]);
  });

  test("another tag, an extra --set or a value dropped is a difference", () => {
    const installed = {
      images: { agent: { repository: "distort.lab/agent-lab", tag: "" }, tag: "old", pullPolicy: "Never" },
      manager: { replicas: 1 },
    };
    expect(compareValues(installed, file, "abc")).toEqual([
      { kind: "value", path: "dpu", installed: undefined, expected: { enabled: false } },
      { kind: "value", path: "images.tag", installed: "old", expected: "abc" },
      { kind: "value", path: "manager", installed: { replicas: 1 }, expected: undefined },
    ]);
    // A release installed with no values at all (helm prints null).
    expect(compareValues(null, file, "abc").map((d) => d.kind === "value" && d.path)).toEqual([
      "dpu",
      "images",
    ]);
  });
});

describe("diffValues", () => {
  test("leaves by path, lists by index", () => {
    expect(diffValues({ a: [1, { b: 2 }], c: "x" }, { a: [1, { b: 3 }, 4], c: "x" })).toEqual([
      ["a[1].b", 2, 3],
      ["a[2]", undefined, 4],
    ]);
    expect(diffValues({ a: null }, { a: null })).toEqual([]);
    expect(diffValues({ a: [] }, { a: {} })).toEqual([["a", [], {}]]);
  });
});
