// Whether the release the lab installed is exactly helm/distort with the lab's values file and the
// image tag: the installed manifest (`helm get manifest`) against `helm template` of the chart,
// object by object, and the release's user-supplied values (`helm get values`) against the file
// plus the tag. Only what YAML leaves free is normalised: document order, formatting, comments;
// and the fields the chart generates at install (GENERATED_FIELDS_ANNOTATION) are checked for
// presence, not value.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parse, parseAllDocuments } from "yaml";
import { CHART_DIR, runHelm } from "../../helm/chart-support.ts";

/** The lab's values file, relative to the chart directory. */
export const LAB_CLUSTER_VALUES = "examples/lab-cluster.yaml";

/** One way the installed release differs from what the chart renders. */
export type ParityDifference =
  /** Rendered by the chart, absent from the release. */
  | { kind: "missing"; object: string }
  /** In the release, not rendered by the chart. */
  | { kind: "extra"; object: string }
  /** Two documents with one identity in the same manifest. */
  | { kind: "duplicate"; object: string; in: "installed" | "expected" }
  /** A field (dotted path, [i] for list items; "" for the whole document) with different values. */
  | { kind: "changed"; object: string; path: string; installed: unknown; expected: unknown }
  /** A user-supplied value of the release that the values file and the tag do not give. */
  | { kind: "value"; path: string; installed: unknown; expected: unknown };

/**
 * Annotation by which the chart names fields it generates at install and keeps through upgrades
 * (helm genCA/genSignedCert behind lookup: the snapshot metadata TLS Secret and the CA in the
 * SnapshotMetadataService): comma-separated dotted paths, as diffValues spells them. A fresh
 * `helm template` cannot reproduce their values, so such a field is a difference only when one
 * side lacks it or holds an empty or non-string value.
 */
export const GENERATED_FIELDS_ANNOTATION = "storage.distort.io/generated-fields";

type Obj = Record<string, unknown>;
const isObj = (x: unknown): x is Obj => typeof x === "object" && x !== null && !Array.isArray(x);

/** "<apiVersion> <kind> <namespace>/<name>" ("-" for no namespace): the identity helm tracks. */
function identity(doc: Obj): string {
  const meta = isObj(doc.metadata) ? doc.metadata : {};
  const ns = typeof meta.namespace === "string" ? meta.namespace : "-";
  return `${String(doc.apiVersion)} ${String(doc.kind)} ${ns}/${String(meta.name)}`;
}

/**
 * The objects of a multi-document manifest by identity; empty documents are skipped. Throws on
 * YAML that does not parse or a document that is not a mapping.
 */
export function parseManifest(text: string): { objects: Map<string, Obj>; duplicates: string[] } {
  const objects = new Map<string, Obj>();
  const duplicates: string[] = [];
  for (const d of parseAllDocuments(text)) {
    if (d.errors.length > 0) throw new Error(`manifest does not parse: ${d.errors[0]?.message}`);
    const value: unknown = d.toJS();
    if (value === null || value === undefined) continue;
    if (!isObj(value)) throw new Error(`manifest document is not an object: ${JSON.stringify(value)}`);
    const id = identity(value);
    if (objects.has(id)) duplicates.push(id);
    objects.set(id, value);
  }
  return { objects, duplicates };
}

/** Every leaf where `a` and `b` differ, as [path, a, b]; a key present on one side only counts. */
export function diffValues(a: unknown, b: unknown, path = ""): [string, unknown, unknown][] {
  if (Array.isArray(a) && Array.isArray(b)) {
    const out: [string, unknown, unknown][] = [];
    for (let i = 0; i < Math.max(a.length, b.length); i++)
      out.push(...diffValues(a[i], b[i], `${path}[${i}]`));
    return out;
  }
  if (isObj(a) && isObj(b)) {
    const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort();
    return keys.flatMap((k) => diffValues(a[k], b[k], path ? `${path}.${k}` : k));
  }
  return Object.is(a, b) ? [] : [[path, a, b]];
}

function generatedFields(doc: Obj): Set<string> {
  const meta = isObj(doc.metadata) ? doc.metadata : {};
  const annotations = isObj(meta.annotations) ? meta.annotations : {};
  const list = annotations[GENERATED_FIELDS_ANNOTATION];
  if (typeof list !== "string") return new Set();
  return new Set(
    list
      .split(",")
      .map((p) => p.trim())
      .filter((p) => p !== ""),
  );
}

const nonEmptyString = (x: unknown): boolean => typeof x === "string" && x !== "";

/** Compares an installed manifest with the expected render. Empty when they are the same objects. */
export function compareManifests(installed: string, expected: string): ParityDifference[] {
  const got = parseManifest(installed);
  const want = parseManifest(expected);
  const out: ParityDifference[] = [
    ...got.duplicates.map((object) => ({ kind: "duplicate" as const, object, in: "installed" as const })),
    ...want.duplicates.map((object) => ({ kind: "duplicate" as const, object, in: "expected" as const })),
  ];
  for (const [id, w] of want.objects) {
    const g = got.objects.get(id);
    if (!g) {
      out.push({ kind: "missing", object: id });
      continue;
    }
    const generated = generatedFields(w);
    for (const [path, a, b] of diffValues(g, w)) {
      if (generated.has(path) && nonEmptyString(a) && nonEmptyString(b)) continue;
      out.push({ kind: "changed", object: id, path, installed: a, expected: b });
    }
  }
  for (const id of got.objects.keys()) if (!want.objects.has(id)) out.push({ kind: "extra", object: id });
  return out;
}

/**
 * Compares a release's user-supplied values (`helm get values -o json`) with the values file's
 * content plus `images.tag`: anything else given at install (another --set, another -f) is a
 * difference even when it happens to render the same.
 */
export function compareValues(installed: unknown, valuesFile: unknown, tag: string): ParityDifference[] {
  const file = isObj(valuesFile) ? valuesFile : {};
  const images = isObj(file.images) ? file.images : {};
  const expected = { ...file, images: { ...images, tag } };
  return diffValues(installed ?? {}, expected).map(([path, a, b]) => ({
    kind: "value" as const,
    path,
    installed: a,
    expected: b,
  }));
}

function lineOf(d: ParityDifference): string {
  switch (d.kind) {
    case "missing":
      return `missing from the release: ${d.object}`;
    case "extra":
      return `not rendered by the chart: ${d.object}`;
    case "duplicate":
      return `twice in the ${d.in} manifest: ${d.object}`;
    case "changed":
      return `${d.object} ${d.path || "(document)"}: installed ${JSON.stringify(d.installed)}, chart ${JSON.stringify(d.expected)}`;
    case "value":
      return `value ${d.path}: installed ${JSON.stringify(d.installed)}, expected ${JSON.stringify(d.expected)}`;
  }
}

/** One line per difference, for a test failure message. */
export function formatDifferences(diffs: readonly ParityDifference[]): string {
  return diffs.map(lineOf).join("\n");
}

export interface ChartParityOptions {
  /** The helm binary (lab/cluster/helm-tool.ts ensureHelm). */
  helm: string;
  kubeconfig: string;
  release: string;
  namespace: string;
  /** The image tag the lab installed with (`--set-string images.tag=<tag>`). */
  tag: string;
  /** The values file, relative to the chart directory; default LAB_CLUSTER_VALUES. */
  valuesFile?: string;
}

async function helmOut(helm: string, args: string[], what: string): Promise<string> {
  const r = await runHelm(helm, args);
  if (r.code !== 0) throw new Error(`${what} failed (exit ${r.code}): ${r.stderr.trim()}`);
  return r.stdout;
}

/**
 * The differences between the installed release and helm/distort rendered with the lab's values
 * file and tag (empty: the lab installed exactly the chart). Throws when helm cannot read the
 * release or render the chart.
 */
export async function chartParity(o: ChartParityOptions): Promise<ParityDifference[]> {
  const valuesFile = join(CHART_DIR, o.valuesFile ?? LAB_CLUSTER_VALUES);
  const cluster = ["--kubeconfig", o.kubeconfig, "--namespace", o.namespace];
  const [installed, values, expected] = await Promise.all([
    helmOut(o.helm, ["get", "manifest", o.release, ...cluster], "helm get manifest"),
    helmOut(o.helm, ["get", "values", o.release, "--output", "json", ...cluster], "helm get values"),
    helmOut(
      o.helm,
      [
        "template",
        o.release,
        CHART_DIR,
        "--namespace",
        o.namespace,
        "-f",
        valuesFile,
        "--set-string",
        `images.tag=${o.tag}`,
      ],
      "helm template",
    ),
  ]);
  return [
    ...compareManifests(installed, expected),
    ...compareValues(JSON.parse(values), parse(readFileSync(valuesFile, "utf8")), o.tag),
  ];
}
