// Configfs change notices between processes: the process writing the simulated configfs (the
// agent in the lab) tells the simulated nvmet process what changed and waits until nvmet has
// acted, as the kernel runs nvmet's callbacks inside the configfs syscall. One line per notice
// over a unix socket, answered "ok\n" once nvmet rescanned.
import { createServer, connect as netConnect, type Server } from "node:net";
import { closeServer, listenOn, takeSocketPath } from "../spdk/unix-socket.ts";

/** A bound notice socket; close() stops it and removes the socket file. */
export interface ChangeNoticeServer {
  close(): Promise<void>;
}

/**
 * Serves notices on `path`: each line runs `onChange(line)` (serialised by the caller's own lock)
 * and is answered "ok" after it settles, whether or not it threw (the tree holds the change
 * either way; nvmet logs its own failures).
 */
export async function serveChangeNotices(
  path: string,
  onChange: (entry: string) => Promise<void>,
): Promise<ChangeNoticeServer> {
  await takeSocketPath(path);
  const server: Server = createServer((sock) => {
    let buf = "";
    let chain: Promise<unknown> = Promise.resolve();
    sock.on("error", () => {});
    sock.on("data", (chunk: Buffer) => {
      buf += chunk.toString("utf8");
      for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        chain = chain
          .then(() => onChange(line))
          .catch(() => undefined)
          .then(() => {
            if (!sock.destroyed) sock.write("ok\n");
          });
      }
    });
  });
  await listenOn(server, path);
  return { close: () => closeServer(server, path, false) };
}

/**
 * The simulated configfs's onChange for a writer in another process: sends the entry and waits
 * for nvmet's "ok" (at most `timeoutMs`). Resolves, never rejects, when nvmet is not running or
 * does not answer: like a kernel without nvmet loaded, the tree simply holds the change, and the
 * nvmet process reads the whole tree when it starts and on its backstop rescans.
 */
export function changeNotifier(path: string, timeoutMs = 5000): (entry: string) => Promise<void> {
  return (entry) =>
    new Promise((resolve) => {
      const sock = netConnect(path);
      let buf = "";
      const done = () => {
        clearTimeout(timer);
        sock.destroy();
        resolve();
      };
      const timer = setTimeout(done, timeoutMs);
      sock.on("error", done);
      sock.on("connect", () => sock.write(`${entry.replaceAll("\n", " ")}\n`));
      sock.on("data", (chunk: Buffer) => {
        buf += chunk.toString("utf8");
        if (buf.includes("\n")) done();
      });
    });
}
