// The NVMe host daemon's flags: one fabric (a unix-socket directory or real TCP), the state
// directory and control socket required, anything else refused with the flag named.
import { expect, test } from "bun:test";
import { parseHostDaemonArgs } from "./host-daemon.ts";

test("a fabric directory or --fabric=tcp, never both; unknown flags and values are named", () => {
  expect(parseHostDaemonArgs(["--fabric-dir=/f", "--state-dir=/s", "--socket=/c.sock"])).toEqual({
    fabric: { dir: "/f" },
    stateDir: "/s",
    socket: "/c.sock",
    katoMs: undefined,
    logLevel: "info",
  });
  const tcp = parseHostDaemonArgs(["--fabric=tcp", "--state-dir=/s", "--socket=/c.sock", "--kato-ms=4000"]);
  expect(tcp.fabric).toBe("tcp");
  expect(tcp.katoMs).toBe(4000);
  expect(() => parseHostDaemonArgs(["--fabric=rdma", "--state-dir=/s", "--socket=/c"])).toThrow(
    "--fabric takes tcp",
  );
  expect(() =>
    parseHostDaemonArgs(["--fabric=tcp", "--fabric-dir=/f", "--state-dir=/s", "--socket=/c"]),
  ).toThrow("not both");
  expect(() => parseHostDaemonArgs(["--state-dir=/s", "--socket=/c"])).toThrow("--fabric-dir is required");
  expect(() => parseHostDaemonArgs(["--fabric=tcp", "--state-dir=/s", "--socket=/c", "--x=1"])).toThrow(
    "unknown flag --x",
  );
});
