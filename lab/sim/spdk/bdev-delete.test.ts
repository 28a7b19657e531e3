// bdev_null_delete, bdev_malloc_delete and bdev_aio_delete over the emulator's RPC socket: each
// deletes only a bdev of its own module (by name or UUID) and answers true, and -19 ENODEV for
// anything else, as v25.05.1 does (transcript seq 177-179: a malloc delete, the same again, an
// aio delete). The bdev is gone afterwards: bdev_get_bdevs no longer finds it.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { call, rpc } from "./raw-rpc-client.ts";

const ENODEV = { code: -19, message: "No such device" };

let root: string;
let emu: SpdkEmulator;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-bdev-delete-"));
  emu = await startSpdkEmulator({ rpcPollMs: 0, socketPath: join(root, "s.sock"), dataDir: join(root, "d") });
});

afterAll(async () => {
  await emu?.close();
  rmSync(root, { recursive: true, force: true });
});

/** The whole reply object, as the emulator sent it (jsonrpc, id and result or error). */
const reply = async (method: string, params: unknown): Promise<unknown> =>
  rpc(emu.socketPath, method, params);

/** Creates one bdev of each simple module; resolves to their UUIDs by module. */
async function createOneOfEach(suffix: string): Promise<Record<"null" | "malloc" | "aio", string>> {
  const s = emu.socketPath;
  await call(s, "bdev_null_create", { name: `n${suffix}`, num_blocks: 2048, block_size: 512 });
  await call(s, "bdev_malloc_create", { name: `m${suffix}`, num_blocks: 2048, block_size: 512 });
  const file = join(root, `aio${suffix}.img`);
  writeFileSync(file, Buffer.alloc(1024 * 1024));
  await call(s, "bdev_aio_create", { name: `a${suffix}`, filename: file, block_size: 512 });
  const uuid = async (name: string) =>
    ((await call(s, "bdev_get_bdevs", { name })) as { uuid: string }[])[0]?.uuid;
  return {
    null: (await uuid(`n${suffix}`)) as string,
    malloc: (await uuid(`m${suffix}`)) as string,
    aio: (await uuid(`a${suffix}`)) as string,
  };
}

test("each delete refuses another module's bdev (-19) and leaves it in place", async () => {
  await createOneOfEach("1");
  const s = emu.socketPath;
  for (const [method, others] of [
    ["bdev_null_delete", ["m1", "a1"]],
    ["bdev_malloc_delete", ["n1", "a1"]],
    ["bdev_aio_delete", ["n1", "m1"]],
  ] as const) {
    for (const name of others) expect((await rpc(s, method, { name })).error).toEqual(ENODEV);
  }
  const names = ((await call(s, "bdev_get_bdevs")) as { name: string }[]).map((b) => b.name);
  expect(names).toEqual(expect.arrayContaining(["n1", "m1", "a1"]));
});

test("each delete removes its own module's bdev by name, answers true, and -19 once it is gone", async () => {
  const s = emu.socketPath;
  for (const [method, name] of [
    ["bdev_null_delete", "n1"],
    ["bdev_malloc_delete", "m1"],
    ["bdev_aio_delete", "a1"],
  ] as const) {
    expect(await reply(method, { name })).toEqual({ jsonrpc: "2.0", id: 1, result: true });
    expect((await rpc(s, "bdev_get_bdevs", { name })).error).toEqual(ENODEV);
    expect((await rpc(s, method, { name })).error).toEqual(ENODEV);
  }
});

test("a bdev is found by its UUID too", async () => {
  const uuids = await createOneOfEach("2");
  const s = emu.socketPath;
  for (const m of ["null", "malloc", "aio"] as const) {
    expect(await reply(`bdev_${m}_delete`, { name: uuids[m] })).toEqual({
      jsonrpc: "2.0",
      id: 1,
      result: true,
    });
  }
  const names = ((await call(s, "bdev_get_bdevs")) as { name: string }[]).map((b) => b.name);
  expect(names.filter((n) => /^[nma]2$/.test(n))).toEqual([]);
});

test("a missing or extra parameter is refused before anything is looked up", async () => {
  const s = emu.socketPath;
  for (const m of ["null", "malloc", "aio"]) {
    expect((await rpc(s, `bdev_${m}_delete`, {})).error?.code).toBe(-32603);
    expect((await rpc(s, `bdev_${m}_delete`, { name: "x", extra: 1 })).error?.code).toBe(-32603);
  }
});
