// Typed access to one custom resource kind through client-node's CustomObjectsApi: every object
// read from the server is parsed with the kind's valibot schema, and every API failure becomes a
// StorageError with a kind the caller can act on (not-found, conflict, already-exists, invalid).
import * as k8s from "@kubernetes/client-node";
import * as v from "valibot";
import { StorageError } from "../errors.ts";
import type { KubeConnection } from "./connection.ts";

/** The minimum every Kubernetes object carries; the kinds' schemas refine it. */
export interface KubeObject {
  apiVersion: string;
  kind: string;
  metadata: {
    name: string;
    namespace?: string;
    uid?: string;
    resourceVersion?: string;
    generation?: number;
    deletionTimestamp?: string;
    finalizers?: string[];
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    [k: string]: unknown;
  };
}

/** What lib/kube needs to know about a kind; api/kinds.ts entries satisfy it. */
export interface ResourceKind<T extends KubeObject = KubeObject> {
  group: string;
  version: string;
  kind: string;
  plural: string;
  scope: "Namespaced" | "Cluster";
  schema: v.GenericSchema<unknown, T>;
}

/** Cache and queue key of an object: "namespace/name", or "name" when cluster-scoped. */
export function objectKey(meta: { name: string; namespace?: string }): string {
  return meta.namespace ? `${meta.namespace}/${meta.name}` : meta.name;
}

export function splitKey(key: string): { namespace?: string; name: string } {
  const i = key.indexOf("/");
  return i < 0 ? { name: key } : { namespace: key.slice(0, i), name: key.slice(i + 1) };
}

interface StatusBody {
  message?: string;
  reason?: string;
  details?: { causes?: { field?: string; message?: string }[] };
}

/** Maps a client-node failure to a StorageError, keeping the server's message (it names fields). */
export function kubeError(err: unknown, what: string): StorageError {
  if (err instanceof StorageError) return err;
  if (err instanceof k8s.ApiException) {
    let body: StatusBody = {};
    try {
      body = typeof err.body === "string" ? (JSON.parse(err.body) as StatusBody) : (err.body as StatusBody);
    } catch {
      body = { message: String(err.body) };
    }
    const msg = `${what}: ${body?.message ?? err.message}`;
    const details = { status: err.code, reason: body?.reason, causes: body?.details?.causes };
    switch (err.code) {
      case 400:
      case 422:
        return new StorageError("invalid", msg, { cause: err, details });
      case 404:
        return new StorageError("not-found", msg, { cause: err, details });
      case 409:
        return new StorageError(body?.reason === "AlreadyExists" ? "already-exists" : "conflict", msg, {
          cause: err,
          details,
        });
      case 410:
        return new StorageError("conflict", msg, { cause: err, details: { ...details, gone: true } });
      case 429:
      case 500:
      case 502:
      case 503:
      case 504:
        return new StorageError("unavailable", msg, { cause: err, details });
      default:
        return new StorageError("internal", msg, { cause: err, details });
    }
  }
  return new StorageError("unavailable", `${what}: ${err instanceof Error ? err.message : String(err)}`, {
    cause: err,
  });
}

/** One RFC 6902 operation; a `test` of a missing member passes with `value: null` on the apiserver. */
export type JsonPatchOp =
  | { op: "test" | "add" | "replace"; path: string; value: unknown }
  | { op: "remove"; path: string };

/** Drops server-side bookkeeping that no controller reads and that dominates object size. */
export function stripManagedFields<T extends KubeObject>(obj: T): T {
  if (obj.metadata && "managedFields" in obj.metadata) delete obj.metadata.managedFields;
  return obj;
}

/**
 * CRUD for one kind. Reads return parsed objects; a server object that fails the schema raises
 * StorageError("invalid") naming the object and the first failing path rather than being used.
 * Writes are single attempts: conflict handling belongs to the caller (see status.ts).
 */
export class ResourceClient<T extends KubeObject> {
  private readonly api: k8s.CustomObjectsApi;

  constructor(
    readonly conn: KubeConnection,
    readonly kind: ResourceKind<T>,
  ) {
    this.api = conn.api(k8s.CustomObjectsApi);
  }

  get namespaced(): boolean {
    return this.kind.scope === "Namespaced";
  }

  /** Validates raw JSON from the server against the kind's schema. */
  parse(raw: unknown): T {
    const r = v.safeParse(this.kind.schema, raw);
    if (r.success) return stripManagedFields(r.output);
    const meta = (raw as { metadata?: { namespace?: string; name?: string } })?.metadata;
    const issue = r.issues[0];
    const path = issue ? v.getDotPath(issue) : undefined;
    throw new StorageError(
      "invalid",
      `${this.kind.kind} ${meta?.namespace ? `${meta.namespace}/` : ""}${meta?.name ?? "?"} does not match the schema` +
        `${path ? ` at ${path}` : ""}: ${issue?.message ?? "unknown"}`,
      { details: { issues: r.issues.length } },
    );
  }

  private base(namespace?: string) {
    const { group, version, plural } = this.kind;
    if (this.namespaced && !namespace)
      throw new StorageError("invalid", `${this.kind.kind} needs a namespace`);
    return { group, version, plural, namespace: namespace ?? "" };
  }

  /** The object, or undefined when it does not exist. */
  async get(name: string, namespace?: string): Promise<T | undefined> {
    try {
      const b = this.base(namespace);
      const raw = this.namespaced
        ? await this.api.getNamespacedCustomObject({ ...b, name })
        : await this.api.getClusterCustomObject({ ...b, name });
      return this.parse(raw);
    } catch (err) {
      const e = kubeError(err, `get ${this.kind.kind} ${name}`);
      if (e.kind === "not-found") return undefined;
      throw e;
    }
  }

  /** All objects (in one namespace, or everywhere when namespace is undefined). */
  async list(
    opts: { namespace?: string; labelSelector?: string } = {},
  ): Promise<{ items: T[]; resourceVersion: string }> {
    try {
      const { group, version, plural } = this.kind;
      const raw = (
        opts.namespace && this.namespaced
          ? await this.api.listNamespacedCustomObject({
              group,
              version,
              plural,
              namespace: opts.namespace,
              labelSelector: opts.labelSelector,
            })
          : await this.api.listClusterCustomObject({
              group,
              version,
              plural,
              labelSelector: opts.labelSelector,
            })
      ) as { items: unknown[]; metadata: { resourceVersion: string } };
      return { items: raw.items.map((i) => this.parse(i)), resourceVersion: raw.metadata.resourceVersion };
    } catch (err) {
      throw kubeError(err, `list ${this.kind.plural}`);
    }
  }

  /** Creates the object; StorageError("already-exists") when the name is taken. */
  async create(obj: T): Promise<T> {
    try {
      const b = this.base(obj.metadata.namespace);
      const raw = this.namespaced
        ? await this.api.createNamespacedCustomObject({ ...b, body: obj })
        : await this.api.createClusterCustomObject({ ...b, body: obj });
      return this.parse(raw);
    } catch (err) {
      throw kubeError(err, `create ${this.kind.kind} ${obj.metadata.name}`);
    }
  }

  /** Replaces the whole object (spec, metadata); fails with "conflict" on a stale resourceVersion. */
  async replace(obj: T): Promise<T> {
    try {
      const b = this.base(obj.metadata.namespace);
      const name = obj.metadata.name;
      const raw = this.namespaced
        ? await this.api.replaceNamespacedCustomObject({ ...b, name, body: obj })
        : await this.api.replaceClusterCustomObject({ ...b, name, body: obj });
      return this.parse(raw);
    } catch (err) {
      throw kubeError(err, `update ${this.kind.kind} ${obj.metadata.name}`);
    }
  }

  /** Writes only .status through the /status subresource; "conflict" on a stale resourceVersion. */
  async replaceStatus(obj: T): Promise<T> {
    try {
      const b = this.base(obj.metadata.namespace);
      const name = obj.metadata.name;
      const raw = this.namespaced
        ? await this.api.replaceNamespacedCustomObjectStatus({ ...b, name, body: obj })
        : await this.api.replaceClusterCustomObjectStatus({ ...b, name, body: obj });
      return this.parse(raw);
    } catch (err) {
      throw kubeError(err, `update status of ${this.kind.kind} ${obj.metadata.name}`);
    }
  }

  /** JSON merge patch (RFC 7386) of the main resource, e.g. to add or drop a finalizer. */
  async mergePatch(name: string, namespace: string | undefined, patch: object): Promise<T> {
    try {
      const b = this.base(namespace);
      const opts = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
      const raw = this.namespaced
        ? await this.api.patchNamespacedCustomObject({ ...b, name, body: patch }, opts)
        : await this.api.patchClusterCustomObject({ ...b, name, body: patch }, opts);
      return this.parse(raw);
    } catch (err) {
      throw kubeError(err, `patch ${this.kind.kind} ${name}`);
    }
  }

  /**
   * JSON patch (RFC 6902) of the main resource. Its `test` ops are preconditions on exactly the
   * fields an edit depends on, so unrelated writes (a status update) do not make it conflict the
   * way a resourceVersion-guarded replace does; a failed `test` is answered 422 ("invalid").
   */
  async jsonPatch(name: string, namespace: string | undefined, ops: readonly JsonPatchOp[]): Promise<T> {
    try {
      const b = this.base(namespace);
      const opts = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch);
      const raw = this.namespaced
        ? await this.api.patchNamespacedCustomObject({ ...b, name, body: ops }, opts)
        : await this.api.patchClusterCustomObject({ ...b, name, body: ops }, opts);
      return this.parse(raw);
    } catch (err) {
      throw kubeError(err, `patch ${this.kind.kind} ${name}`);
    }
  }

  /**
   * Requests deletion. With `uid`, deletes only that exact incarnation (a same-named replacement
   * is left alone: the server answers conflict). Returns false when the object was already gone.
   */
  async delete(name: string, namespace?: string, opts: { uid?: string } = {}): Promise<boolean> {
    try {
      const b = this.base(namespace);
      const body = opts.uid ? { preconditions: { uid: opts.uid } } : undefined;
      if (this.namespaced) await this.api.deleteNamespacedCustomObject({ ...b, name, body });
      else await this.api.deleteClusterCustomObject({ ...b, name, body });
      return true;
    } catch (err) {
      const e = kubeError(err, `delete ${this.kind.kind} ${name}`);
      if (e.kind === "not-found") return false;
      throw e;
    }
  }

  /** The REST path of the collection, for watches. */
  collectionPath(namespace?: string): string {
    const { group, version, plural } = this.kind;
    return namespace && this.namespaced
      ? `/apis/${group}/${version}/namespaces/${namespace}/${plural}`
      : `/apis/${group}/${version}/${plural}`;
  }
}
