// Stale-socket handling on real UNIX sockets: missing directory, crash leftovers, live owner,
// and a path that is not a socket at all.

import { afterAll, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { mkdtemp, rm, stat, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { StorageError } from "../errors";
import { prepareSocketPath } from "./socket";

const root = await mkdtemp(join(tmpdir(), "distort-socket-test-"));
afterAll(() => rm(root, { recursive: true, force: true }));

/** A socket file nobody listens on, as a SIGKILLed server leaves behind. */
async function leaveStaleSocket(path: string): Promise<void> {
  const script = `require("node:net").createServer().listen(${JSON.stringify(path)}, () => process.kill(process.pid, "SIGKILL"))`;
  await Bun.spawn([process.execPath, "-e", script]).exited;
  if (!(await stat(path)).isSocket()) throw new Error("no stale socket was left");
}

test("creates the parent directory", async () => {
  const path = join(root, "a", "b", "plugin.sock");
  await prepareSocketPath(path);
  expect((await stat(join(root, "a", "b"))).isDirectory()).toBe(true);
});

test("removes a stale socket that nothing answers on", async () => {
  const path = join(root, "stale.sock");
  await leaveStaleSocket(path);
  await prepareSocketPath(path);
  expect(existsSync(path)).toBe(false);
});

test("refuses with 'already serving' when a process answers", async () => {
  const path = join(root, "live.sock");
  const srv = createServer((c) => c.end());
  await new Promise<void>((r) => srv.listen(path, r));
  try {
    const err = await prepareSocketPath(path).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("precondition");
    expect((err as StorageError).message).toContain("already serving");
    expect(existsSync(path)).toBe(true);
  } finally {
    await new Promise<void>((r) => srv.close(() => r()));
  }
});

test("never removes a path that is not a socket", async () => {
  const path = join(root, "regular-file");
  await writeFile(path, "keep me");
  await expect(prepareSocketPath(path)).rejects.toThrow("is not a socket");
  expect(existsSync(path)).toBe(true);
});
