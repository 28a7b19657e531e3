// Reads the state Linux nvmet holds from a configfs tree kept in a plain directory (the simulated
// configfs): ports with their linked subsystems, subsystems with namespaces and allowed hosts,
// and host entries with their DH-HMAC-CHAP settings. Pure reading; no kernel rules are applied.
import { readdir, readFile, readlink } from "node:fs/promises";
import { basename, join, posix } from "node:path";

/** A port as nvmet sees it: the addr_* attributes and the subsystems linked under it. */
export interface PortState {
  readonly id: string;
  readonly trtype: string;
  readonly adrfam: string;
  readonly traddr: string;
  readonly trsvcid: string;
  /** NQNs of the subsystems linked into ports/<id>/subsystems (by link target). */
  readonly subsystems: ReadonlySet<string>;
}

/** A namespace of a subsystem. */
export interface NamespaceState {
  readonly nsid: number;
  /** "" when unset ("(null)"). */
  readonly devicePath: string;
  readonly enabled: boolean;
  readonly uuid: string;
  /** 32 uppercase hex digits. */
  readonly nguid: string;
}

export interface SubsystemState {
  readonly nqn: string;
  readonly allowAnyHost: boolean;
  readonly serial: string;
  readonly model: string;
  readonly firmware: string;
  readonly cntlidMin: number;
  readonly cntlidMax: number;
  /** Host NQNs linked into allowed_hosts (by link target). */
  readonly allowedHosts: ReadonlySet<string>;
  readonly namespaces: ReadonlyMap<number, NamespaceState>;
}

/** hosts/<nqn>: the DH-HMAC-CHAP attributes nvmet_setup_auth reads at connect. */
export interface HostState {
  readonly nqn: string;
  /** "" when none is set. */
  readonly dhchapKey: string;
  readonly dhchapCtrlKey: string;
  readonly dhchapHash: string;
  readonly dhchapDhgroup: string;
}

export interface NvmetState {
  readonly ports: ReadonlyMap<string, PortState>;
  readonly subsystems: ReadonlyMap<string, SubsystemState>;
  readonly hosts: ReadonlyMap<string, HostState>;
}

async function list(dir: string): Promise<string[]> {
  try {
    return (await readdir(dir)).sort();
  } catch {
    return [];
  }
}

async function attr(path: string): Promise<string> {
  try {
    return (await readFile(path, "utf8")).replace(/\n$/, "");
  } catch {
    return "";
  }
}

/** The item names the links in `dir` point to (configfs stores them relative). */
async function linkTargets(dir: string): Promise<Set<string>> {
  const out = new Set<string>();
  for (const name of await list(dir)) {
    try {
      const t = await readlink(join(dir, name));
      out.add(basename(posix.normalize(t)));
    } catch {
      // Not a link: configfs would not have let it be made; ignore it.
    }
  }
  return out;
}

/** Reads the whole nvmet tree at `nvmetDir` (the real directory of .../config/nvmet). */
export async function readNvmetTree(nvmetDir: string): Promise<NvmetState> {
  const ports = new Map<string, PortState>();
  for (const id of await list(join(nvmetDir, "ports"))) {
    const d = join(nvmetDir, "ports", id);
    ports.set(id, {
      id,
      trtype: await attr(join(d, "addr_trtype")),
      adrfam: await attr(join(d, "addr_adrfam")),
      traddr: await attr(join(d, "addr_traddr")),
      trsvcid: await attr(join(d, "addr_trsvcid")),
      subsystems: await linkTargets(join(d, "subsystems")),
    });
  }
  const subsystems = new Map<string, SubsystemState>();
  for (const nqn of await list(join(nvmetDir, "subsystems"))) {
    const d = join(nvmetDir, "subsystems", nqn);
    const namespaces = new Map<number, NamespaceState>();
    for (const name of await list(join(d, "namespaces"))) {
      const nd = join(d, "namespaces", name);
      const path = await attr(join(nd, "device_path"));
      const uuid = await attr(join(nd, "device_uuid"));
      namespaces.set(Number(name), {
        nsid: Number(name),
        devicePath: path === "(null)" ? "" : path,
        enabled: (await attr(join(nd, "enable"))) === "1",
        uuid,
        nguid: (await attr(join(nd, "device_nguid"))).replaceAll("-", "").toUpperCase(),
      });
    }
    subsystems.set(nqn, {
      nqn,
      allowAnyHost: (await attr(join(d, "attr_allow_any_host"))) === "1",
      serial: (await attr(join(d, "attr_serial"))).trimEnd(),
      model: await attr(join(d, "attr_model")),
      firmware: await attr(join(d, "attr_firmware")),
      cntlidMin: Number((await attr(join(d, "attr_cntlid_min"))) || "1"),
      cntlidMax: Number((await attr(join(d, "attr_cntlid_max"))) || "65519"),
      allowedHosts: await linkTargets(join(d, "allowed_hosts")),
      namespaces,
    });
  }
  const hosts = new Map<string, HostState>();
  for (const nqn of await list(join(nvmetDir, "hosts"))) {
    const d = join(nvmetDir, "hosts", nqn);
    hosts.set(nqn, {
      nqn,
      dhchapKey: await attr(join(d, "dhchap_key")),
      dhchapCtrlKey: await attr(join(d, "dhchap_ctrl_key")),
      dhchapHash: await attr(join(d, "dhchap_hash")),
      dhchapDhgroup: await attr(join(d, "dhchap_dhgroup")),
    });
  }
  return { ports, subsystems, hosts };
}

/** nvmet_host_allowed: any host when attr_allow_any_host is set, else only the linked ones. */
export function hostAllowed(s: SubsystemState, hostnqn: string): boolean {
  return s.allowAnyHost || s.allowedHosts.has(hostnqn);
}
