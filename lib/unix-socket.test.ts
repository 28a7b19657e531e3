// socketAnswers on real UNIX sockets: a live listener, a crash leftover, a missing path.
import { afterAll, expect, test } from "bun:test";
import { mkdtemp, rm, stat } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { socketAnswers } from "./unix-socket.ts";

const root = await mkdtemp(join(tmpdir(), "distort-unix-socket-"));
afterAll(() => rm(root, { recursive: true, force: true }));

test("a listening socket answers", async () => {
  const path = join(root, "live.sock");
  const srv = createServer((c) => c.end());
  await new Promise<void>((r) => srv.listen(path, r));
  try {
    expect(await socketAnswers(path, 5000)).toBe(true);
  } finally {
    await new Promise<void>((r) => srv.close(() => r()));
  }
});

test("a socket file left by a killed process and a missing path do not answer", async () => {
  const path = join(root, "stale.sock");
  const script = `require("node:net").createServer().listen(${JSON.stringify(path)}, () => process.kill(process.pid, "SIGKILL"))`;
  await Bun.spawn([process.execPath, "-e", script]).exited;
  expect((await stat(path)).isSocket()).toBe(true);
  expect(await socketAnswers(path, 5000)).toBe(false);
  expect(await socketAnswers(join(root, "missing.sock"), 5000)).toBe(false);
});
