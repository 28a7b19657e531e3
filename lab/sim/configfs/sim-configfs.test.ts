// Tests for the simulated nvmet configfs: each kernel rule it claims to reproduce, as a failing and
// a succeeding operation, over a fresh temporary directory per test.
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { mkdir, mkdtemp, readlink, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SimConfigfs, simConfigfs } from "./sim-configfs.ts";

const N = "/sys/kernel/config/nvmet";
const NQN = "nqn.2026-02.io.distort:volume-vol-1";
const HOST = "nqn.2014-08.org.nvmexpress:uuid:6b4e0f5c-3f3b-4b0e-9d55-0c8f1d2b7a11";
const sub = `${N}/subsystems/${NQN}`;
const ns = `${sub}/namespaces/1`;

let root: string;
let fs: SimConfigfs;

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "sim-configfs-"));
  await mkdir(join(root, "dev"));
  await writeFile(join(root, "dev/nvme0n1p1"), "");
  fs = simConfigfs(root);
});

afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

/** Resolves to the errno code the promise rejects with; fails the test if it resolves. */
async function errno(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    return (err as { code?: string }).code ?? `no code: ${(err as Error).message}`;
  }
  throw new Error("expected the operation to fail");
}

/** A port with a complete TCP listener on 10.0.0.5:4420. */
async function makePort(id: string, addr = "10.0.0.5"): Promise<string> {
  const p = `${N}/ports/${id}`;
  await fs.mkdir(p);
  await fs.writeFile(`${p}/addr_trtype`, "tcp");
  await fs.writeFile(`${p}/addr_adrfam`, "ipv4");
  await fs.writeFile(`${p}/addr_traddr`, addr);
  await fs.writeFile(`${p}/addr_trsvcid`, "4420");
  return p;
}

describe("module loading", () => {
  test("a loaded nvmet shows its three groups and the discovery NQN", async () => {
    expect((await fs.readdir(N)).sort()).toEqual(["discovery_nqn", "hosts", "ports", "subsystems"]);
    expect(await fs.readFile(`${N}/discovery_nqn`)).toBe("nqn.2014-08.org.nvmexpress.discovery\n");
  });

  test("loaded: false has no nvmet directory until loadNvmet()", async () => {
    const cold = simConfigfs(root, { configfsRoot: "/cold/config", loaded: false });
    expect(await cold.isDirectory("/cold/config")).toBe(true);
    expect(await cold.exists("/cold/config/nvmet")).toBe(false);
    expect(await errno(cold.mkdir("/cold/config/nvmet"))).toBe("EPERM");
    await cold.loadNvmet();
    await cold.loadNvmet();
    expect(await cold.isDirectory("/cold/config/nvmet/subsystems")).toBe(true);
  });

  test("paths outside configfs behave like a plain directory", async () => {
    await fs.mkdir("/sys/class");
    await fs.writeFile("/sys/class/x", "1");
    expect(await fs.readFile("/sys/class/x")).toBe("1");
    await fs.unlink("/sys/class/x");
    await fs.rmdir("/sys/class");
    expect(await fs.exists("/sys/class")).toBe(false);
  });
});

describe("items and their attributes", () => {
  test("mkdir of a subsystem creates the kernel's attributes and default groups", async () => {
    await fs.mkdir(sub);
    expect((await fs.readdir(sub)).sort()).toEqual([
      "allowed_hosts",
      "attr_allow_any_host",
      "attr_cntlid_max",
      "attr_cntlid_min",
      "attr_firmware",
      "attr_ieee_oui",
      "attr_model",
      "attr_pi_enable",
      "attr_qid_max",
      "attr_serial",
      "attr_subsys_vendor_id",
      "attr_vendor_id",
      "attr_version",
      "namespaces",
    ]);
    expect(await fs.readFile(`${sub}/attr_allow_any_host`)).toBe("0\n");
    expect(await fs.readFile(`${sub}/attr_serial`)).toMatch(/^[0-9a-f]{16}\n$/);
    expect(await fs.readFile(`${sub}/attr_model`)).toBe("Linux\n");
    expect(await fs.readFile(`${sub}/attr_firmware`)).toBe("6.12.0\n");
    expect(await fs.readdir(`${sub}/namespaces`)).toEqual([]);
    expect(await errno(fs.mkdir(sub))).toBe("EEXIST");
  });

  test("the discovery NQN cannot be a subsystem; a missing parent is ENOENT", async () => {
    expect(await errno(fs.mkdir(`${N}/subsystems/nqn.2014-08.org.nvmexpress.discovery`))).toBe("EINVAL");
    expect(await errno(fs.mkdir(`${N}/subsystems/${NQN}/namespaces/1`))).toBe("ENOENT");
  });

  test("namespace ids are checked like kstrtou32 plus the reserved values", async () => {
    await fs.mkdir(sub);
    expect(await errno(fs.mkdir(`${sub}/namespaces/0`))).toBe("EINVAL");
    expect(await errno(fs.mkdir(`${sub}/namespaces/0xffffffff`))).toBe("EINVAL");
    expect(await errno(fs.mkdir(`${sub}/namespaces/one`))).toBe("EINVAL");
    expect(await errno(fs.mkdir(`${sub}/namespaces/4294967296`))).toBe("ERANGE");
    await fs.mkdir(ns);
    expect(await fs.readFile(`${ns}/device_path`)).toBe("(null)\n");
    expect(await fs.readFile(`${ns}/enable`)).toBe("0\n");
    expect(await fs.readFile(`${ns}/device_uuid`)).toMatch(/^[0-9a-f-]{36}\n$/);
  });

  test("port ids are u16; a port starts with empty addresses and ANA group 1", async () => {
    expect(await errno(fs.mkdir(`${N}/ports/65536`))).toBe("EINVAL");
    expect(await errno(fs.mkdir(`${N}/ports/p1`))).toBe("EINVAL");
    await fs.mkdir(`${N}/ports/1`);
    expect(await fs.readFile(`${N}/ports/1/addr_trtype`)).toBe("\n");
    expect(await fs.readFile(`${N}/ports/1/addr_treq`)).toBe("not specified\n");
    expect(await fs.readFile(`${N}/ports/1/param_inline_data_size`)).toBe("-1\n");
    expect(await fs.readFile(`${N}/ports/1/ana_groups/1/ana_state`)).toBe("optimized\n");
    expect(await errno(fs.rmdir(`${N}/ports/1/ana_groups/1`))).toBe("EPERM");
  });

  test("attribute files cannot be created or removed; items are only made in groups", async () => {
    await fs.mkdir(sub);
    await fs.mkdir(ns);
    expect(await errno(fs.writeFile(`${sub}/attr_bogus`, "1"))).toBe("EACCES");
    expect(await errno(fs.writeFile(`${sub}/namespaces/notes`, "x"))).toBe("EACCES");
    expect(await errno(fs.unlink(`${sub}/attr_serial`))).toBe("EPERM");
    expect(await errno(fs.rmdir(`${sub}/attr_serial`))).toBe("ENOTDIR");
    expect(await errno(fs.rmdir(`${sub}/namespaces`))).toBe("EPERM");
    expect(await errno(fs.mkdir(`${ns}/extra`))).toBe("EPERM");
    expect(await errno(fs.mkdir(`${sub}/allowed_hosts/${HOST}`))).toBe("EPERM");
    expect(await errno(fs.writeFile(`${sub}/namespaces`, "1"))).toBe("EISDIR");
    expect(await errno(fs.rmdir(N))).toBe("EPERM");
  });

  test("values are validated and shown the kernel's way", async () => {
    await fs.mkdir(sub);
    await fs.writeFile(`${sub}/attr_serial`, "abc");
    expect(await fs.readFile(`${sub}/attr_serial`)).toBe(`abc${" ".repeat(17)}\n`);
    expect(await errno(fs.writeFile(`${sub}/attr_serial`, "x".repeat(21)))).toBe("EINVAL");
    expect(await errno(fs.writeFile(`${sub}/attr_serial`, ""))).toBe("EINVAL");
    expect(await errno(fs.writeFile(`${sub}/attr_allow_any_host`, "maybe"))).toBe("EINVAL");
    await fs.writeFile(`${sub}/attr_allow_any_host`, "on");
    expect(await fs.readFile(`${sub}/attr_allow_any_host`)).toBe("1\n");
    await fs.writeFile(`${sub}/attr_vendor_id`, "0x15b3");
    expect(await fs.readFile(`${sub}/attr_vendor_id`)).toBe("0x15b3\n");
    expect(await errno(fs.writeFile(`${sub}/attr_qid_max`, "129"))).toBe("EINVAL");
    await fs.mkdir(ns);
    expect(await errno(fs.readFile(`${ns}/revalidate_size`))).toBe("EACCES");
  });
});

describe("namespaces", () => {
  beforeEach(async () => {
    await fs.mkdir(sub);
    await fs.mkdir(ns);
  });

  test("enable needs a device_path that exists", async () => {
    expect(await errno(fs.writeFile(`${ns}/enable`, "1"))).toBe("EINVAL");
    await fs.writeFile(`${ns}/device_path`, "/dev/nvme9n9");
    expect(await errno(fs.writeFile(`${ns}/enable`, "1"))).toBe("ENOENT");
    expect(await fs.readFile(`${ns}/enable`)).toBe("0\n");
    await fs.writeFile(`${ns}/device_path`, "/dev/nvme0n1p1\n");
    expect(await fs.readFile(`${ns}/device_path`)).toBe("/dev/nvme0n1p1\n");
    await fs.writeFile(`${ns}/enable`, "1");
    await fs.writeFile(`${ns}/enable`, "1");
    expect(await fs.readFile(`${ns}/enable`)).toBe("1\n");
  });

  test("device_path is fixed while enabled and cannot be emptied", async () => {
    await fs.writeFile(`${ns}/device_path`, "/dev/nvme0n1p1");
    await fs.writeFile(`${ns}/enable`, "1");
    expect(await errno(fs.writeFile(`${ns}/device_path`, "/dev/nvme0n1p2"))).toBe("EBUSY");
    expect(await errno(fs.writeFile(`${ns}/device_uuid`, "6b4e0f5c-3f3b-4b0e-9d55-0c8f1d2b7a11"))).toBe(
      "EBUSY",
    );
    await fs.writeFile(`${ns}/enable`, "0");
    expect(await errno(fs.writeFile(`${ns}/device_path`, "\n"))).toBe("EINVAL");
    await fs.writeFile(`${ns}/device_path`, "/dev/nvme0n1p2");
    expect(await fs.readFile(`${ns}/device_path`)).toBe("/dev/nvme0n1p2\n");
  });

  test("a custom deviceExists decides what nvmet can open", async () => {
    const opened: string[] = [];
    const custom = simConfigfs(root, {
      deviceExists: async (p) => {
        opened.push(p);
        return p === "/dev/real";
      },
    });
    await custom.writeFile(`${ns}/device_path`, "/dev/real");
    await custom.writeFile(`${ns}/enable`, "1");
    expect(opened).toEqual(["/dev/real"]);
  });

  test("a subsystem with a namespace cannot be removed; an enabled namespace can", async () => {
    await fs.writeFile(`${ns}/device_path`, "/dev/nvme0n1p1");
    await fs.writeFile(`${ns}/enable`, "1");
    expect(await errno(fs.rmdir(sub))).toBe("ENOTEMPTY");
    await fs.rmdir(ns);
    await fs.rmdir(sub);
    expect(await fs.readdir(`${N}/subsystems`)).toEqual([]);
  });
});

describe("ports and links", () => {
  beforeEach(async () => {
    await fs.mkdir(sub);
  });

  test("the first link needs a complete listener", async () => {
    await fs.mkdir(`${N}/ports/1`);
    expect(await errno(fs.symlink(sub, `${N}/ports/1/subsystems/${NQN}`))).toBe("EINVAL");
    await fs.writeFile(`${N}/ports/1/addr_trtype`, "rdma");
    expect(await fs.readFile(`${N}/ports/1/addr_tsas`)).toBe("connected\n");
    await fs.writeFile(`${N}/ports/1/addr_adrfam`, "ipv6");
    await fs.writeFile(`${N}/ports/1/addr_traddr`, "10.0.0.5");
    await fs.writeFile(`${N}/ports/1/addr_trsvcid`, "4420");
    expect(await errno(fs.symlink(sub, `${N}/ports/1/subsystems/${NQN}`))).toBe("EINVAL");
    await fs.writeFile(`${N}/ports/1/addr_adrfam`, "ipv4");
    await fs.symlink(sub, `${N}/ports/1/subsystems/${NQN}`);
    expect(await fs.readlink(`${N}/ports/1/subsystems/${NQN}`)).toBe(`../../../../nvmet/subsystems/${NQN}`);
    expect(await readlink(join(root, `${N}/ports/1/subsystems/${NQN}`))).toBe(
      `../../../../nvmet/subsystems/${NQN}`,
    );
  });

  test("unknown transports and families are refused", async () => {
    await fs.mkdir(`${N}/ports/1`);
    expect(await errno(fs.writeFile(`${N}/ports/1/addr_trtype`, "roce"))).toBe("EINVAL");
    expect(await errno(fs.writeFile(`${N}/ports/1/addr_adrfam`, "pcie"))).toBe("EINVAL");
    expect(await errno(fs.writeFile(`${N}/ports/1/addr_traddr`, "x".repeat(300)))).toBe("EINVAL");
  });

  test("addresses are read-only while a subsystem is linked", async () => {
    const port = await makePort("1");
    await fs.symlink(sub, `${port}/subsystems/${NQN}`);
    expect(await errno(fs.writeFile(`${port}/addr_traddr`, "10.0.0.6"))).toBe("EACCES");
    expect(await errno(fs.writeFile(`${port}/addr_trtype`, "rdma"))).toBe("EACCES");
    await fs.unlink(`${port}/subsystems/${NQN}`);
    await fs.writeFile(`${port}/addr_traddr`, "10.0.0.6");
    expect(await fs.readFile(`${port}/addr_traddr`)).toBe("10.0.0.6\n");
  });

  test("two enabled ports cannot listen on the same address", async () => {
    await fs.mkdir(`${N}/subsystems/${NQN}-2`);
    const a = await makePort("1");
    const b = await makePort("2");
    await fs.symlink(sub, `${a}/subsystems/${NQN}`);
    expect(await errno(fs.symlink(`${N}/subsystems/${NQN}-2`, `${b}/subsystems/x`))).toBe("EADDRINUSE");
    await fs.symlink(`${N}/subsystems/${NQN}-2`, `${a}/subsystems/${NQN}-2`);
  });

  test("links only join the right kinds of items, once", async () => {
    const port = await makePort("1");
    await fs.mkdir(`${N}/hosts/${HOST}`);
    expect(await errno(fs.symlink(`${N}/hosts/${HOST}`, `${port}/subsystems/h`))).toBe("EINVAL");
    expect(await errno(fs.symlink(sub, `${sub}/allowed_hosts/s`))).toBe("EINVAL");
    expect(await errno(fs.symlink(`${N}/hosts/${HOST}`, `${sub}/namespaces/h`))).toBe("EPERM");
    expect(await errno(fs.symlink(`${N}/hosts/${HOST}`, `${N}/hosts/alias`))).toBe("EPERM");
    expect(await errno(fs.symlink("/tmp", `${sub}/allowed_hosts/t`))).toBe("EPERM");
    expect(await errno(fs.symlink(`${N}/hosts/nobody`, `${sub}/allowed_hosts/nobody`))).toBe("ENOENT");
    expect(await errno(fs.symlink(`${sub}/attr_serial`, `${port}/subsystems/f`))).toBe("ENOTDIR");
    await fs.symlink(`../../../hosts/${HOST}`, `${sub}/allowed_hosts/${HOST}`);
    expect(await errno(fs.symlink(`${N}/hosts/${HOST}`, `${sub}/allowed_hosts/${HOST}`))).toBe("EEXIST");
    expect(await errno(fs.symlink(`${N}/hosts/${HOST}`, `${sub}/allowed_hosts/alias`))).toBe("EEXIST");
    expect(await fs.readlink(`${sub}/allowed_hosts/${HOST}`)).toBe(`../../../../nvmet/hosts/${HOST}`);
  });

  test("allow_any_host and explicit hosts exclude each other", async () => {
    await fs.mkdir(`${N}/hosts/${HOST}`);
    await fs.writeFile(`${sub}/attr_allow_any_host`, "1");
    expect(await errno(fs.symlink(`${N}/hosts/${HOST}`, `${sub}/allowed_hosts/${HOST}`))).toBe("EINVAL");
    await fs.writeFile(`${sub}/attr_allow_any_host`, "0");
    await fs.symlink(`${N}/hosts/${HOST}`, `${sub}/allowed_hosts/${HOST}`);
    expect(await errno(fs.writeFile(`${sub}/attr_allow_any_host`, "1"))).toBe("EINVAL");
  });

  test("linked items cannot be removed; the reverse order tears everything down", async () => {
    const port = await makePort("1");
    await fs.mkdir(`${N}/hosts/${HOST}`);
    await fs.symlink(`${N}/hosts/${HOST}`, `${sub}/allowed_hosts/${HOST}`);
    await fs.symlink(sub, `${port}/subsystems/${NQN}`);
    expect(await errno(fs.rmdir(sub))).toBe("EBUSY");
    expect(await errno(fs.rmdir(port))).toBe("ENOTEMPTY");
    expect(await errno(fs.rmdir(`${N}/hosts/${HOST}`))).toBe("EBUSY");
    expect(await errno(fs.unlink(`${sub}/allowed_hosts`))).toBe("EISDIR");
    await fs.unlink(`${port}/subsystems/${NQN}`);
    expect(await errno(fs.rmdir(sub))).toBe("ENOTEMPTY");
    await fs.unlink(`${sub}/allowed_hosts/${HOST}`);
    await fs.rmdir(sub);
    await fs.rmdir(`${N}/hosts/${HOST}`);
    await fs.rmdir(port);
    expect(await errno(fs.unlink(`${port}/subsystems/${NQN}`))).toBe("ENOENT");
    for (const g of ["subsystems", "ports", "hosts"]) expect(await fs.readdir(`${N}/${g}`)).toEqual([]);
  });

  test("a port with referrals is not empty", async () => {
    const port = await makePort("1");
    await fs.mkdir(`${port}/referrals/r1`);
    expect(await fs.readFile(`${port}/referrals/r1/enable`)).toBe("0\n");
    expect(await errno(fs.rmdir(port))).toBe("ENOTEMPTY");
    await fs.rmdir(`${port}/referrals/r1`);
    await fs.rmdir(port);
  });
});

test("the journal records successful mutations in order, and only those", async () => {
  await fs.mkdir(sub);
  await fs.mkdir(ns);
  await errno(fs.writeFile(`${ns}/enable`, "1"));
  await fs.writeFile(`${ns}/device_path`, "/dev/nvme0n1p1");
  await fs.writeFile(`${ns}/enable`, "1");
  const port = await makePort("3");
  await fs.symlink(sub, `${port}/subsystems/${NQN}`);
  await fs.unlink(`${port}/subsystems/${NQN}`);
  await fs.rmdir(port);
  expect(fs.journal).toEqual([
    `mkdir subsystems/${NQN}`,
    `mkdir subsystems/${NQN}/namespaces/1`,
    `write subsystems/${NQN}/namespaces/1/device_path "/dev/nvme0n1p1"`,
    `write subsystems/${NQN}/namespaces/1/enable "1"`,
    "mkdir ports/3",
    'write ports/3/addr_trtype "tcp"',
    'write ports/3/addr_adrfam "ipv4"',
    'write ports/3/addr_traddr "10.0.0.5"',
    'write ports/3/addr_trsvcid "4420"',
    `symlink ports/3/subsystems/${NQN} -> subsystems/${NQN}`,
    `unlink ports/3/subsystems/${NQN}`,
    "rmdir ports/3",
  ]);
});

test("onChange sees every successful mutation before the call returns, and its failure is not the caller's", async () => {
  const seen: string[] = [];
  let release: () => void = () => {};
  // Its own tree: two instances loading nvmet into one directory at once would race.
  await mkdir(join(root, "hooked"));
  const hooked = simConfigfs(join(root, "hooked"), {
    onChange: async (entry) => {
      seen.push(entry);
      if (entry.startsWith("symlink")) await new Promise<void>((r) => (release = r));
      if (entry.startsWith("unlink")) throw new Error("nvmet is gone");
    },
  });
  await hooked.mkdir(sub);
  await errno(hooked.mkdir(sub));
  const port = `${N}/ports/4`;
  await hooked.mkdir(port);
  for (const [a, v] of [
    ["addr_trtype", "tcp"],
    ["addr_adrfam", "ipv4"],
    ["addr_traddr", "10.0.0.6"],
    ["addr_trsvcid", "4420"],
  ] as const)
    await hooked.writeFile(`${port}/${a}`, v);
  let linked = false;
  const link = hooked.symlink(sub, `${port}/subsystems/${NQN}`).then(() => (linked = true));
  while (!seen.some((e) => e.startsWith("symlink"))) await Bun.sleep(1);
  // The "syscall" is still inside nvmet's callback.
  expect(linked).toBe(false);
  release();
  await link;
  await hooked.unlink(`${port}/subsystems/${NQN}`);
  expect(seen).toEqual([...hooked.journal]);
  expect(seen.at(-1)).toBe(`unlink ports/4/subsystems/${NQN}`);
});

test("operations are atomic with respect to each other", async () => {
  // Many concurrent mkdirs of one name: exactly one wins, the rest see EEXIST, never a half-made item.
  const results = await Promise.allSettled(Array.from({ length: 8 }, () => fs.mkdir(sub)));
  expect(results.filter((r) => r.status === "fulfilled")).toHaveLength(1);
  expect((await fs.readdir(sub)).length).toBe(14);
});
