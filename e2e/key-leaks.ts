// Where a secret shows up in the lab: every process's argv and environment, every log
// file, Events and every object but the secret's own Secret. Shared by the key e2e suites.
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import type { E2eLab } from "./support.ts";

/** Every regular file under `dir` whose name says it is a log, depth-first. */
export function logFiles(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    let entries: string[];
    try {
      entries = readdirSync(d);
    } catch {
      return;
    }
    for (const e of entries) {
      const p = join(d, e);
      let st: ReturnType<typeof statSync>;
      try {
        st = statSync(p);
      } catch {
        continue;
      }
      if (st.isDirectory()) walk(p);
      else if (st.isFile() && /log/i.test(e)) out.push(p);
    }
  };
  walk(dir);
  return out;
}

/** Where some `needles` show up: process argv/environment, log files, Events and objects. */
export async function leaks(
  lab: E2eLab,
  needles: string[],
  ownSecret: { namespace: string; name: string },
): Promise<string[]> {
  const found: string[] = [];
  const check = (where: string, text: string) => {
    for (const n of needles) if (text.includes(n)) found.push(where);
  };
  for (const pid of readdirSync("/proc").filter((x) => /^\d+$/.test(x))) {
    for (const f of ["cmdline", "environ"]) {
      try {
        check(`/proc/${pid}/${f}`, readFileSync(`/proc/${pid}/${f}`, "latin1"));
      } catch {
        // gone, or not ours to read
      }
    }
  }
  for (const f of logFiles(lab.dir)) {
    let text: string;
    try {
      text = readFileSync(f, "latin1");
    } catch (err) {
      // A log kubelet removed with its Pod between the listing and the read holds nothing now.
      if ((err as NodeJS.ErrnoException).code === "ENOENT") continue;
      throw err;
    }
    check(f, text);
  }
  const core = lab.core;
  check("events (core/v1)", JSON.stringify(await core.listEventForAllNamespaces()));
  check(
    "events (events.k8s.io)",
    JSON.stringify(await lab.conn.api(k8s.EventsV1Api).listEventForAllNamespaces()),
  );
  check("persistentvolumes", JSON.stringify(await core.listPersistentVolume()));
  check("persistentvolumeclaims", JSON.stringify(await core.listPersistentVolumeClaimForAllNamespaces()));
  check("pods", JSON.stringify(await core.listPodForAllNamespaces()));
  check("nodes", JSON.stringify(await core.listNode()));
  check("configmaps", JSON.stringify(await core.listConfigMapForAllNamespaces()));
  check("volumeattachments", JSON.stringify(await lab.storageApi.listVolumeAttachment()));
  check("csinodes", JSON.stringify(await lab.storageApi.listCSINode()));
  const secrets = await core.listSecretForAllNamespaces();
  for (const s of secrets.items) {
    if (s.metadata?.namespace === ownSecret.namespace && s.metadata?.name === ownSecret.name) continue;
    check(`secret ${s.metadata?.namespace}/${s.metadata?.name}`, JSON.stringify(s));
    // Secret data is base64: look for the encoded needle as well.
    for (const val of Object.values(s.data ?? {}))
      check(
        `secret ${s.metadata?.namespace}/${s.metadata?.name}`,
        Buffer.from(val, "base64").toString("latin1"),
      );
  }
  const custom = lab.conn.api(k8s.CustomObjectsApi);
  for (const plural of [
    "nvmepartitions",
    "nvmevolumeattachments",
    "nvmedevices",
    "nvmedeviceclaims",
    "rdmastoragenodes",
    "nvmesnapshots",
  ]) {
    const list = await custom
      .listClusterCustomObject({ group: "storage.distort.io", version: "v1alpha1", plural })
      .catch(() => undefined);
    if (list) check(plural, JSON.stringify(list));
  }
  return [...new Set(found)];
}
