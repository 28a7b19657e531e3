// The per-key in-flight guard: a second operation on a held key is "busy" (ABORTED) without running.
import { expect, test } from "bun:test";
import { StorageError } from "../errors.ts";
import { InFlight } from "./in-flight.ts";

test("second call on a held key is ABORTED; other keys run; the key frees on failure", async () => {
  const f = new InFlight();
  let release!: () => void;
  const first = f.run("ns/a", "CreateVolume a", () => new Promise<string>((r) => (release = () => r("one"))));
  let ran = false;
  const second = f.run("ns/a", "DeleteVolume", async () => {
    ran = true;
  });
  await expect(second).rejects.toBeInstanceOf(StorageError);
  await second.catch((e: StorageError) => {
    expect(e.kind).toBe("busy");
    expect(e.message).toContain("CreateVolume a");
  });
  expect(ran).toBe(false);
  expect(await f.run("ns/b", "other", async () => "b")).toBe("b");
  release();
  expect(await first).toBe("one");
  await expect(f.run("ns/a", "boom", async () => Promise.reject(new Error("x")))).rejects.toThrow("x");
  expect(f.keys()).toEqual([]);
});

test("the refusal names the key, the holder and the refused operation, under the given noun", async () => {
  const f = new InFlight("device");
  let release!: () => void;
  const held = f.run("d1", "CreateDevice", () => new Promise<void>((r) => (release = r)));
  const err = await f.run("d1", "DeleteDevice", async () => undefined).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).message).toBe(
    "an operation on device d1 is already in progress (CreateDevice); DeleteDevice retries later",
  );
  expect((err as StorageError).details).toEqual({
    device: "d1",
    inFlight: "CreateDevice",
    operation: "DeleteDevice",
  });
  release();
  await held;
  const sync = f.run("d1", "sync", (() => {
    throw new Error("sync");
  }) as () => Promise<void>);
  await expect(sync).rejects.toThrow("sync");
  expect(f.keys()).toEqual([]);
});
