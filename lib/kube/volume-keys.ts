// The Secret that holds one volume's DH-HMAC-CHAP keys and TLS PSKs (layout:
// lib/nvme/dhchap-keys.ts), as a port: the CSI controller adds a host's entries at publish and
// drops them after unpublish; the agent reads them to install them. Owned by the volume's NVMePartition, so it goes with the volume.
import { randomBytes } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import { StorageError } from "../errors.ts";
import {
  DHCHAP_MASTER_KEY,
  DHCHAP_MASTER_SECRET,
  type DhchapHashName,
  type DhchapMode,
  deriveHostKeyPair,
  generateHostKeyPair,
  hostEntryKeys,
} from "../nvme/dhchap-keys.ts";
import { generateInterchangePsk, isInterchangePsk } from "../nvme/tls-psk.ts";
import type { KubeConnection } from "./connection.ts";
import { kubeError } from "./resource.ts";

/** The Secret's type: says what it is to an operator listing Secrets. */
export const VOLUME_KEYS_SECRET_TYPE = "storage.distort.io/dhchap";

/**
 * Data key recording the last rotation generation done on a volume's key Secret (not secret). A
 * rotation asked for again with the same generation changes nothing.
 */
export const ROTATION_GENERATION_KEY = "rotation.generation";

/** The object a volume's key Secret is owned by (its NVMePartition). */
export interface KeyOwner {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; uid?: string };
}

export interface VolumeKeyStore {
  /**
   * Makes sure Secret `name` (the owner's namespace) holds a key pair for `hostNqn` of `mode`,
   * generating it when missing or of the wrong shape (a controller key present iff
   * bidirectional). Creates the Secret, owned by `owner`, on first use. Never returns a key.
   * `perHost`: the pair is the host's one pair for every volume (derived from the namespace's
   * master key, created on first use), for targets that keep one key per host (nvmet).
   */
  ensureHost(
    owner: KeyOwner,
    name: string,
    hostNqn: string,
    mode: Exclude<DhchapMode, "none">,
    hash: DhchapHashName,
    opts?: { perHost?: boolean },
  ): Promise<void>;
  /**
   * Makes sure Secret `name` holds an NVMe/TCP TLS PSK (interchange form, a random configured
   * PSK with hash 01) for `hostNqn`, generating it when missing or malformed; creates the Secret,
   * owned by `owner`, on first use. An existing PSK is kept (a connected host keeps working).
   */
  ensurePsk(owner: KeyOwner, name: string, hostNqn: string): Promise<void>;
  /** Drops `hostNqn`'s entries (pair, PSK) from Secret namespace/name; a missing Secret or entry is done. */
  removeHost(namespace: string, name: string, hostNqn: string): Promise<void>;
  /**
   * Drops every pair but those of `hostNqns` (a host taken over from, no longer published to);
   * a missing Secret is done.
   */
  retainHosts(namespace: string, name: string, hostNqns: readonly string[]): Promise<void>;
  /**
   * Key rotation: gives every host of Secret namespace/name a new pair of `mode` and records
   * `generation` (ROTATION_GENERATION_KEY). Returns the host NQNs rotated, [] when `generation` was
   * done already or the Secret holds no host, undefined when the Secret does not exist. Per-volume
   * pairs only: a per-host pair (derived, nvmet) is never rotated here. Never returns a key.
   */
  rotate(
    namespace: string,
    name: string,
    generation: string,
    mode: Exclude<DhchapMode, "none">,
    hash: DhchapHashName,
  ): Promise<string[] | undefined>;
  /** The Secret's decoded data, or undefined when it does not exist. */
  read(namespace: string, name: string): Promise<Record<string, string> | undefined>;
}

const ATTEMPTS = 5;

function decode(s: k8s.V1Secret): Record<string, string> {
  return Object.fromEntries(
    Object.entries(s.data ?? {}).map(([k, b64]) => [k, Buffer.from(b64, "base64").toString("utf8")]),
  );
}

function encode(data: Record<string, string>): Record<string, string> {
  return Object.fromEntries(
    Object.entries(data).map(([k, val]) => [k, Buffer.from(val, "utf8").toString("base64")]),
  );
}

/** The VolumeKeyStore on the API server; updates are resourceVersion-guarded and retried on conflict. */
export function kubeVolumeKeyStore(
  conn: KubeConnection,
  labels: Record<string, string> = {},
): VolumeKeyStore {
  const core = conn.api(k8s.CoreV1Api);
  const get = async (namespace: string, name: string) => {
    try {
      return await core.readNamespacedSecret({ name, namespace });
    } catch (err) {
      const e = kubeError(err, `read Secret ${namespace}/${name}`);
      if (e.kind === "not-found") return undefined;
      throw e;
    }
  };
  /** Runs `step` until it does not hit a conflict (a concurrent writer), a bounded number of times. */
  const retrying = async (what: string, step: () => Promise<void>) => {
    for (let i = 1; ; i++) {
      try {
        return await step();
      } catch (err) {
        const e = kubeError(err, what);
        if ((e.kind !== "conflict" && e.kind !== "already-exists") || i >= ATTEMPTS) throw e;
      }
    }
  };
  /** The namespace's master key (32 random bytes), created by the first caller that needs it. */
  const masterKey = async (namespace: string): Promise<Buffer> => {
    for (let i = 1; ; i++) {
      const cur = await get(namespace, DHCHAP_MASTER_SECRET);
      const b64 = cur?.data?.[DHCHAP_MASTER_KEY];
      if (b64) return Buffer.from(b64, "base64");
      if (cur)
        throw new StorageError(
          "precondition",
          `Secret ${namespace}/${DHCHAP_MASTER_SECRET} has no ${DHCHAP_MASTER_KEY}`,
        );
      try {
        await core.createNamespacedSecret({
          namespace,
          body: {
            metadata: { name: DHCHAP_MASTER_SECRET, namespace, labels },
            type: VOLUME_KEYS_SECRET_TYPE,
            data: { [DHCHAP_MASTER_KEY]: randomBytes(32).toString("base64") },
          },
        });
      } catch (err) {
        // Another writer created it first: read theirs.
        const e = kubeError(err, `create Secret ${namespace}/${DHCHAP_MASTER_SECRET}`);
        if (e.kind !== "already-exists" || i >= ATTEMPTS) throw e;
      }
    }
  };
  /**
   * Read-modify-write of Secret `name` (owner's namespace): `next` gets the decoded data ({} when
   * the Secret does not exist) and returns the new data, or undefined when nothing is to change.
   * Creates the Secret, owned by `owner`, on first use.
   */
  const upsert = async (
    owner: KeyOwner,
    name: string,
    next: (data: Record<string, string>) => Record<string, string> | undefined,
  ) => {
    const namespace = owner.metadata.namespace as string;
    if (!owner.metadata.uid) throw new StorageError("invalid", `owner ${owner.metadata.name} has no uid`);
    await retrying(`write Secret ${namespace}/${name}`, async () => {
      const cur = await get(namespace, name);
      const data = cur ? decode(cur) : {};
      const want = next(data);
      if (cur && want === undefined) return;
      const body = want ?? data;
      if (!cur) {
        await core.createNamespacedSecret({
          namespace,
          body: {
            metadata: {
              name,
              namespace,
              labels,
              ownerReferences: [
                {
                  apiVersion: owner.apiVersion,
                  kind: owner.kind,
                  name: owner.metadata.name,
                  uid: owner.metadata.uid as string,
                },
              ],
            },
            type: VOLUME_KEYS_SECRET_TYPE,
            immutable: false,
            data: encode(body),
          },
        });
        return;
      }
      await core.replaceNamespacedSecret({ name, namespace, body: { ...cur, data: encode(body) } });
    });
  };
  return {
    async ensureHost(owner, name, hostNqn, mode, hash, opts = {}) {
      const namespace = owner.metadata.namespace as string;
      const k = hostEntryKeys(hostNqn);
      const derived = opts.perHost ? deriveHostKeyPair(await masterKey(namespace), mode, hostNqn) : undefined;
      await upsert(owner, name, (data) => {
        const shapeOk = derived
          ? data[k.secret] === derived.secret && data[k.ctrlSecret] === derived.ctrlSecret
          : !!data[k.secret] && (mode === "bidirectional") === !!data[k.ctrlSecret];
        if (shapeOk) return undefined;
        const pair = derived ?? generateHostKeyPair(mode, hash);
        const next: Record<string, string> = { ...data, [k.secret]: pair.secret, [k.hostNqn]: hostNqn };
        if (pair.ctrlSecret) next[k.ctrlSecret] = pair.ctrlSecret;
        else delete next[k.ctrlSecret];
        return next;
      });
    },
    async ensurePsk(owner, name, hostNqn) {
      const k = hostEntryKeys(hostNqn);
      await upsert(owner, name, (data) => {
        if (isInterchangePsk(data[k.psk] ?? "") && data[k.hostNqn] === hostNqn) return undefined;
        const psk = isInterchangePsk(data[k.psk] ?? "") ? (data[k.psk] as string) : generateInterchangePsk();
        return { ...data, [k.psk]: psk, [k.hostNqn]: hostNqn };
      });
    },
    async removeHost(namespace, name, hostNqn) {
      const k = hostEntryKeys(hostNqn);
      await retrying(`write Secret ${namespace}/${name}`, async () => {
        const cur = await get(namespace, name);
        if (!cur) return;
        const data = decode(cur);
        if (!Object.values(k).some((key) => key in data)) return;
        for (const key of Object.values(k)) delete data[key];
        await core.replaceNamespacedSecret({ name, namespace, body: { ...cur, data: encode(data) } });
      });
    },
    async rotate(namespace, name, generation, mode, hash) {
      let rotated: string[] | undefined;
      await retrying(`rotate the keys in Secret ${namespace}/${name}`, async () => {
        const cur = await get(namespace, name);
        if (!cur) {
          rotated = undefined;
          return;
        }
        const data = decode(cur);
        rotated = [];
        if (data[ROTATION_GENERATION_KEY] === generation) return;
        const hosts = Object.entries(data)
          .filter(([k]) => k.endsWith(".hostnqn"))
          .map(([, nqn]) => nqn)
          .sort();
        for (const h of hosts) {
          const k = hostEntryKeys(h);
          const pair = generateHostKeyPair(mode, hash);
          data[k.secret] = pair.secret;
          if (pair.ctrlSecret) data[k.ctrlSecret] = pair.ctrlSecret;
          else delete data[k.ctrlSecret];
        }
        data[ROTATION_GENERATION_KEY] = generation;
        await core.replaceNamespacedSecret({ name, namespace, body: { ...cur, data: encode(data) } });
        rotated = hosts;
      });
      return rotated;
    },
    async retainHosts(namespace, name, hostNqns) {
      const keep = new Set([
        ROTATION_GENERATION_KEY,
        ...hostNqns.flatMap((h) => Object.values(hostEntryKeys(h))),
      ]);
      await retrying(`write Secret ${namespace}/${name}`, async () => {
        const cur = await get(namespace, name);
        if (!cur) return;
        const data = decode(cur);
        const drop = Object.keys(data).filter((k) => !keep.has(k));
        if (drop.length === 0) return;
        for (const k of drop) delete data[k];
        await core.replaceNamespacedSecret({ name, namespace, body: { ...cur, data: encode(data) } });
      });
    },
    async read(namespace, name) {
      const s = await get(namespace, name);
      return s ? decode(s) : undefined;
    },
  };
}
