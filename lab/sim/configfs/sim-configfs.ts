// A HostFs that behaves like Linux configfs with nvmet loaded, kept in a plain directory, for
// machines (CI, the lab) where configfs cannot be mounted. Paths outside configfs pass straight
// through to the directory, so one instance can also carry a simulated /sys/class and /dev.
//
// Reproduced kernel behaviour (configfs core from fs/configfs, nvmet from drivers/nvme/target/configfs.c):
// - mkdir of an item creates its attribute files with the kernel's shown defaults and its default
//   groups: subsystems/<nqn> -> attr_* + namespaces/ + allowed_hosts/; namespaces/<nsid> ->
//   device_path "(null)", enable 0, device_uuid (random), ...; ports/<id> -> addr_* (empty),
//   addr_treq, param_* + subsystems/ + referrals/ + ana_groups/1/; hosts/<nqn> -> dhchap_*.
//   Names are checked as the make functions do (nsid 0 or 0xffffffff, port ids beyond u16, the
//   discovery NQN: EINVAL); an existing name is EEXIST; mkdir anywhere else is EPERM.
// - Attribute files cannot be created (EACCES) or removed (EPERM); a read-only attribute rejects
//   writes and a write-only one rejects reads (EACCES). Writes are validated like the store
//   functions: booleans by kstrtobool, numbers by kstrtou*, enumerations by name (EINVAL).
// - Namespaces: device_path cannot change while enabled (EBUSY) nor be empty (EINVAL); enable=1
//   needs a device_path (EINVAL when unset) that exists (ENOENT otherwise, as opening it fails);
//   enabling twice is a no-op. rmdir of an enabled namespace is allowed (the kernel disables it).
// - Ports: addr_* and param_* are read-only while a subsystem is linked (EACCES). The first link
//   enables the port: it needs a transport type and, for rdma/tcp, an ipv4/ipv6 family with a
//   matching address and numeric service (EINVAL), and no other enabled port on the same
//   transport, address and service (EADDRINUSE). Removing the last link disables it.
// - Symlinks only inside ports/<id>/subsystems (to subsystems) and subsystems/<nqn>/allowed_hosts
//   (to hosts): elsewhere EPERM, to the wrong kind EINVAL, to a missing item ENOENT, outside
//   configfs EPERM, a second link to the same target EEXIST. allowed_hosts refuses links while
//   attr_allow_any_host is 1, and attr_allow_any_host refuses 1 while hosts are linked (EINVAL).
//   readlink answers a relative path ("../../../../nvmet/subsystems/<nqn>") as configfs does.
// - rmdir: an item a symlink points to is EBUSY; an item with user-made children (namespaces,
//   links, referrals, ANA groups) is ENOTEMPTY; default groups and the nvmet root are EPERM;
//   otherwise the item goes with its attributes and default groups.
// - Every mutation is reported to the onChange hook before the call returns, so a simulated nvmet
//   (lab/sim/nvmet) acts inside the "syscall" as the kernel's callbacks do.
// Not reproduced here: the transports and controllers (lab/sim/nvmet serves them from this tree),
// subsystem discovery (attr_serial and friends stay writable), passthru, p2pmem, TLS keyrings,
// CONFIG_* variations.
import * as fsp from "node:fs/promises";
import { dirname, join, posix } from "node:path";
import { type HostFs, hostFs } from "../../../lib/fs.ts";
import { type ErrnoCode, errnoError } from "./errno.ts";
import {
  ATTRIBUTES,
  type AttrContext,
  type AttrEnv,
  checkItemName,
  listenable,
  Refusal,
} from "./nvmet-attributes.ts";
import {
  DEFAULT_GROUPS,
  groupKind,
  type ItemKind,
  isDefaultAnaGroup,
  itemKind,
  LINKS_TO,
  MAKES,
} from "./nvmet-layout.ts";

export interface SimConfigfsOptions {
  /** false: start as if nvmet were not loaded (no nvmet directory) until loadNvmet(). Default true. */
  loaded?: boolean;
  /** Where configfs is mounted; default /sys/kernel/config. */
  configfsRoot?: string;
  /**
   * Whether nvmet could open a namespace's device_path (a host path). Default: the path exists
   * under the same root, so tests create root/dev/... to make a device "exist".
   */
  deviceExists?: (path: string) => Promise<boolean>;
  /** Initial attr_firmware of new subsystems. Default "6.12.0". */
  kernelRelease?: string;
  /**
   * Called after every successful mutation below nvmet, with its journal entry, before the call
   * returns: the kernel runs nvmet's callbacks (port enable, nvmet_port_del_ctrls, ...) inside the
   * configfs syscall, so a simulated nvmet hooked here has acted when the write returns. A
   * rejection is logged nowhere and ignored: the tree already holds the change.
   */
  onChange?: (entry: string) => Promise<void>;
}

/** The simulated configfs: a HostFs plus what tests need to look behind it. */
export interface SimConfigfs extends HostFs {
  /**
   * Every successful mutation below nvmet, in order, relative to the nvmet directory:
   * "mkdir <p>", "rmdir <p>", "write <p> <JSON value>", "symlink <p> -> <target>", "unlink <p>".
   */
  readonly journal: readonly string[];
  /** What `modprobe nvmet` does to configfs: creates the nvmet root groups. Idempotent. */
  loadNvmet(): Promise<void>;
}

/** A SimConfigfs over the plain directory `root` (which must exist). */
export function simConfigfs(root: string, opts: SimConfigfsOptions = {}): SimConfigfs {
  return new Sim(root, opts);
}

type Where = { at: "nvmet"; segs: string[] } | { at: "configfs" } | { at: "plain" };

class Sim implements SimConfigfs {
  readonly root: string;
  readonly journal: string[] = [];
  readonly #plain: HostFs;
  readonly #configfs: string;
  readonly #nvmet: string;
  readonly #env: AttrEnv;
  readonly #deviceExists: (path: string) => Promise<boolean>;
  readonly #onChange: ((entry: string) => Promise<void>) | undefined;
  #tail: Promise<unknown>;

  constructor(root: string, opts: SimConfigfsOptions) {
    this.root = root;
    this.#plain = hostFs(root);
    this.#configfs = posix.normalize(opts.configfsRoot ?? "/sys/kernel/config").replace(/\/$/, "");
    this.#nvmet = `${this.#configfs}/nvmet`;
    this.#env = { kernelRelease: opts.kernelRelease ?? "6.12.0" };
    this.#deviceExists = opts.deviceExists ?? ((p) => this.#plain.exists(p));
    this.#onChange = opts.onChange;
    const configfs = this.#configfs;
    this.#tail = (async () => {
      await fsp.mkdir(join(root, configfs), { recursive: true });
      if (opts.loaded ?? true) await this.#load();
    })();
  }

  // --- HostFs ---

  readFile(path: string): Promise<string> {
    return this.#serial(async () => {
      const w = this.#where(path);
      if (w.at === "nvmet" && this.#attr(w.segs)?.readable === false && (await this.#plain.exists(path))) {
        throw errnoError("EACCES", "open", path, "attribute is write-only");
      }
      return this.#plain.readFile(path);
    });
  }

  writeFile(path: string, data: string): Promise<void> {
    return this.#serial(async () => {
      const w = this.#where(path);
      if (w.at === "plain") return this.#plain.writeFile(path, data);
      const spec =
        w.at === "nvmet" && (await this.#plain.isDirectory(dirname(path))) ? this.#attr(w.segs) : undefined;
      if (w.at === "configfs" || spec === undefined) {
        if (await this.#plain.isDirectory(path)) throw errnoError("EISDIR", "open", path);
        if (await this.#plain.isDirectory(dirname(path)))
          throw errnoError("EACCES", "open", path, "configfs files cannot be created");
        throw errnoError("ENOENT", "open", path);
      }
      if (!spec.store) throw errnoError("EACCES", "open", path, "attribute is read-only");
      const segs = (w as { segs: string[] }).segs;
      const item = segs.slice(0, -1);
      let stored: Awaited<ReturnType<NonNullable<typeof spec.store>>>;
      try {
        stored = await spec.store(data, this.#context(item));
      } catch (err) {
        throw this.#refused(err, "write", path);
      }
      const { value, siblings } = typeof stored === "string" ? { value: stored, siblings: {} } : stored;
      await fsp.writeFile(this.#real(path), value);
      for (const [name, v] of Object.entries(siblings))
        await fsp.writeFile(this.#real(`${dirname(path)}/${name}`), v);
      await this.#record(`write ${segs.join("/")} ${JSON.stringify(data)}`);
    });
  }

  readdir(path: string): Promise<string[]> {
    return this.#serial(() => this.#plain.readdir(path));
  }

  readlink(path: string): Promise<string> {
    return this.#serial(() => this.#plain.readlink(path));
  }

  exists(path: string): Promise<boolean> {
    return this.#serial(() => this.#plain.exists(path));
  }

  isDirectory(path: string): Promise<boolean> {
    return this.#serial(() => this.#plain.isDirectory(path));
  }

  mkdir(path: string): Promise<void> {
    return this.#serial(async () => {
      const w = this.#where(path);
      if (w.at === "plain") return this.#plain.mkdir(path);
      if (await this.#plain.exists(path)) throw errnoError("EEXIST", "mkdir", path);
      if (!(await this.#plain.isDirectory(dirname(path)))) throw errnoError("ENOENT", "mkdir", path);
      const group = w.at === "nvmet" ? groupKind(w.segs.slice(0, -1)) : undefined;
      const kind = group ? MAKES[group] : undefined;
      if (w.at !== "nvmet" || kind === undefined)
        throw errnoError("EPERM", "mkdir", path, "no items can be made here");
      const name = w.segs[w.segs.length - 1] as string;
      try {
        checkItemName(kind, name);
        if (kind === "subsystem" && (await this.#shown(`${this.#nvmet}/discovery_nqn`)) === name) {
          throw new Refusal("EINVAL", "can't create subsystem using unique discovery NQN");
        }
      } catch (err) {
        throw this.#refused(err, "mkdir", path);
      }
      await this.#populate(path, kind, name);
      await this.#record(`mkdir ${w.segs.join("/")}`);
    });
  }

  rmdir(path: string): Promise<void> {
    return this.#serial(async () => {
      const w = this.#where(path);
      if (w.at === "plain") return this.#plain.rmdir(path);
      if (!(await this.#plain.exists(path))) throw errnoError("ENOENT", "rmdir", path);
      if ((await this.#isLink(path)) || !(await this.#plain.isDirectory(path)))
        throw errnoError("ENOTDIR", "rmdir", path);
      const kind = w.at === "nvmet" ? itemKind(w.segs) : undefined;
      if (w.at !== "nvmet" || kind === undefined || kind === "root" || isDefaultAnaGroup(w.segs)) {
        throw errnoError("EPERM", "rmdir", path, "default groups cannot be removed");
      }
      if ((await this.#linksTo(w.segs)).length > 0)
        throw errnoError("EBUSY", "rmdir", path, "a symlink points here");
      if (await this.#hasUserChildren(path, kind)) throw errnoError("ENOTEMPTY", "rmdir", path);
      await fsp.rm(this.#real(path), { recursive: true });
      await this.#record(`rmdir ${w.segs.join("/")}`);
    });
  }

  unlink(path: string): Promise<void> {
    return this.#serial(async () => {
      const w = this.#where(path);
      if (w.at === "plain") return this.#plain.unlink(path);
      if (!(await this.#plain.exists(path))) throw errnoError("ENOENT", "unlink", path);
      if (!(await this.#isLink(path))) {
        if (await this.#plain.isDirectory(path)) throw errnoError("EISDIR", "unlink", path);
        throw errnoError("EPERM", "unlink", path, "configfs attributes cannot be removed");
      }
      await fsp.unlink(this.#real(path));
      await this.#record(`unlink ${w.at === "nvmet" ? w.segs.join("/") : path}`);
    });
  }

  symlink(target: string, path: string): Promise<void> {
    return this.#serial(async () => {
      const w = this.#where(path);
      if (w.at === "plain") return this.#plain.symlink(target, path);
      if (!(await this.#plain.isDirectory(dirname(path)))) throw errnoError("ENOENT", "symlink", path);
      if (w.at !== "nvmet") throw errnoError("EPERM", "symlink", path, "no links can be made here");
      const parent = w.segs.slice(0, -1);
      const group = groupKind(parent);
      const want = group ? LINKS_TO[group] : undefined;
      if (want === undefined) throw errnoError("EPERM", "symlink", path, "no links can be made here");
      if (await this.#plain.exists(path)) throw errnoError("EEXIST", "symlink", path);
      const resolved = target.startsWith("/")
        ? posix.normalize(target)
        : posix.resolve(dirname(path), target);
      const t = this.#where(resolved);
      if (t.at === "plain") throw errnoError("EPERM", "symlink", path, "target is not on configfs");
      if (!(await this.#plain.isDirectory(resolved)) || t.at !== "nvmet") {
        throw errnoError((await this.#plain.exists(resolved)) ? "ENOTDIR" : "ENOENT", "symlink", path);
      }
      if (itemKind(t.segs) !== want) {
        throw errnoError("EINVAL", "symlink", path, `only ${want}s can be linked here`);
      }
      const existing = await this.#links(`${this.#nvmet}/${parent.join("/")}`);
      if (existing.some((l) => l.target.join("/") === t.segs.join("/"))) {
        throw errnoError("EEXIST", "symlink", path, "already linked");
      }
      if (group === "allowed_hosts") {
        if (
          (await this.#shown(`${this.#nvmet}/${parent.slice(0, 2).join("/")}/attr_allow_any_host`)) === "1"
        ) {
          throw errnoError("EINVAL", "symlink", path, "can't add hosts when allow_any_host is set");
        }
      } else if (existing.length === 0) {
        await this.#enablePort(parent.slice(0, 2), path);
      }
      // Stored as configfs shows it: up to the configfs root, then down to the target item.
      const relative = `${"../".repeat(parent.length + 1)}nvmet/${t.segs.join("/")}`;
      await fsp.symlink(relative, this.#real(path));
      await this.#record(`symlink ${w.segs.join("/")} -> ${t.segs.join("/")}`);
    });
  }

  loadNvmet(): Promise<void> {
    return this.#serial(() => this.#load());
  }

  // --- internals; all run inside #serial ---

  /** Runs operations one at a time, like the kernel's configfs and nvmet locks do. */
  #serial<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.#tail.then(fn);
    this.#tail = run.catch(() => undefined);
    return run;
  }

  async #record(entry: string): Promise<void> {
    this.journal.push(entry);
    await this.#onChange?.(entry).catch(() => undefined);
  }

  #real(path: string): string {
    return join(this.root, path);
  }

  #where(path: string): Where {
    const p = posix.normalize(path);
    if (p === this.#nvmet || p.startsWith(`${this.#nvmet}/`)) {
      return { at: "nvmet", segs: p.slice(this.#nvmet.length).split("/").filter(Boolean) };
    }
    if (p === this.#configfs || p.startsWith(`${this.#configfs}/`)) return { at: "configfs" };
    return { at: "plain" };
  }

  /** The attribute a file path below nvmet would be, if its directory is an item that has it. */
  #attr(segs: readonly string[]) {
    const kind = itemKind(segs.slice(0, -1));
    return kind ? ATTRIBUTES[kind][segs[segs.length - 1] as string] : undefined;
  }

  async #shown(path: string): Promise<string> {
    return (await fsp.readFile(this.#real(path), "utf8")).replace(/\n$/, "");
  }

  async #isLink(path: string): Promise<boolean> {
    try {
      return (await fsp.lstat(this.#real(path))).isSymbolicLink();
    } catch {
      return false;
    }
  }

  #refused(err: unknown, syscall: string, path: string): Error {
    if (err instanceof Refusal) return errnoError(err.code as ErrnoCode, syscall, path, err.message);
    return err as Error;
  }

  async #load(): Promise<void> {
    if (await this.#plain.isDirectory(this.#nvmet)) return;
    await this.#populate(this.#nvmet, "root", "nvmet");
  }

  /** Creates an item directory as the kernel presents it right after mkdir. */
  async #populate(path: string, kind: ItemKind, name: string): Promise<void> {
    await fsp.mkdir(this.#real(path));
    for (const [attr, spec] of Object.entries(ATTRIBUTES[kind])) {
      const initial = kind === "ana_group" && name === "1" ? "optimized\n" : spec.initial(this.#env);
      await fsp.writeFile(this.#real(`${path}/${attr}`), initial);
    }
    for (const group of DEFAULT_GROUPS[kind] ?? []) await fsp.mkdir(this.#real(`${path}/${group}`));
    if (kind === "port") await this.#populate(`${path}/ana_groups/1`, "ana_group", "1");
  }

  #context(item: readonly string[]): AttrContext {
    const dir = `${this.#nvmet}/${item.join("/")}`.replace(/\/$/, "");
    const kind = itemKind(item);
    return {
      sibling: (name) => this.#shown(`${dir}/${name}`),
      portEnabled: async () =>
        kind === "referral"
          ? (await this.#shown(`${dir}/enable`)) === "1"
          : (await this.#list(`${dir}/subsystems`)).length > 0,
      allowedHostCount: async () => (await this.#list(`${dir}/allowed_hosts`)).length,
      deviceExists: (p) => this.#deviceExists(p),
      subsystemNames: () => this.#list(`${this.#nvmet}/subsystems`),
    };
  }

  async #list(path: string): Promise<string[]> {
    try {
      return (await fsp.readdir(this.#real(path))).sort();
    } catch {
      return [];
    }
  }

  /** The symlinks in a link group with the item segments each points to. */
  async #links(dir: string): Promise<{ name: string; target: string[] }[]> {
    const out: { name: string; target: string[] }[] = [];
    for (const name of await this.#list(dir)) {
      const stored = await fsp.readlink(this.#real(`${dir}/${name}`)).catch(() => undefined);
      if (stored === undefined) continue;
      const abs = stored.startsWith("/") ? stored : posix.resolve(`${dir}`, stored);
      const w = this.#where(abs);
      out.push({ name, target: w.at === "nvmet" ? w.segs : [] });
    }
    return out;
  }

  /** Every symlink in configfs that points at the item `segs`. */
  async #linksTo(segs: readonly string[]): Promise<string[]> {
    const key = segs.join("/");
    const hits: string[] = [];
    const groups = [
      ...(await this.#list(`${this.#nvmet}/subsystems`)).map(
        (s) => `${this.#nvmet}/subsystems/${s}/allowed_hosts`,
      ),
      ...(await this.#list(`${this.#nvmet}/ports`)).map((p) => `${this.#nvmet}/ports/${p}/subsystems`),
    ];
    for (const g of groups) {
      for (const l of await this.#links(g)) if (l.target.join("/") === key) hits.push(`${g}/${l.name}`);
    }
    return hits;
  }

  async #hasUserChildren(path: string, kind: ItemKind): Promise<boolean> {
    const defaults = DEFAULT_GROUPS[kind] ?? [];
    for (const entry of await this.#list(path)) {
      if (ATTRIBUTES[kind][entry] && !(await this.#isLink(`${path}/${entry}`))) continue;
      if (!defaults.includes(entry)) return true;
      const inside = await this.#list(`${path}/${entry}`);
      if (inside.some((e) => !(kind === "port" && entry === "ana_groups" && e === "1"))) return true;
    }
    return false;
  }

  /** The checks nvmet_enable_port and the transport's add_port make when the first link arrives. */
  async #enablePort(port: readonly string[], path: string): Promise<void> {
    const dir = `${this.#nvmet}/${port.join("/")}`;
    const [trtype, adrfam, traddr, trsvcid] = await Promise.all(
      ["addr_trtype", "addr_adrfam", "addr_traddr", "addr_trsvcid"].map((a) => this.#shown(`${dir}/${a}`)),
    );
    const why = listenable(trtype as string, adrfam as string, traddr as string, trsvcid as string);
    if (why) throw errnoError("EINVAL", "symlink", path, why);
    for (const other of await this.#list(`${this.#nvmet}/ports`)) {
      const odir = `${this.#nvmet}/ports/${other}`;
      if (other === port[1] || (await this.#list(`${odir}/subsystems`)).length === 0) continue;
      const same =
        (await this.#shown(`${odir}/addr_trtype`)) === trtype &&
        (await this.#shown(`${odir}/addr_traddr`)) === traddr &&
        (await this.#shown(`${odir}/addr_trsvcid`)) === trsvcid;
      if (same)
        throw errnoError(
          "EADDRINUSE",
          "symlink",
          path,
          `port ${other} already listens on ${traddr}:${trsvcid}`,
        );
    }
  }
}
