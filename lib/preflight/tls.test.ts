// The TLS preflight on fixture /proc files: old kernels and a missing .nvme keyring warn with the
// reason, a 6.7+ kernel with the keyring passes.
import { expect, test } from "bun:test";
import type { HostFs } from "../fs.ts";
import { checkTlsKernel, kernelVersion } from "./tls.ts";

function fsOf(files: Record<string, string>): HostFs {
  return {
    readFile: async (p: string) => {
      const f = files[p];
      if (f === undefined) throw new Error(`ENOENT ${p}`);
      return f;
    },
  } as unknown as HostFs;
}

const KEYRING = "1f3a2b4c I--Q---     1 perm 3f030000     0     0 keyring   .nvme: empty\n";

test("kernel versions parse from osrelease", () => {
  expect(kernelVersion("6.18.44-fc-v857\n")).toEqual({ major: 6, minor: 18 });
  expect(kernelVersion("garbage")).toBeUndefined();
});

test("6.6 warns naming 6.7; 6.8 without the keyring warns; 6.8 with it passes", async () => {
  const old = await checkTlsKernel(fsOf({ "/proc/sys/kernel/osrelease": "6.6.30\n", "/proc/keys": KEYRING }));
  expect(old.status).toBe("warn");
  expect(old.message).toContain("6.7");
  const bare = await checkTlsKernel(fsOf({ "/proc/sys/kernel/osrelease": "6.8.0\n", "/proc/keys": "" }));
  expect(bare.status).toBe("warn");
  expect(bare.message).toContain(".nvme keyring");
  const ok = await checkTlsKernel(fsOf({ "/proc/sys/kernel/osrelease": "6.8.0\n", "/proc/keys": KEYRING }));
  expect(ok.status).toBe("pass");
});
