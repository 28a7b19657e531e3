// keyring_file_* and fsdev_aio_* through the RPC socket: SPDK's file checks and error codes,
// keys referenced by hosts, and the runtime-only nature of both.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { call, rpc } from "./raw-rpc-client.ts";

let root: string;
let emu: SpdkEmulator;
let s: string;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-keys-"));
  // What is answered, not when: rpc-clock.test.ts covers the poller.
  emu = await startSpdkEmulator({
    rpcPollMs: 0,
    socketPath: join(root, "spdk.sock"),
    dataDir: join(root, "data"),
  });
  s = emu.socketPath;
});

afterAll(async () => {
  await emu.close();
  rmSync(root, { recursive: true, force: true });
});

test("keyring_file_add_key insists on an absolute, private key file and a free name", async () => {
  const key = join(root, "key0");
  writeFileSync(key, "DHHC-1:00:c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0:\n");
  chmodSync(key, 0o644);
  expect((await rpc(s, "keyring_file_add_key", { name: "key0", path: key })).error).toEqual({
    code: -1,
    message: "Operation not permitted",
  });
  chmodSync(key, 0o600);
  expect((await rpc(s, "keyring_file_add_key", { name: "key0", path: "key0" })).error?.code).toBe(-1);
  expect((await rpc(s, "keyring_file_add_key", { name: "key0", path: join(root, "missing") })).error).toEqual(
    {
      code: -2,
      message: "No such file or directory",
    },
  );
  expect(await call(s, "keyring_file_add_key", { name: "key0", path: key })).toBe(true);
  expect((await rpc(s, "keyring_file_add_key", { name: "key0", path: key })).error).toEqual({
    code: -17,
    message: "File exists",
  });
  expect(emu.state().keys).toEqual([{ name: "key0", path: key }]);
});

test("a host can name a key; unknown key names are refused; removal of a missing key is -126", async () => {
  const nqn = "nqn.2026-02.io.distort:volume-k";
  const host = "nqn.2014-08.org.nvmexpress:uuid:0b4d8c1e-9f2a-4d3b-8c7e-1a2b3c4d5e6f";
  await call(s, "nvmf_create_subsystem", { nqn });
  expect((await rpc(s, "nvmf_subsystem_add_host", { nqn, host, dhchap_key: "nope" })).error).toEqual({
    code: -32602,
    message: "Invalid parameters",
  });
  expect(await call(s, "nvmf_subsystem_add_host", { nqn, host, dhchap_key: "key0" })).toBe(true);
  const [sub] = (await call(s, "nvmf_get_subsystems", { nqn })) as { hosts: unknown[] }[];
  expect(sub?.hosts).toEqual([{ nqn: host, dhchap_key: "key0" }]);
  const keys = (await call(s, "keyring_get_keys")) as { name: string; refcnt: number; module: string }[];
  expect(keys.map((k) => [k.name, k.module, k.refcnt])).toEqual([["key0", "keyring_file", 2]]);
  expect(await call(s, "keyring_file_remove_key", { name: "key0" })).toBe(true);
  expect((await rpc(s, "keyring_file_remove_key", { name: "key0" })).error).toEqual({
    code: -126,
    message: "Required key not available",
  });
});

test("fsdev_aio_create needs a directory and a free name; fsdev_aio_delete of nothing is -19", async () => {
  const dir = join(root, "share");
  mkdirSync(dir);
  expect(await call(s, "fsdev_aio_create", { name: "fs0", root_path: dir })).toBe("fs0");
  expect((await rpc(s, "fsdev_aio_create", { name: "fs0", root_path: dir })).error).toEqual({
    code: -32603,
    message: "File exists",
  });
  expect((await rpc(s, "fsdev_aio_create", { name: "fs1", root_path: join(root, "nope") })).error?.code).toBe(
    -32603,
  );
  expect(emu.state().fsdevs).toEqual([{ name: "fs0", rootPath: dir }]);
  expect(await call(s, "fsdev_aio_delete", { name: "fs0" })).toBe(true);
  expect((await rpc(s, "fsdev_aio_delete", { name: "fs0" })).error).toEqual({
    code: -19,
    message: "No such device",
  });
});

test("keys and fsdevs are runtime state: a crash forgets them", async () => {
  const key = join(root, "key1");
  writeFileSync(key, "x");
  chmodSync(key, 0o600);
  await call(s, "keyring_file_add_key", { name: "key1", path: key });
  await call(s, "fsdev_aio_create", { name: "fs2", root_path: root });
  await emu.crash();
  await emu.restart();
  expect(await call(s, "keyring_get_keys")).toEqual([]);
  expect(emu.state().fsdevs).toEqual([]);
});
