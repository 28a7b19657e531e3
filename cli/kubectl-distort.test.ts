import { afterEach, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { Exec } from "../lib/exec.ts";
import { completionScript } from "./completion.ts";
import { main } from "./kubectl-distort.ts";
import { parsePreflightArgs } from "./preflight-command.ts";

const roots: string[] = [];
afterEach(() => {
  for (const r of roots.splice(0)) rmSync(r, { recursive: true, force: true });
});

async function cli(argv: string[], exec?: Exec) {
  let stdout = "";
  let stderr = "";
  const code = await main(
    argv,
    {
      out: async (s) => {
        stdout += s;
      },
      err: async (s) => {
        stderr += s;
      },
    },
    { HOME: "/nonexistent", KUBECONFIG: "" },
    exec ? { exec } : {},
  );
  return { code, stdout, stderr };
}

const nvme: Exec = { run: async () => ({ code: 0, stdout: "nvme version 2.8 (git 2.8)\n", stderr: "" }) };

function host(files: Record<string, string>): string {
  const root = mkdtempSync(join(tmpdir(), "kd-host-"));
  roots.push(root);
  for (const [p, text] of Object.entries(files)) {
    if (p.endsWith("/")) mkdirSync(join(root, p), { recursive: true });
    else {
      mkdirSync(dirname(join(root, p)), { recursive: true });
      writeFileSync(join(root, p), text);
    }
  }
  return root;
}

test("no command prints usage and exits 2; help exits 0; unknown commands and options exit 2", async () => {
  expect((await cli([])).code).toBe(2);
  const help = await cli(["--help"]);
  expect(help.code).toBe(0);
  expect(help.stdout).toContain("describe volume PVC");
  expect(help.stdout).toContain("4 the named object does not exist");
  expect(await cli(["frobnicate"])).toEqual({
    code: 2,
    stdout: "",
    stderr: 'kubectl distort: unknown command "frobnicate"\nrun kubectl distort --help for usage\n',
  });
  const opt = await cli(["describe", "volume", "x", "--bogus"]);
  expect(opt.code).toBe(2);
  expect(opt.stderr).toContain("kubectl distort describe: unknown option --bogus");
  expect((await cli(["describe", "snapshot", "x"])).stderr).toContain('cannot describe "snapshot"');
  expect((await cli(["describe", "volume", "x", "-o", "xml"])).stderr).toContain(
    'unknown output format "xml" (use -o json, -o yaml)',
  );
  expect((await cli(["fence"])).stderr).toContain("missing NODE");
  expect((await cli(["fence", "n1", "-n", "a", "-A"])).stderr).toContain("cannot be used together");
  expect((await cli(["support-bundle", "--tail-lines", "0"])).stderr).toContain(
    "--tail-lines must be a whole number",
  );
  expect((await cli(["describe", "volume", "x", "-n", "Bad_NS"])).stderr).toContain(
    "is not a namespace name",
  );
});

test("cluster commands without any kubeconfig say how to get one (exit 2)", async () => {
  const r = await cli(["describe", "volume", "data"]);
  expect(r.code).toBe(2);
  expect(r.stderr).toMatch(/^kubectl distort describe: no kubeconfig: pass --kubeconfig PATH/);
  expect((await cli(["status", "--kubeconfig", "/no/such"])).stderr).toBe(
    "kubectl distort status: kubeconfig /no/such does not exist\n",
  );
});

test("preflight runs on the host root it is given, prints text or data, and exits by the worst check", async () => {
  const root = host({
    "sys/module/nvme_fabrics/": "",
    "sys/module/nvme_tcp/": "",
    "sys/module/nvme_auth/": "",
    "sys/module/nvme_keyring/": "",
    // A kernel whose NVMe/TCP host can do TLS: 6.7 or later with the .nvme keyring loaded.
    "proc/sys/kernel/osrelease": "6.8.0-49-generic\n",
    "proc/keys": "1b8c4f2a I--Q---     1 perm 1f030000     0     0 keyring   .nvme: empty\n",
  });
  const ok = await cli(["preflight", "--role", "initiator", "--host-root", root], nvme);
  expect(ok.code).toBe(0);
  expect(ok.stdout).toContain("PASS  nvme-cli             nvme-cli 2.8\n");
  expect(ok.stdout).toContain("PASS  nvme-tls ");
  expect(ok.stdout).toContain("6 passed, 0 warnings, 0 failed, 0 skipped\n");
  const rdma = await cli(
    ["preflight", "--role", "initiator", "--transport", "tcp,rdma", "--host-root", root, "-o", "json"],
    nvme,
  );
  expect(rdma.code).toBe(1);
  const doc = JSON.parse(rdma.stdout) as {
    kind: string;
    worst: string;
    checks: { id: string; status: string }[];
  };
  expect(doc.kind).toBe("DistortPreflight");
  expect(doc.worst).toBe("fail");
  expect(doc.checks.find((c) => c.id === "module:nvme_rdma")?.status).toBe("fail");
  const yaml = await cli(["preflight", "--role", "spdk", "--host-root", root, "-o", "yaml"], nvme);
  expect(yaml.stdout).toContain("kind: DistortPreflight\n");
  // No hugepages and no CPU list in the fixture: a warning for the CPU list, a warning for
  // unreadable hugepages; --strict turns that into exit 3.
  const strict = await cli(["preflight", "--role", "spdk", "--host-root", root, "--strict"], nvme);
  expect(strict.code).toBe(3);
});

test("preflight flags are validated", () => {
  expect(() => parsePreflightArgs(["--role", "gpu"])).toThrow(
    '--role: unknown value "gpu" (use spdk, kernel-target, initiator)',
  );
  expect(() => parsePreflightArgs(["--mem-size-mb", "lots"])).toThrow(
    "--mem-size-mb must be a whole number >= 1",
  );
  expect(() => parsePreflightArgs(["--host-root", "relative"])).toThrow(
    "--host-root must be an absolute path",
  );
  expect(() => parsePreflightArgs(["--volumes"])).toThrow("--volumes needs a value");
  expect(
    parsePreflightArgs(["--role", "spdk", "--mem-size-mb", "2048", "--volumes", "30", "--spdk-drives"]),
  ).toEqual({
    plan: {
      roles: ["spdk"],
      transports: ["tcp"],
      coreMask: "0x1",
      memSizeMiB: 2048,
      volumes: 30,
      spdkDrives: true,
    },
    hostRoot: "/",
    strict: false,
    output: "text",
  });
});

test("completion scripts for bash and zsh; other shells are a usage error", async () => {
  const bash = completionScript("bash");
  expect(bash).toContain("complete -F _kubectl_distort kubectl-distort");
  expect(bash).toContain("status describe preflight fence unfence support-bundle completion help");
  const check = Bun.spawnSync(["bash", "-n"], { stdin: new TextEncoder().encode(bash) });
  expect(check.exitCode).toBe(0);
  expect(completionScript("zsh")).toContain("compdef _kubectl_distort kubectl-distort");
  expect((await cli(["completion", "fish"])).stderr).toContain('no completion for shell "fish"');
  expect((await cli(["completion", "bash"])).code).toBe(0);
});
