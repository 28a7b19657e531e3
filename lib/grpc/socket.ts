// UNIX socket housekeeping for gRPC servers: make the parent directory, clear a socket left by a
// crashed predecessor, and refuse to start when a live server still answers on the path.

import { chmod, lstat, mkdir, unlink } from "node:fs/promises";
import { dirname } from "node:path";
import { StorageError } from "../errors";
import { socketAnswers } from "../unix-socket.ts";

/** Socket file mode: owner and group (e.g. the sidecar or SNAP driver group), nobody else. */
export const SOCKET_MODE = 0o660;

/**
 * Readies `socketPath` for bind(). Creates the parent directory (0750) if needed. If the path
 * exists: when something accepts a connection there, throws StorageError "precondition" with
 * "already serving" (two plugin instances must never share a socket); when nothing answers, the
 * file is a leftover from a crash and is unlinked. A path that exists but is not a socket is never
 * removed (it points at a misconfiguration, and deleting someone's file would hide it).
 * Not atomic against a concurrent starter; the DaemonSet runs one instance per node.
 */
export async function prepareSocketPath(socketPath: string, probeTimeoutMs = 1000): Promise<void> {
  await mkdir(dirname(socketPath), { recursive: true, mode: 0o750 });
  let isSocket: boolean;
  try {
    isSocket = (await lstat(socketPath)).isSocket();
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return;
    throw e;
  }
  if (!isSocket) {
    throw new StorageError(
      "precondition",
      `${socketPath} exists and is not a socket; refusing to replace it`,
    );
  }
  if (await socketAnswers(socketPath, probeTimeoutMs)) {
    throw new StorageError("precondition", `already serving: another process is listening on ${socketPath}`, {
      details: { socketPath },
    });
  }
  try {
    await unlink(socketPath);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
  }
}

/** Restricts a freshly bound socket to SOCKET_MODE. */
export async function restrictSocket(socketPath: string): Promise<void> {
  await chmod(socketPath, SOCKET_MODE);
}
