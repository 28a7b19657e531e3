// A simulated storage host for discovery: writes the sysfs tree the kernel would show for given
// NVMe controllers and RDMA ports (PCI device directories, class symlinks, space-padded identify
// strings, 512-byte-sector sizes, multipath path/head disks), and answers the matching `lsblk` and
// `ip` commands through an Exec. Production code reads it through the same HostFs and Exec ports.
import { mkdirSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { StorageError } from "../../../lib/errors.ts";
import type { Exec, ExecResult } from "../../../lib/exec.ts";
import { type HostFs, hostFs } from "../../../lib/fs.ts";

/** One NVMe controller as the kernel nvme driver would register it. */
export interface SimController {
  /** Controller instance name, nvme<N>. */
  readonly name: string;
  readonly transport: "pcie" | "tcp" | "rdma";
  /** PCIe only: the function's address (written as given, so tests can feed odd spellings). */
  readonly pciAddress?: string;
  /** Fabrics only: target address and service id (defaults 192.168.100.20, 4420). */
  readonly traddr?: string;
  readonly trsvcid?: string;
  readonly subnqn?: string;
  /** Written into the 20-byte field: cut to 20 bytes and space-padded, exactly as the kernel prints it. */
  readonly serial: string;
  /** 40-byte field, same treatment. */
  readonly model: string;
  readonly firmware?: string;
  /** Default -1 (what the kernel prints without NUMA). */
  readonly numaNode?: number;
  /** Controller state attribute; default live. */
  readonly state?: string;
  /** Size of namespace 1; omitted: the controller has no namespace 1 (unless `namespaces` says otherwise). */
  readonly ns1Bytes?: number;
  /**
   * Namespaces in the order the kernel found them (the disk's trailing number is this order, not the
   * NSID). Overrides ns1Bytes when given.
   */
  readonly namespaces?: readonly { readonly nsid: number; readonly bytes: number }[];
  /** A partition on the first namespace is mounted (true: at /var/lib/sim/<name>; string: there). */
  readonly mounted?: boolean | string;
  /** Native multipath disks (hidden nvme<S>c<C>n<H> path plus nvme<S>n<H> head); default: fabrics only. */
  readonly multipath?: boolean;
}

/** One RDMA port with the network interface carrying it. */
export interface SimRdmaPort {
  /** mlx5_0, rxe0... */
  readonly device: string;
  /** Default 1. */
  readonly port?: number;
  readonly state: "ACTIVE" | "DOWN" | "INIT" | "ARMED";
  /** A rate the IB speed table can express (2.5, 10, 25, 40, 50, 56, 100, 200, 400...). */
  readonly rateGbps: number;
  /** Default Ethernet (RoCE); InfiniBand ports find their IPoIB netdev through the PCI function. */
  readonly linkLayer?: "Ethernet" | "InfiniBand";
  readonly netdev: string;
  /** "ip/prefix", IPv4 or IPv6; several for secondary addresses. */
  readonly address?: string | readonly string[];
  /** ip's operstate; default UP when the port is ACTIVE, DOWN otherwise. */
  readonly operstate?: string;
}

export interface SimHostSpec {
  readonly controllers?: readonly SimController[];
  readonly rdma?: readonly SimRdmaPort[];
  /** A SATA disk holding / and /boot/efi, as most hosts have; default true. */
  readonly rootDisk?: boolean;
}

const LSBLK = ["lsblk", "-J", "-o", "NAME,MOUNTPOINTS"];
const SECTOR = 512;

function ctrlInstance(name: string): number {
  const m = /^nvme(\d+)$/.exec(name);
  if (!m) throw new Error(`sim: controller name ${JSON.stringify(name)} is not nvme<N>`);
  return Number(m[1]);
}

/** A fixed-width NVMe identify field: UTF-8 bytes cut to `width`, space-padded. */
function identifyField(value: string, width: number): Buffer {
  const out = Buffer.alloc(width, 0x20);
  Buffer.from(value, "utf8").copy(out, 0, 0, width);
  return out;
}

// Per-lane rates of the IB speeds, and the widths tried (4X first: what most HCAs report).
const SPEEDS: readonly [string, number][] = [
  ["SDR", 2.5],
  ["DDR", 5],
  ["QDR", 10],
  ["FDR", 14],
  ["EDR", 25],
  ["HDR", 50],
  ["NDR", 100],
  ["XDR", 200],
];
const WIDTHS = [4, 1, 2, 8, 12];

/** The kernel's rate attribute text for `gbps`, e.g. "100 Gb/sec (4X EDR)". */
export function rateText(gbps: number): string {
  for (const w of WIDTHS) {
    for (const [name, lane] of SPEEDS) {
      if (Math.abs(w * lane - gbps) < 1e-9) {
        const whole = Math.floor(gbps);
        return `${whole}${gbps !== whole ? ".5" : ""} Gb/sec (${w}X ${name})`;
      }
    }
  }
  throw new Error(`sim: ${gbps} Gb/s is not a width x speed the kernel can report`);
}

function macFor(i: number): string {
  return `b8:ce:f6:00:${((i >> 8) & 0xff).toString(16).padStart(2, "0")}:${(i & 0xff).toString(16).padStart(2, "0")}`;
}

/** The EUI-64 link-local IPv6 address the kernel derives from a MAC. */
function linkLocal(mac: string): string {
  const b = mac.split(":").map((x) => Number.parseInt(x, 16));
  const at = (i: number) => b[i] ?? 0;
  const groups = [
    ((at(0) ^ 0x02) << 8) | at(1),
    (at(2) << 8) | 0xff,
    (0xfe << 8) | at(3),
    (at(4) << 8) | at(5),
  ];
  return `fe80::${groups.map((g) => g.toString(16)).join(":")}`;
}

/**
 * A simulated host rooted at `root`. `fs` and `exec` are what discovery is given; rebuild() swaps
 * the hardware (a drive pulled, a port going down) in place, so ports handed out stay valid.
 */
export class SimSysfs {
  readonly fs: HostFs;
  readonly exec: Exec;
  #spec: SimHostSpec = {};
  #minor = 0;

  constructor(readonly root: string) {
    this.fs = hostFs(root);
    this.exec = { run: (argv) => this.#run(argv) };
  }

  get spec(): SimHostSpec {
    return this.#spec;
  }

  /** Replaces the whole simulated /sys with one for `spec`. */
  async rebuild(spec: SimHostSpec): Promise<void> {
    rmSync(join(this.root, "sys"), { recursive: true, force: true });
    this.#spec = spec;
    this.#minor = 0;
    await this.#mkdir("/sys/bus/pci/drivers/nvme");
    await this.#mkdir("/sys/class/nvme");
    await this.#mkdir("/sys/class/block");
    await this.#mkdir("/sys/block");
    for (const c of spec.controllers ?? []) await this.#controller(c);
    await this.#rdma(spec.rdma ?? []);
  }

  /** What `lsblk -J -o NAME,MOUNTPOINTS` prints on this host (util-linux layout, 3-space indent). */
  lsblkJson(): string {
    const devices: { name: string; mountpoints: (string | null)[]; children?: unknown[] }[] = [];
    if (this.#spec.rootDisk !== false) {
      devices.push({
        name: "sda",
        mountpoints: [null],
        children: [
          { name: "sda1", mountpoints: ["/boot/efi"] },
          { name: "sda2", mountpoints: ["/"] },
        ],
      });
    }
    for (const c of this.#spec.controllers ?? []) {
      this.#disks(c).forEach((d, i) => {
        const mountpoint = i === 0 ? this.#mountpoint(c) : undefined;
        devices.push({
          name: d.visible,
          mountpoints: [null],
          ...(mountpoint ? { children: [{ name: `${d.visible}p1`, mountpoints: [mountpoint] }] } : {}),
        });
      });
    }
    devices.sort((a, b) => a.name.localeCompare(b.name));
    return `${JSON.stringify({ blockdevices: devices }, null, 3)}\n`;
  }

  /** What `ip -j addr show dev <ifname>` prints, or undefined when there is no such interface. */
  ipAddrJson(ifname: string): string | undefined {
    const ports = this.#spec.rdma ?? [];
    const index = [...new Set(ports.map((p) => p.netdev))].indexOf(ifname);
    const port = ports.find((p) => p.netdev === ifname);
    if (!port || index < 0) return undefined;
    const ib = port.linkLayer === "InfiniBand";
    const mac = macFor(index + 1);
    const operstate = port.operstate ?? (port.state === "ACTIVE" ? "UP" : "DOWN");
    const addrs =
      port.address === undefined ? [] : typeof port.address === "string" ? [port.address] : port.address;
    const addrInfo: Record<string, unknown>[] = [];
    let v4 = 0;
    for (const a of addrs) {
      const [local = "", prefix = "24"] = a.split("/");
      const v6 = local.includes(":");
      addrInfo.push({
        family: v6 ? "inet6" : "inet",
        local,
        prefixlen: Number(prefix),
        ...(v6 ? {} : v4++ > 0 ? { secondary: true } : {}),
        scope: "global",
        ...(v6 ? {} : { label: ifname }),
        valid_life_time: 4294967295,
        preferred_life_time: 4294967295,
      });
    }
    if (!ib) {
      addrInfo.push({
        family: "inet6",
        local: linkLocal(mac),
        prefixlen: 64,
        scope: "link",
        valid_life_time: 4294967295,
        preferred_life_time: 4294967295,
      });
    }
    const flags =
      operstate === "UP" ? ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"] : ["BROADCAST", "MULTICAST"];
    return JSON.stringify([
      {
        ifindex: index + 4,
        ifname,
        flags,
        mtu: ib ? 2044 : 9000,
        qdisc: "mq",
        operstate,
        group: "default",
        txqlen: ib ? 256 : 1000,
        link_type: ib ? "infiniband" : "ether",
        address: ib ? `00:00:10:87:fe:80:00:00:00:00:00:00:${mac}:00:01` : mac,
        broadcast: ib ? "00:ff:ff:ff:ff:12:40:1b:ff:ff:00:00:00:00:00:00:ff:ff:ff:ff" : "ff:ff:ff:ff:ff:ff",
        addr_info: addrInfo,
      },
    ]);
  }

  async #run(argv: readonly string[]): Promise<ExecResult> {
    if (argv.length === LSBLK.length && argv.every((a, i) => a === LSBLK[i])) {
      return { code: 0, stdout: this.lsblkJson(), stderr: "" };
    }
    if (argv.length === 6 && argv[0] === "ip" && argv.slice(1, 5).join(" ") === "-j addr show dev") {
      const out = this.ipAddrJson(argv[5] as string);
      return out === undefined
        ? { code: 1, stdout: "", stderr: `Device "${argv[5]}" does not exist.\n` }
        : { code: 0, stdout: `${out}\n`, stderr: "" };
    }
    throw new StorageError("unavailable", `cannot run ${argv.join(" ")}: not part of the simulated host`);
  }

  #mountpoint(c: SimController): string | undefined {
    if (!c.mounted) return undefined;
    return typeof c.mounted === "string" ? c.mounted : `/var/lib/sim/${c.name}`;
  }

  #namespaces(c: SimController): readonly { nsid: number; bytes: number }[] {
    return c.namespaces ?? (c.ns1Bytes === undefined ? [] : [{ nsid: 1, bytes: c.ns1Bytes }]);
  }

  /** Disk names per namespace: the entry under the controller and the one lsblk shows. */
  #disks(c: SimController): { entry: string; visible: string; nsid: number; bytes: number }[] {
    const n = ctrlInstance(c.name);
    const mpath = c.multipath ?? c.transport !== "pcie";
    return this.#namespaces(c).map((ns, i) => ({
      entry: mpath ? `nvme${n}c${n}n${i + 1}` : `nvme${n}n${i + 1}`,
      visible: `nvme${n}n${i + 1}`,
      ...ns,
    }));
  }

  // Synchronous on purpose: a tree is hundreds of tiny files, and tests rebuild it often.
  async #mkdir(path: string): Promise<void> {
    mkdirSync(join(this.root, path), { recursive: true });
  }

  async #write(path: string, data: string | Buffer): Promise<void> {
    mkdirSync(join(this.root, dirname(path)), { recursive: true });
    writeFileSync(
      join(this.root, path),
      typeof data === "string" ? `${data}\n` : Buffer.concat([data, Buffer.from("\n")]),
    );
  }

  /** A relative symlink, as sysfs uses, so the tree works under any root. */
  async #link(path: string, target: string, spelled = relative(dirname(path), target)): Promise<void> {
    mkdirSync(join(this.root, dirname(path)), { recursive: true });
    symlinkSync(spelled, join(this.root, path));
  }

  async #controller(c: SimController): Promise<void> {
    const n = ctrlInstance(c.name);
    let dir: string;
    let address: string;
    if (c.transport === "pcie") {
      if (!c.pciAddress) throw new Error(`sim: PCIe controller ${c.name} needs a pciAddress`);
      const domain =
        c.pciAddress.includes(":") && c.pciAddress.split(":").length === 3
          ? c.pciAddress.split(":")[0]
          : "0000";
      const pciDir = `/sys/devices/pci${domain}:00/${domain}:00:01.${n % 8}/${c.pciAddress}`;
      dir = `${pciDir}/nvme/${c.name}`;
      address = c.pciAddress;
      await this.#write(`${pciDir}/vendor`, "0x144d");
      await this.#write(`${pciDir}/device`, "0xa80a");
      await this.#write(`${pciDir}/class`, "0x010802");
      await this.#write(`${pciDir}/numa_node`, String(c.numaNode ?? -1));
      await this.#link(`${pciDir}/driver`, "/sys/bus/pci/drivers/nvme");
      // The kernel spells it through the parent: ../../../<pci> from <pci>/nvme/nvmeX.
      await this.#link(`${dir}/device`, pciDir, `../../../${c.pciAddress}`);
    } else {
      dir = `/sys/devices/virtual/nvme-fabrics/ctl/${c.name}`;
      const traddr = c.traddr ?? "192.168.100.20";
      const svc = c.trsvcid ?? "4420";
      address =
        c.transport === "tcp"
          ? `traddr=${traddr},trsvcid=${svc},src_addr=192.168.100.10`
          : `traddr=${traddr},trsvcid=${svc}`;
      await this.#write(
        `${dir}/hostnqn`,
        "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555",
      );
      await this.#write(`${dir}/ctrl_loss_tmo`, "600");
      await this.#write(`${dir}/reconnect_delay`, "10");
      await this.#write(`${dir}/fast_io_fail_tmo`, "off");
    }
    const subnqn =
      c.subnqn ??
      (c.transport === "pcie"
        ? `nqn.2014.08.org.nvmexpress:144d144d${identifyField(c.serial, 20).toString("latin1")}${identifyField(c.model, 40).toString("latin1")}`
        : "nqn.2026-02.io.distort:volume-sim");
    await this.#write(`${dir}/transport`, c.transport);
    await this.#write(`${dir}/address`, address);
    await this.#write(`${dir}/serial`, identifyField(c.serial, 20));
    await this.#write(`${dir}/model`, identifyField(c.model, 40));
    await this.#write(`${dir}/firmware_rev`, identifyField(c.firmware ?? "GDC5902Q", 8));
    await this.#write(`${dir}/numa_node`, String(c.transport === "pcie" ? (c.numaNode ?? -1) : -1));
    await this.#write(`${dir}/state`, c.state ?? "live");
    await this.#write(`${dir}/cntlid`, c.transport === "pcie" ? "6" : "1");
    await this.#write(`${dir}/cntrltype`, "io");
    await this.#write(`${dir}/dctype`, "none");
    await this.#write(`${dir}/queue_count`, "33");
    await this.#write(`${dir}/sqsize`, "1023");
    await this.#write(`${dir}/kato`, c.transport === "pcie" ? "0" : "5");
    await this.#write(`${dir}/subsysnqn`, subnqn);
    await this.#write(`${dir}/dev`, `240:${n}`);
    await this.#link(`/sys/class/nvme/${c.name}`, dir);

    const subsysDir = `/sys/devices/virtual/nvme-subsystem/nvme-subsys${n}`;
    await this.#write(`${subsysDir}/subsysnqn`, subnqn);
    await this.#write(`${subsysDir}/iopolicy`, "numa");
    await this.#link(`${subsysDir}/${c.name}`, dir);
    await this.#link(`/sys/class/nvme-subsystem/nvme-subsys${n}`, subsysDir);

    const mountpoint = this.#mountpoint(c);
    for (const [i, d] of this.#disks(c).entries()) {
      if (d.bytes % SECTOR !== 0)
        throw new Error(`sim: namespace size ${d.bytes} is not a multiple of ${SECTOR}`);
      const hidden = d.entry !== d.visible;
      await this.#disk(`${dir}/${d.entry}`, d.entry, d.nsid, d.bytes, hidden);
      let visibleDir = `${dir}/${d.entry}`;
      if (hidden) {
        visibleDir = `${subsysDir}/${d.visible}`;
        await this.#disk(visibleDir, d.visible, d.nsid, d.bytes, false);
      }
      if (i === 0 && mountpoint) {
        const part = `${d.visible}p1`;
        const partDir = `${visibleDir}/${part}`;
        await this.#write(`${partDir}/partition`, "1");
        await this.#write(`${partDir}/start`, "2048");
        await this.#write(`${partDir}/size`, String(d.bytes / SECTOR - 4096));
        await this.#write(`${partDir}/dev`, `259:${this.#minor++}`);
        await this.#link(`/sys/class/block/${part}`, partDir);
      }
    }
  }

  async #disk(dir: string, name: string, nsid: number, bytes: number, hidden: boolean): Promise<void> {
    const id = `${nsid.toString(16).padStart(4, "0")}${name.length.toString(16)}`.padEnd(16, "0");
    await this.#write(`${dir}/size`, String(bytes / SECTOR));
    await this.#write(`${dir}/nsid`, String(nsid));
    await this.#write(`${dir}/wwid`, `eui.${id}`);
    await this.#write(
      `${dir}/nguid`,
      `${id}${id}`.replace(/(.{8})(.{4})(.{4})(.{4})(.{12})/, "$1-$2-$3-$4-$5"),
    );
    await this.#write(`${dir}/ro`, "0");
    await this.#write(`${dir}/removable`, "0");
    await this.#write(`${dir}/hidden`, hidden ? "1" : "0");
    await this.#write(`${dir}/dev`, `259:${this.#minor++}`);
    await this.#write(`${dir}/queue/logical_block_size`, "512");
    await this.#write(`${dir}/queue/physical_block_size`, "4096");
    await this.#link(`/sys/class/block/${name}`, dir);
    await this.#link(`/sys/block/${name}`, dir);
  }

  async #rdma(ports: readonly SimRdmaPort[]): Promise<void> {
    const devices = [...new Set(ports.map((p) => p.device))];
    const netdevs = [...new Set(ports.map((p) => p.netdev))];
    for (const [d, device] of devices.entries()) {
      const bus = (0x5e + Math.floor(d / 8)).toString(16);
      const pciDir = `/sys/devices/pci0000:5d/0000:5d:00.0/0000:${bus}:00.${d % 8}`;
      const ibDir = `${pciDir}/infiniband/${device}`;
      await this.#write(`${pciDir}/vendor`, "0x15b3");
      await this.#write(`${pciDir}/numa_node`, "0");
      await this.#write(`${ibDir}/node_type`, "1: CA");
      await this.#write(`${ibDir}/node_guid`, `b8ce:f603:0000:${d.toString(16).padStart(4, "0")}`);
      await this.#write(`${ibDir}/fw_ver`, "20.39.1002");
      await this.#write(`${ibDir}/hca_type`, "MT4123");
      await this.#link(`${ibDir}/device`, pciDir, `../../../${pciDir.split("/").at(-1)}`);
      await this.#link(`/sys/class/infiniband/${device}`, ibDir);
      for (const p of ports.filter((x) => x.device === device)) {
        const portDir = `${ibDir}/ports/${p.port ?? 1}`;
        const states = { DOWN: 1, INIT: 2, ARMED: 3, ACTIVE: 4 } as const;
        const ib = p.linkLayer === "InfiniBand";
        const mac = macFor(netdevs.indexOf(p.netdev) + 1);
        await this.#write(`${portDir}/state`, `${states[p.state]}: ${p.state}`);
        await this.#write(`${portDir}/phys_state`, p.state === "DOWN" ? "3: Disabled" : "5: LinkUp");
        await this.#write(`${portDir}/rate`, rateText(p.rateGbps));
        await this.#write(`${portDir}/link_layer`, ib ? "InfiniBand" : "Ethernet");
        await this.#write(`${portDir}/lid`, ib ? "0x11" : "0x0");
        await this.#write(`${portDir}/sm_lid`, ib ? "0x1" : "0x0");
        await this.#write(`${portDir}/cap_mask`, ib ? "0xa651e848" : "0x00010000");
        const ll = ib
          ? `fe80:0000:0000:0000:b8ce:f603:0000:${d.toString(16).padStart(4, "0")}`
          : linkLocal(mac);
        const gids: [string, string][] = ib
          ? [[ll, ""]]
          : [
              [ll, "IB/RoCE v1"],
              [ll, "RoCE v2"],
            ];
        const v4 = (typeof p.address === "string" ? [p.address] : (p.address ?? [])).find(
          (a) => !a.includes(":"),
        );
        if (!ib && v4) {
          const mapped = `::ffff:${v4.split("/")[0]}`;
          gids.push([mapped, "IB/RoCE v1"], [mapped, "RoCE v2"]);
        }
        for (const [i, [gid, type]] of gids.entries()) {
          await this.#write(`${portDir}/gids/${i}`, gid);
          // InfiniBand GIDs have no netdev: their ndevs entries fail to read, so none are written.
          if (!ib) {
            await this.#write(`${portDir}/gid_attrs/ndevs/${i}`, p.netdev);
            await this.#write(`${portDir}/gid_attrs/types/${i}`, type);
          }
        }
        const netDir = `${pciDir}/net/${p.netdev}`;
        if (!(await this.fs.exists(netDir))) {
          const up = (p.operstate ?? (p.state === "ACTIVE" ? "UP" : "DOWN")) === "UP";
          await this.#write(`${netDir}/operstate`, up ? "up" : "down");
          await this.#write(`${netDir}/address`, mac);
          await this.#write(`${netDir}/mtu`, ib ? "2044" : "9000");
          await this.#write(`${netDir}/type`, ib ? "32" : "1");
          await this.#write(`${netDir}/ifindex`, String(netdevs.indexOf(p.netdev) + 4));
          await this.#link(`/sys/class/net/${p.netdev}`, netDir);
        }
      }
    }
  }
}

/** Builds a simulated host under `root` (created if needed; its sys/ replaced). */
export async function buildSysfs(root: string, spec: SimHostSpec): Promise<SimSysfs> {
  mkdirSync(root, { recursive: true });
  const sim = new SimSysfs(root);
  await sim.rebuild(spec);
  return sim;
}
