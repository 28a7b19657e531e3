// The per-volume in-flight guard: a second operation on a held key is ABORTED without running.
import { expect, test } from "bun:test";
import { StorageError } from "../../lib/errors.ts";
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
