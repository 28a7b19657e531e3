// `kubectl distort support-bundle`: everything a maintainer asks for first, in one archive or
// directory: every DISTORT object, the Kubernetes objects of DISTORT volumes (PVs, PVCs,
// StorageClasses, VolumeAttachments, CSIDriver, CSINodes), Nodes, the release namespace's Pods,
// ConfigMaps, Secrets (values redacted) and Events, Events about DISTORT objects anywhere, and
// the logs of every container of every Pod in the release namespace. What cannot be read (RBAC)
// is listed in manifest.json rather than failing the whole bundle.
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { type KindName, kinds } from "../api/kinds.ts";
import type { KubeConnection } from "../lib/kube/connection.ts";
import { DRIVER_NAME } from "../lib/volume-context.ts";
import { redactObject, scrubText, secretValues } from "./bundle-redaction.ts";
import { getText, listJson } from "./cluster.ts";
import { UsageError } from "./exit-codes.ts";
import { renderData } from "./output.ts";
import { type ArchiveFile, tarGz } from "./tar-gz.ts";

type Obj = Record<string, unknown> & {
  metadata?: { name?: string; namespace?: string };
  spec?: Record<string, unknown>;
  involvedObject?: { apiVersion?: string };
};

export interface BundleOptions {
  /** The release namespace (Pods, Secrets, ConfigMaps, Events). */
  readonly namespace: string;
  /** Lines of each container's log, newest last. */
  readonly tailLines: number;
  readonly now: Date;
}

/** What was collected; written as manifest.json. */
export interface BundleManifest {
  kind: "DistortSupportBundle";
  generatedAt: string;
  server: string;
  namespace: string;
  files: string[];
  /** Reads that failed (forbidden, not served), with the reason; the bundle is still written. */
  skipped: { what: string; reason: string }[];
}

/**
 * Reads the cluster and returns the bundle's files, every one already redacted: Secret values
 * never leave this function. Throws UsageError only when the API server cannot be reached at all.
 */
export async function collectBundle(
  conn: KubeConnection,
  opts: BundleOptions,
): Promise<{ files: ArchiveFile[]; manifest: BundleManifest }> {
  const ns = encodeURIComponent(opts.namespace);
  const skipped: BundleManifest["skipped"] = [];
  const objects = new Map<string, Obj[]>();
  let reached = false;
  const list = async (file: string, path: string, what: string, keep: (o: Obj) => boolean = () => true) => {
    try {
      const items = (await listJson<Obj>(conn, path, what)).filter(keep);
      reached = true;
      objects.set(file, items);
      return items;
    } catch (err) {
      skipped.push({ what, reason: err instanceof Error ? err.message : String(err) });
      return [];
    }
  };
  for (const name of Object.keys(kinds) as KindName[]) {
    const k = kinds[name];
    await list(`distort/${k.plural}.yaml`, `/apis/${k.group}/${k.version}/${k.plural}`, `list ${k.plural}`);
  }
  if (!reached && skipped.length > 0)
    throw new UsageError(skipped[0]?.reason ?? "cannot read the API server");
  const pvs = await list(
    "kubernetes/persistentvolumes.yaml",
    "/api/v1/persistentvolumes",
    "list persistentvolumes",
    (pv) => (pv.spec?.csi as { driver?: string } | undefined)?.driver === DRIVER_NAME,
  );
  const pvNames = new Set(pvs.map((pv) => pv.metadata?.name));
  await list(
    "kubernetes/persistentvolumeclaims.yaml",
    "/api/v1/persistentvolumeclaims",
    "list persistentvolumeclaims",
    (c) => pvNames.has(c.spec?.volumeName as string),
  );
  await list(
    "kubernetes/storageclasses.yaml",
    "/apis/storage.k8s.io/v1/storageclasses",
    "list storageclasses",
    (sc) => sc.provisioner === DRIVER_NAME,
  );
  await list(
    "kubernetes/volumeattachments.yaml",
    "/apis/storage.k8s.io/v1/volumeattachments",
    "list volumeattachments",
    (va) => va.spec?.attacher === DRIVER_NAME,
  );
  await list(
    "kubernetes/csidrivers.yaml",
    "/apis/storage.k8s.io/v1/csidrivers",
    "list csidrivers",
    (d) => d.metadata?.name === DRIVER_NAME,
  );
  await list("kubernetes/csinodes.yaml", "/apis/storage.k8s.io/v1/csinodes", "list csinodes");
  await list("kubernetes/nodes.yaml", "/api/v1/nodes", "list nodes");
  await list("kubernetes/distort-events.yaml", "/api/v1/events", "list events", (e) =>
    (e.involvedObject?.apiVersion ?? "").startsWith("storage.distort.io/"),
  );
  const pods = await list(
    `${opts.namespace}/pods.yaml`,
    `/api/v1/namespaces/${ns}/pods`,
    `list pods in ${opts.namespace}`,
  );
  await list(
    `${opts.namespace}/events.yaml`,
    `/api/v1/namespaces/${ns}/events`,
    `list events in ${opts.namespace}`,
  );
  await list(
    `${opts.namespace}/configmaps.yaml`,
    `/api/v1/namespaces/${ns}/configmaps`,
    `list configmaps in ${opts.namespace}`,
  );
  const secrets = await list(
    `${opts.namespace}/secrets.yaml`,
    `/api/v1/namespaces/${ns}/secrets`,
    `list secrets in ${opts.namespace}`,
  );
  // Secrets DISTORT objects refer to elsewhere (DH-HMAC-CHAP keys in a tenant namespace) are read
  // only to learn their values for the scrub; they are not written.
  const referenced = new Set<string>();
  for (const p of objects.get("distort/nvmepartitions.yaml") ?? []) {
    const ref = (p.spec?.targetOptions as { dhchapSecretRef?: { name?: string } } | undefined)
      ?.dhchapSecretRef;
    const pns = p.metadata?.namespace;
    if (ref?.name && pns && pns !== opts.namespace) referenced.add(`${pns}/${ref.name}`);
  }
  const extra: Obj[] = [];
  for (const key of referenced) {
    const [sns, sname] = key.split("/") as [string, string];
    try {
      const s = await listJson<Obj>(
        conn,
        `/api/v1/namespaces/${encodeURIComponent(sns)}/secrets?fieldSelector=metadata.name%3D${encodeURIComponent(sname)}`,
        `get secret ${key}`,
      );
      extra.push(...s);
    } catch {
      // Not readable: then it cannot have been read into the bundle either.
    }
  }
  const values = secretValues([...secrets, ...extra] as { data?: Record<string, string> }[]);

  const files: ArchiveFile[] = [];
  const add = (path: string, text: string) => files.push({ path, data: scrubText(text, values) });
  for (const [file, items] of objects)
    add(file, renderData({ items: items.map((o) => redactObject(o)) }, "yaml"));
  for (const pod of pods) {
    const podName = pod.metadata?.name ?? "";
    const status = (pod.status ?? {}) as {
      containerStatuses?: { name: string; restartCount?: number }[];
      initContainerStatuses?: { name: string; restartCount?: number }[];
    };
    const containers = [...(status.initContainerStatuses ?? []), ...(status.containerStatuses ?? [])];
    for (const c of containers) {
      const base = `/api/v1/namespaces/${ns}/pods/${encodeURIComponent(podName)}/log?container=${encodeURIComponent(c.name)}&tailLines=${opts.tailLines}&timestamps=true`;
      const runs: [string, string][] = [[`logs/${podName}/${c.name}.log`, base]];
      if ((c.restartCount ?? 0) > 0)
        runs.push([`logs/${podName}/${c.name}.previous.log`, `${base}&previous=true`]);
      for (const [path, url] of runs) {
        try {
          const text = await getText(conn, url, `logs of ${podName}/${c.name}`);
          if (text !== undefined) add(path, text);
        } catch (err) {
          skipped.push({
            what: `logs of ${podName}/${c.name}`,
            reason: err instanceof Error ? err.message : String(err),
          });
        }
      }
    }
  }
  const manifest: BundleManifest = {
    kind: "DistortSupportBundle",
    generatedAt: opts.now.toISOString(),
    server: conn.server,
    namespace: opts.namespace,
    files: files.map((f) => f.path).sort(),
    skipped,
  };
  add("manifest.json", renderData(manifest, "json"));
  return { files, manifest };
}

/** Writes the files under `dest`: a .tar.gz / .tgz archive (top folder `top`), else a directory. */
export function writeBundle(files: readonly ArchiveFile[], dest: string, top: string, now: Date): void {
  if (/\.(tar\.gz|tgz)$/.test(dest)) {
    mkdirSync(dirname(dest), { recursive: true });
    writeFileSync(
      dest,
      tarGz(
        files.map((f) => ({ path: `${top}/${f.path}`, data: f.data })),
        Math.floor(now.getTime() / 1000),
      ),
    );
    return;
  }
  for (const f of files) {
    const p = join(dest, f.path);
    mkdirSync(dirname(p), { recursive: true });
    writeFileSync(p, f.data);
  }
}
