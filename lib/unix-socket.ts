// Whether anything owns a UNIX socket path: the probe servers run before they take over a socket
// file a crashed predecessor may have left behind, and the lab runs to wait for a socket to serve.
import { connect } from "node:net";

/**
 * True when a connect() to the socket at `path` succeeds; false when it fails (no file, or a
 * socket nobody listens on: ECONNREFUSED). A connect that neither succeeds nor fails within
 * `timeoutMs` counts as an answer: a hung or busy owner still holds the path, and taking it over
 * would leave two processes each believing they serve it.
 */
export function socketAnswers(path: string, timeoutMs = 500): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect(path);
    const done = (alive: boolean) => {
      clearTimeout(timer);
      sock.destroy();
      resolve(alive);
    };
    const timer = setTimeout(() => done(true), timeoutMs);
    sock.once("connect", () => done(true));
    sock.once("error", () => done(false));
  });
}
