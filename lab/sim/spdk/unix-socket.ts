// Unix socket lifecycle shared by the RPC server and fabric listeners: take over a stale socket
// file, refuse a live one, and on a simulated crash leave the socket file behind the way a killed
// process does (a socket nobody listens on: connect() gets ECONNREFUSED, not ENOENT).
import { existsSync, linkSync, lstatSync, mkdirSync, renameSync, unlinkSync } from "node:fs";
import type { Server } from "node:net";
import { dirname } from "node:path";
import { socketAnswers } from "../../../lib/unix-socket.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";

/**
 * Readies `path` for listen(): creates its directory, removes a stale socket, and throws
 * ErrnoError EBUSY when a live process answers there. A path that exists and is not a socket is
 * never removed (EEXIST): deleting someone's file would hide a misconfiguration.
 */
export async function takeSocketPath(path: string): Promise<void> {
  mkdirSync(dirname(path), { recursive: true });
  if (!existsSync(path)) return;
  if (!lstatSync(path).isSocket()) throw new ErrnoError(Errno.EEXIST, `${path} exists and is not a socket`);
  if (await socketAnswers(path)) throw new ErrnoError(Errno.EBUSY, `${path} is in use`);
  unlinkSync(path);
}

/** Listens on `path` (already taken with takeSocketPath). */
export function listenOn(server: Server, path: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(path, () => {
      server.off("error", reject);
      resolve();
    });
  });
}

/**
 * Stops `server`. With `leaveStale`, the socket file stays (Bun unlinks it on close, so a hard
 * link keeps the inode and is renamed back); otherwise the path is gone afterwards.
 */
export async function closeServer(server: Server, path: string, leaveStale: boolean): Promise<void> {
  const keep = `${path}.stale`;
  let kept = false;
  if (leaveStale && existsSync(path)) {
    try {
      linkSync(path, keep);
      kept = true;
    } catch {
      // Best effort: without the link the path simply disappears.
    }
  }
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (kept) renameSync(keep, path);
  else if (!leaveStale && existsSync(path)) unlinkSync(path);
}
