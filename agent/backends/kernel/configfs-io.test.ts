// ConfigfsIo's errors: they name the attribute and the errno, and never the value written (a
// dhchap_key written to configfs must not reach a log through a failed write).
import { describe, expect, test } from "bun:test";
import { StorageError } from "../../../lib/errors.ts";
import type { HostFs } from "../../../lib/fs.ts";
import { ConfigfsIo } from "./configfs-io.ts";

const SECRET = "DHHC-1:01:c2VjcmV0LWtleS1tYXRlcmlhbC1mb3ItdGVzdHM=:";
const ATTR = "/sys/kernel/config/nvmet/hosts/nqn.2014-08.org.nvmexpress:uuid:h1/dhchap_key";

/** A HostFs whose writes fail with `code`, or succeed and read back `readBack`. */
function fakeFs(opts: { code?: string; readBack?: string }): HostFs {
  const fail = async (): Promise<never> => {
    throw Object.assign(new Error(`${opts.code}: operation failed`), { code: opts.code });
  };
  return {
    root: "/",
    readFile: async () => `${opts.readBack ?? ""}\n`,
    writeFile: async () => {
      if (opts.code) await fail();
    },
    readdir: fail,
    readlink: fail,
    symlink: fail,
    mkdir: fail,
    rmdir: fail,
    unlink: fail,
    exists: async () => true,
    isDirectory: async () => false,
  };
}

function caught(p: Promise<unknown>): Promise<StorageError> {
  return p.then(
    () => {
      throw new Error("expected a StorageError");
    },
    (err: unknown) => {
      expect(err).toBeInstanceOf(StorageError);
      return err as StorageError;
    },
  );
}

describe("ConfigfsIo errors", () => {
  test("a failed write names the attribute and errno, not the value", async () => {
    const io = new ConfigfsIo(fakeFs({ code: "EINVAL" }));
    const err = await caught(io.write(ATTR, SECRET));
    expect(err.message).toContain(ATTR);
    expect(err.message).toContain("EINVAL");
    expect(err.message).not.toContain("DHHC-1");
    expect(JSON.stringify(err.details)).not.toContain("DHHC-1");
    expect(err.kind).toBe("internal");
  });

  test("a write that reads back differently names the attribute, not either value", async () => {
    const io = new ConfigfsIo(fakeFs({ readBack: "DHHC-1:00:other:" }));
    const err = await caught(io.writeVerified(ATTR, SECRET));
    expect(err.message).toContain(ATTR);
    expect(err.message).not.toContain("DHHC-1");
    expect(JSON.stringify(err.details)).not.toContain("DHHC-1");
  });

  test("a matching read-back passes", async () => {
    const io = new ConfigfsIo(fakeFs({ readBack: "4096" }));
    await io.writeVerified("/sys/kernel/config/nvmet/ports/1/addr_trsvcid", "4096");
  });
});
