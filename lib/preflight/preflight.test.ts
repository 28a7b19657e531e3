import { afterEach, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { StorageError } from "../errors.ts";
import type { Exec } from "../exec.ts";
import { hostFs } from "../fs.ts";
import { type PreflightReport, preflightExitCode, renderPreflight } from "./check.ts";
import { checkCoreMask, parseCpuList } from "./cpu.ts";
import { parseNvmeVersion } from "./nvme-cli.ts";
import { runPreflight } from "./preflight.ts";

const roots: string[] = [];
afterEach(() => {
  for (const r of roots.splice(0)) rmSync(r, { recursive: true, force: true });
});

/** A host tree: files with content, and directories (paths ending in "/"). */
function tree(entries: Record<string, string>): string {
  const root = mkdtempSync(join(tmpdir(), "preflight-"));
  roots.push(root);
  for (const [p, text] of Object.entries(entries)) {
    if (p.endsWith("/")) mkdirSync(join(root, p), { recursive: true });
    else {
      mkdirSync(dirname(join(root, p)), { recursive: true });
      writeFileSync(join(root, p), text);
    }
  }
  return root;
}

function nvme(stdout: string | null): Exec & { calls: string[][] } {
  const calls: string[][] = [];
  return {
    calls,
    async run(argv) {
      calls.push([...argv]);
      if (stdout === null) throw new StorageError("unavailable", "cannot run nvme: ENOENT");
      return { code: 0, stdout, stderr: "" };
    },
  };
}

const GOOD_HOST = {
  "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages": "1024\n",
  "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages": "1024\n",
  "proc/mounts": "hugetlbfs /dev/hugepages hugetlbfs rw 0 0\nconfigfs /sys/kernel/config configfs rw 0 0\n",
  "sys/devices/system/cpu/online": "0-3\n",
  "sys/module/vfio_pci/": "",
  "sys/kernel/iommu_groups/0/": "",
  "sys/kernel/iommu_groups/1/": "",
  "sys/kernel/config/nvmet/": "",
  "sys/module/nvmet/": "",
  "sys/module/nvmet_tcp/": "",
  "sys/module/nvme_fabrics/": "",
  "sys/module/nvme_tcp/": "",
  "sys/module/nvme_auth/": "",
  "sys/module/nvme_keyring/": "",
  "proc/sys/kernel/osrelease": "6.8.0\n",
  "proc/keys": "1f3a2b4c I--Q---     1 perm 3f030000     0     0 keyring   .nvme: empty\n",
};

const ids = (r: PreflightReport) => Object.fromEntries(r.checks.map((c) => [c.id, c.status]));

test("a well-prepared host passes every role; nvme version runs through the exec port", async () => {
  const exec = nvme("nvme version 2.8 (git 2.8)\nlibnvme version 1.8 (git 1.8)\n");
  const r = await runPreflight(
    {
      roles: ["spdk", "kernel-target", "initiator"],
      coreMask: "0x3",
      memSizeMiB: 1024,
      volumes: 10,
      spdkDrives: true,
    },
    { fs: hostFs(tree(GOOD_HOST)), exec },
  );
  expect(ids(r)).toEqual({
    hugepages: "pass",
    "cpu-cores": "pass",
    "userspace-driver": "pass",
    iommu: "pass",
    configfs: "pass",
    "module:nvmet": "pass",
    "module:nvmet_tcp": "pass",
    "module:nvme_fabrics": "pass",
    "module:nvme_tcp": "pass",
    "module:nvme_auth": "pass",
    "module:nvme_keyring": "pass",
    "nvme-tls": "pass",
    "nvme-cli": "pass",
  });
  expect(exec.calls).toEqual([["nvme", "version"]]);
  expect(r.worst).toBe("pass");
  expect(preflightExitCode(r)).toBe(0);
});

test("each missing piece is named with its fix, and the exit code follows the worst", async () => {
  const host: Record<string, string> = { ...GOOD_HOST };
  for (const k of [
    "sys/module/nvme_auth/",
    "sys/module/nvme_keyring/",
    "sys/kernel/iommu_groups/0/",
    "sys/kernel/iommu_groups/1/",
    "sys/module/nvmet_tcp/",
  ])
    delete host[k];
  host["sys/kernel/iommu_groups/"] = "";
  host["sys/devices/system/cpu/online"] = "0-1\n";
  const r = await runPreflight(
    {
      roles: ["spdk", "kernel-target", "initiator"],
      coreMask: "0xc",
      spdkDrives: true,
      transports: ["tcp", "rdma"],
    },
    { fs: hostFs(tree(host)), exec: nvme("nvme version 2.3\n") },
  );
  const by = Object.fromEntries(r.checks.map((c) => [c.id, c]));
  expect(by["cpu-cores"]?.status).toBe("fail");
  expect(by["cpu-cores"]?.message).toBe("core mask 0xc names core(s) 2,3 but only cores 0-1 are online");
  expect(by.iommu?.status).toBe("fail");
  expect(by["module:nvmet_tcp"]).toMatchObject({ status: "fail", fix: "modprobe nvmet_tcp" });
  expect(by["module:nvmet_rdma"]?.status).toBe("fail");
  expect(by["module:nvme_rdma"]?.status).toBe("fail");
  expect(by["module:nvme_auth"]?.status).toBe("warn");
  expect(by["module:nvme_keyring"]?.status).toBe("warn");
  expect(by["nvme-cli"]).toMatchObject({ status: "warn", details: { version: "2.3" } });
  expect(preflightExitCode(r)).toBe(1);
  const text = renderPreflight(r);
  expect(text).toContain("FAIL  cpu-cores");
  expect(text).toContain("fix: modprobe nvmet_tcp");
  expect(text).toMatch(/\d+ passed, 3 warnings, \d+ failed, 0 skipped\n$/);
});

test("only the roles asked for are checked; warnings alone exit 0, or 3 when strict", async () => {
  const host = { ...GOOD_HOST } as Record<string, string>;
  delete host["sys/module/nvme_keyring/"];
  const r = await runPreflight(
    { roles: ["initiator"] },
    { fs: hostFs(tree(host)), exec: nvme("nvme version 2.10.2 (git 2.10.2)\n") },
  );
  expect(r.checks.map((c) => c.id)).toEqual([
    "module:nvme_fabrics",
    "module:nvme_tcp",
    "module:nvme_auth",
    "module:nvme_keyring",
    "nvme-tls",
    "nvme-cli",
  ]);
  expect(r.worst).toBe("warn");
  expect(preflightExitCode(r)).toBe(0);
  expect(preflightExitCode(r, true)).toBe(3);
});

test("nvme-cli absent or too old fails; configfs unmounted fails; uio needs no IOMMU", async () => {
  const fs = hostFs(tree({ "proc/mounts": "sysfs /sys sysfs rw 0 0\n", "sys/module/uio_pci_generic/": "" }));
  const r = await runPreflight(
    { roles: ["initiator", "kernel-target", "spdk"], spdkDrives: true },
    { fs, exec: nvme(null) },
  );
  const by = Object.fromEntries(r.checks.map((c) => [c.id, c]));
  expect(by["nvme-cli"]?.status).toBe("fail");
  expect(by["nvme-cli"]?.message).toContain("not installed");
  expect(by.configfs).toMatchObject({ status: "fail", fix: "mount -t configfs none /sys/kernel/config" });
  expect(by["userspace-driver"]?.status).toBe("pass");
  expect(by.iommu?.status).toBe("skip");
  const old = await runPreflight({ roles: ["initiator"] }, { fs, exec: nvme("nvme version 1.16\n") });
  expect(old.checks.at(-1)).toMatchObject({ id: "nvme-cli", status: "fail" });
});

test("parsers: CPU lists, nvme versions, core masks", () => {
  expect(parseCpuList("0-3,8,10-11\n")).toEqual([0, 1, 2, 3, 8, 10, 11]);
  expect(() => parseCpuList("zero")).toThrow("not a CPU list");
  expect(parseNvmeVersion("nvme version 2.8 (git 2.8)")).toEqual({ major: 2, minor: 8, text: "2.8" });
  expect(parseNvmeVersion("something else")).toBeUndefined();
  expect(checkCoreMask("7", [0, 1]).status).toBe("fail");
  expect(checkCoreMask("0x3", [0, 1]).status).toBe("warn");
  expect(checkCoreMask("0x1", undefined).status).toBe("warn");
});
