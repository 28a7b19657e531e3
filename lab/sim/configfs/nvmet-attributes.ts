// nvmet's configfs attributes, one table per item kind: the value each shows after mkdir and the
// checks its store function makes, transcribed from drivers/nvme/target/configfs.c (Linux 6.x).
import { randomBytes, randomUUID } from "node:crypto";
import { isIPv4, isIPv6 } from "node:net";
import type { ErrnoCode } from "./errno.ts";
import type { ItemKind } from "./nvmet-layout.ts";

/** A store function refusing a value, as the kernel's -E* return. */
export class Refusal extends Error {
  readonly code: ErrnoCode;
  constructor(code: ErrnoCode, why: string) {
    super(why);
    this.code = code;
  }
}

/** What a store function may look at; all reads see the tree as it is before this write. */
export interface AttrContext {
  /** Shown value of another attribute of the same item, without the trailing newline. */
  sibling(name: string): Promise<string>;
  /** Ports: a subsystem is linked (the port listens). Referrals: their enable is 1. */
  portEnabled(): Promise<boolean>;
  /** Subsystems: how many hosts are linked into allowed_hosts. */
  allowedHostCount(): Promise<number>;
  /** Whether nvmet could open this block device or file. */
  deviceExists(path: string): Promise<boolean>;
  /** Names of all subsystems (the root's discovery_nqn may not repeat one). */
  subsystemNames(): Promise<string[]>;
}

/** The new shown content of the attribute, plus any sibling attributes the same store changes. */
export type Stored = string | { value: string; siblings: Record<string, string> };

export interface AttrSpec {
  /** Shown content right after mkdir (with the newline), given the sim's environment. */
  initial(env: AttrEnv): string;
  /** Absent: the attribute is read-only (writes fail EACCES). */
  store?(input: string, ctx: AttrContext): Promise<Stored>;
  /** False for write-only attributes (reads fail EACCES). */
  readable?: boolean;
}

export interface AttrEnv {
  /** What attr_firmware starts as (the kernel's UTS_RELEASE, cut to 8 bytes). */
  kernelRelease: string;
}

const show = (v: string | number) => `${v}\n`;

/** The part before the first newline, as strcspn(page, "\n") takes it. */
function firstLine(input: string): string {
  const i = input.indexOf("\n");
  return i < 0 ? input : input.slice(0, i);
}

/** sysfs_streq: equal, ignoring one trailing newline on the input. */
function streq(input: string, want: string): boolean {
  return input === want || input === `${want}\n`;
}

/** kstrtobool: y/Y/1/on true, n/N/0/off false, judged by the first one or two characters. */
export function kstrtobool(input: string): boolean {
  const a = input[0]?.toLowerCase();
  const b = input[1]?.toLowerCase();
  if (a === "y" || a === "1") return true;
  if (a === "n" || a === "0") return false;
  if (a === "o" && b === "n") return true;
  if (a === "o" && b === "f") return false;
  throw new Refusal("EINVAL", `not a boolean: ${JSON.stringify(input)}`);
}

/** kstrtou*(s, 0): decimal, 0x hex or 0 octal, one trailing newline allowed; ERANGE above max. */
export function kstrtouint(input: string, max: number): number {
  const s = input.endsWith("\n") ? input.slice(0, -1) : input;
  let n: number;
  if (/^0x[0-9a-f]+$/i.test(s)) n = Number.parseInt(s.slice(2), 16);
  else if (/^0[0-7]*$/.test(s)) n = Number.parseInt(s, 8);
  else if (/^\+?[1-9][0-9]*$/.test(s)) n = Number.parseInt(s, 10);
  else throw new Refusal("EINVAL", `not an unsigned integer: ${JSON.stringify(input)}`);
  if (n > max) throw new Refusal("ERANGE", `${s} is above ${max}`);
  return n;
}

/** kstrtoint(s, 0) for the signed port parameters. */
function kstrtoint(input: string): number {
  const s = input.endsWith("\n") ? input.slice(0, -1) : input;
  if (s.startsWith("-")) return -kstrtouint(s.slice(1), 2 ** 31);
  return kstrtouint(s, 2 ** 31 - 1);
}

/** sscanf("%hu"): leading decimal digits. */
function scanU16(input: string): number {
  const m = /^\s*(\d+)/.exec(input);
  if (!m) throw new Refusal("EINVAL", `not a number: ${JSON.stringify(input)}`);
  return Number(m[1]) & 0xffff;
}

/** sscanf("%s"): the first whitespace-delimited token. */
function scanToken(input: string): string {
  const m = /^\s*(\S+)/.exec(input);
  if (!m) throw new Refusal("EINVAL", "empty value");
  return m[1] as string;
}

/** The NVMe identify strings: 1..max bytes of printable ASCII. */
function asciiField(input: string, max: number, what: string): string {
  const v = firstLine(input);
  if (v.length === 0 || v.length > max) throw new Refusal("EINVAL", `${what} must be 1-${max} bytes`);
  if (!/^[\x20-\x7e]+$/.test(v)) throw new Refusal("EINVAL", `${what} must be printable ASCII`);
  return v;
}

function oneOf(input: string, names: readonly string[], what: string): string {
  const hit = names.find((n) => streq(input, n));
  if (hit === undefined) throw new Refusal("EINVAL", `invalid value ${JSON.stringify(input)} for ${what}`);
  return hit;
}

const boolAttr = (initial = "0"): AttrSpec => ({
  initial: () => show(initial),
  store: async (input) => show(kstrtobool(input) ? 1 : 0),
});

/** Namespace attributes that only change while the namespace is disabled. */
async function nsDisabled(ctx: AttrContext, code: ErrnoCode, what: string): Promise<void> {
  if ((await ctx.sibling("enable")) === "1")
    throw new Refusal(code, `disable the namespace before changing ${what}`);
}

/** Port attributes only change while no subsystem is linked (the kernel: -EACCES). */
async function portDisabled(ctx: AttrContext, what: string): Promise<void> {
  if (await ctx.portEnabled()) throw new Refusal("EACCES", `disable the port before changing ${what}`);
}

const TRTYPES = ["rdma", "fc", "tcp", "pci", "loop"] as const;
const ADRFAMS = ["ipv4", "ipv6", "ib", "fc", "pci", "loop"] as const;
const TREQS = ["not specified", "required", "not required"] as const;
const ANA_STATES = ["optimized", "non-optimized", "inaccessible", "persistent-loss", "change"] as const;

function uuidShown(bytes: Uint8Array): string {
  const h = Buffer.from(bytes).toString("hex");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** Shared by ports and referrals: the discovery address attributes. */
function addressAttrs(): Record<string, AttrSpec> {
  return {
    addr_adrfam: {
      initial: () => show(""),
      store: async (input, ctx) => {
        await portDisabled(ctx, "addr_adrfam");
        return show(oneOf(input, ADRFAMS, "adrfam"));
      },
    },
    addr_treq: {
      initial: () => show("not specified"),
      store: async (input, ctx) => {
        await portDisabled(ctx, "addr_treq");
        return show(oneOf(input, TREQS, "treq"));
      },
    },
    addr_traddr: {
      initial: () => show(""),
      store: async (input, ctx) => {
        if (input.length > 256) throw new Refusal("EINVAL", "traddr longer than 256 bytes");
        await portDisabled(ctx, "addr_traddr");
        return show(scanToken(input));
      },
    },
    addr_trsvcid: {
      initial: () => show(""),
      store: async (input, ctx) => {
        if (input.length > 32) throw new Refusal("EINVAL", "trsvcid longer than 32 bytes");
        await portDisabled(ctx, "addr_trsvcid");
        return show(scanToken(input));
      },
    },
    addr_trtype: {
      initial: () => show(""),
      store: async (input, ctx) => {
        await portDisabled(ctx, "addr_trtype");
        const t = oneOf(input, TRTYPES, "trtype");
        // Choosing a transport resets its transport-specific address subtype.
        const tsas = t === "rdma" ? "connected" : t === "tcp" ? "none" : "";
        return { value: show(t), siblings: { addr_tsas: show(tsas) } };
      },
    },
  };
}

/** Every attribute nvmet gives each item kind, by file name. */
export const ATTRIBUTES: Record<ItemKind, Record<string, AttrSpec>> = {
  root: {
    discovery_nqn: {
      initial: () => show("nqn.2014-08.org.nvmexpress.discovery"),
      store: async (input, ctx) => {
        const v = firstLine(input);
        if (v.length === 0 || v.length > 223)
          throw new Refusal("EINVAL", "discovery NQN must be 1-223 bytes");
        if ((await ctx.subsystemNames()).some((n) => n.startsWith(v))) {
          throw new Refusal("EINVAL", `duplicate NQN ${v}`);
        }
        return show(v);
      },
    },
  },
  subsystem: {
    attr_allow_any_host: {
      initial: () => show(0),
      store: async (input, ctx) => {
        const any = kstrtobool(input);
        if (any && (await ctx.allowedHostCount()) > 0) {
          throw new Refusal("EINVAL", "can't set allow_any_host when explicit hosts are set");
        }
        return show(any ? 1 : 0);
      },
    },
    attr_version: {
      initial: () => show("2.1"),
      store: async (input) => {
        const m = /^\s*(-?\d+)\.(-?\d+)(?:\.(-?\d+))?/.exec(input);
        if (!m) throw new Refusal("EINVAL", "version must be major.minor[.tertiary]");
        return show(m[3] && Number(m[3]) !== 0 ? `${m[1]}.${m[2]}.${m[3]}` : `${m[1]}.${m[2]}`);
      },
    },
    attr_serial: {
      // A random 64-bit number in hex; a stored serial is shown padded with spaces to 20 bytes.
      initial: () => show(randomBytes(8).toString("hex")),
      store: async (input) => show(asciiField(input, 20, "serial number").padEnd(20, " ")),
    },
    attr_cntlid_min: {
      initial: () => show(1),
      store: async (input, ctx) => {
        const v = scanU16(input);
        if (v === 0 || v > Number(await ctx.sibling("attr_cntlid_max")))
          throw new Refusal("EINVAL", "bad cntlid_min");
        return show(v);
      },
    },
    attr_cntlid_max: {
      initial: () => show(0xffef),
      store: async (input, ctx) => {
        const v = scanU16(input);
        if (v === 0 || v < Number(await ctx.sibling("attr_cntlid_min")))
          throw new Refusal("EINVAL", "bad cntlid_max");
        return show(v);
      },
    },
    attr_vendor_id: {
      initial: () => show("0x0"),
      store: async (input) => show(`0x${kstrtouint(input, 0xffff).toString(16)}`),
    },
    attr_subsys_vendor_id: {
      initial: () => show("0x0"),
      store: async (input) => show(`0x${kstrtouint(input, 0xffff).toString(16)}`),
    },
    attr_model: {
      initial: () => show("Linux"),
      store: async (input) => show(asciiField(input, 40, "model number")),
    },
    attr_qid_max: {
      initial: () => show(128),
      store: async (input) => {
        const v = scanU16(input);
        if (v < 1 || v > 128) throw new Refusal("EINVAL", "qid_max must be 1-128");
        return show(v);
      },
    },
    attr_ieee_oui: {
      initial: () => show("0x000000"),
      store: async (input) => {
        const v = kstrtouint(input, 0xffffffff);
        if (v >= 0x1000000) throw new Refusal("EINVAL", "IEEE OUI is 24 bits");
        return show(`0x${v.toString(16).padStart(6, "0")}`);
      },
    },
    attr_firmware: {
      initial: (env) => show(env.kernelRelease.slice(0, 8)),
      store: async (input) => show(asciiField(input, 8, "firmware revision")),
    },
    attr_pi_enable: boolAttr(),
  },
  namespace: {
    device_path: {
      // Unset, the kernel prints its NULL pointer with %s.
      initial: () => show("(null)"),
      store: async (input, ctx) => {
        await nsDisabled(ctx, "EBUSY", "device_path");
        const v = firstLine(input);
        if (v.length === 0) throw new Refusal("EINVAL", "empty device_path");
        return show(v);
      },
    },
    device_nguid: {
      initial: () => show("00000000-0000-0000-0000-000000000000"),
      store: async (input, ctx) => {
        await nsDisabled(ctx, "EBUSY", "device_nguid");
        const bytes: number[] = [];
        let s = input;
        for (let i = 0; i < 16; i++) {
          const m = /^([0-9a-f]{2})[-:]?/i.exec(s);
          if (!m) throw new Refusal("EINVAL", "NGUID is 16 hex bytes");
          bytes.push(Number.parseInt(m[1] as string, 16));
          s = s.slice(m[0].length);
        }
        return show(uuidShown(Uint8Array.from(bytes)));
      },
    },
    device_uuid: {
      initial: () => show(randomUUID()),
      store: async (input, ctx) => {
        await nsDisabled(ctx, "EBUSY", "device_uuid");
        const v = input.trim();
        if (!/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(v)) {
          throw new Refusal("EINVAL", "not a UUID");
        }
        return show(v.toLowerCase());
      },
    },
    ana_grpid: {
      initial: () => show(1),
      store: async (input) => {
        const v = kstrtouint(input, 0xffffffff);
        if (v < 1 || v > 128) throw new Refusal("EINVAL", "ana_grpid must be 1-128");
        return show(v);
      },
    },
    enable: {
      initial: () => show(0),
      store: async (input, ctx) => {
        if (!kstrtobool(input)) return show(0);
        if ((await ctx.sibling("enable")) === "1") return show(1);
        const path = await ctx.sibling("device_path");
        if (path === "(null)") throw new Refusal("EINVAL", "no device_path set");
        // Opening the block device, then the file, fails like a path lookup would.
        if (!(await ctx.deviceExists(path))) throw new Refusal("ENOENT", `failed to open ${path}`);
        return show(1);
      },
    },
    buffered_io: {
      initial: () => show(0),
      store: async (input, ctx) => {
        const v = kstrtobool(input);
        await nsDisabled(ctx, "EINVAL", "buffered_io");
        return show(v ? 1 : 0);
      },
    },
    revalidate_size: {
      initial: () => "",
      readable: false,
      store: async (input, ctx) => {
        if (!kstrtobool(input)) throw new Refusal("EINVAL", "write 1 to revalidate");
        if ((await ctx.sibling("enable")) !== "1")
          throw new Refusal("EINVAL", "enable the namespace before revalidate");
        return "";
      },
    },
    resv_enable: {
      initial: () => show(0),
      store: async (input, ctx) => {
        const v = kstrtobool(input);
        await nsDisabled(ctx, "EINVAL", "resv_enable");
        return show(v ? 1 : 0);
      },
    },
  },
  port: {
    ...addressAttrs(),
    addr_tsas: {
      initial: () => show(""),
      store: async (input, ctx) => {
        await portDisabled(ctx, "addr_tsas");
        const trtype = await ctx.sibling("addr_trtype");
        if (trtype === "rdma" && streq(input, "connected")) return show("connected");
        if (trtype === "tcp" && streq(input, "none")) return show("none");
        if (trtype === "tcp" && streq(input, "tls1.3"))
          throw new Refusal("EINVAL", "TLS keyring not configured");
        throw new Refusal("EINVAL", `invalid value ${JSON.stringify(input)} for tsas`);
      },
    },
    param_inline_data_size: {
      initial: () => show(-1),
      store: async (input, ctx) => {
        await portDisabled(ctx, "param_inline_data_size");
        return show(kstrtoint(input));
      },
    },
    param_max_queue_size: {
      initial: () => show(-1),
      store: async (input, ctx) => {
        await portDisabled(ctx, "param_max_queue_size");
        return show(kstrtoint(input));
      },
    },
    param_mdts: {
      initial: () => show(-1),
      store: async (input, ctx) => {
        await portDisabled(ctx, "param_mdts");
        const v = kstrtoint(input);
        if (v < 0 || v > 255) throw new Refusal("EINVAL", "mdts out of range");
        return show(v);
      },
    },
    param_pi_enable: {
      initial: () => show(0),
      store: async (input, ctx) => {
        const v = kstrtobool(input);
        await portDisabled(ctx, "param_pi_enable");
        return show(v ? 1 : 0);
      },
    },
  },
  referral: {
    ...addressAttrs(),
    addr_portid: {
      initial: () => show(0),
      store: async (input, ctx) => {
        const v = kstrtouint(input, 0xffff);
        await portDisabled(ctx, "addr_portid");
        return show(v);
      },
    },
    enable: boolAttr(),
  },
  host: {
    dhchap_key: {
      initial: () => show(""),
      store: async (input) => {
        const v = firstLine(input);
        if (!v.startsWith("DHHC-1:")) throw new Refusal("EINVAL", "DH-HMAC-CHAP keys start with DHHC-1:");
        return show(v);
      },
    },
    dhchap_ctrl_key: {
      initial: () => show(""),
      store: async (input) => {
        const v = firstLine(input);
        if (!v.startsWith("DHHC-1:")) throw new Refusal("EINVAL", "DH-HMAC-CHAP keys start with DHHC-1:");
        return show(v);
      },
    },
    dhchap_hash: {
      initial: () => show("hmac(sha256)"),
      store: async (input) =>
        show(oneOf(input, ["hmac(sha256)", "hmac(sha384)", "hmac(sha512)"], "dhchap_hash")),
    },
    dhchap_dhgroup: {
      initial: () => show("null"),
      store: async (input) =>
        show(
          oneOf(
            input,
            ["null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192"],
            "dhchap_dhgroup",
          ),
        ),
    },
  },
  ana_group: {
    ana_state: {
      initial: () => show("inaccessible"),
      store: async (input) => show(oneOf(input, ANA_STATES, "ana_state")),
    },
  },
};

/** Whether a port's addresses could be bound: the transport's add_port checks. */
export function listenable(
  trtype: string,
  adrfam: string,
  traddr: string,
  trsvcid: string,
): string | undefined {
  if (!trtype) return "no transport type set";
  if (trtype !== "rdma" && trtype !== "tcp") return undefined;
  if (adrfam !== "ipv4" && adrfam !== "ipv6") return `address family ${JSON.stringify(adrfam)} not supported`;
  const ok = adrfam === "ipv4" ? isIPv4(traddr) : isIPv6(traddr);
  const port = /^\d+$/.test(trsvcid) ? Number(trsvcid) : -1;
  if (!ok || port < 0 || port > 65535) return `malformed ip/port passed: ${traddr}:${trsvcid}`;
  return undefined;
}

/** Validates the name of a new item in a group, as the group's make function does. */
export function checkItemName(kind: ItemKind, name: string): void {
  if (kind === "port") {
    try {
      kstrtouint(name, 0xffff);
    } catch {
      throw new Refusal("EINVAL", `invalid port id ${name}`);
    }
  }
  if (kind === "namespace") {
    const nsid = kstrtouint(name, 0xffffffff);
    if (nsid === 0 || nsid === 0xffffffff) throw new Refusal("EINVAL", `invalid nsid ${name}`);
  }
  if (kind === "ana_group") {
    const id = kstrtouint(name, 0xffffffff);
    if (id <= 1 || id > 128) throw new Refusal("EINVAL", `invalid ANA group ${name}`);
  }
  if (kind === "subsystem" && name === "nqn.2014-08.org.nvmexpress.discovery") {
    throw new Refusal("EINVAL", "can't create discovery subsystem through configfs");
  }
}
