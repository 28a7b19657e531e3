// The sidecar modes' flags: the argument lists the chart renders for the upstream sidecars parse,
// Go's flag spellings are accepted, defaults are upstream's, and bad input names its flag.
import { describe, expect, test } from "bun:test";
import { StorageError } from "../../lib/errors.ts";
import { parseLivenessConfig, parseRegistrarConfig, sidecarModeOf } from "./config.ts";

const problem = (fn: () => unknown): string | undefined => {
  try {
    fn();
    return undefined;
  } catch (err) {
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("invalid");
    return (err as Error).message;
  }
};

describe("sidecarModeOf", () => {
  test.each([
    [["--mode=registrar", "--csi-address=/csi/csi.sock"], "registrar"],
    [["--csi-address=/csi/csi.sock", "-mode=liveness"], "liveness"],
    [["--mode", "liveness"], "liveness"],
    [["--mode=node", "--node-id=a"], undefined],
    [["--mode", "controller"], undefined],
    [["--endpoint=unix:///csi/csi.sock"], undefined],
    [[], undefined],
  ] as const)("%j -> %s", (argv, mode) => {
    expect(sidecarModeOf(argv)).toBe(mode);
  });
});

describe("parseRegistrarConfig", () => {
  // What helm/distort/templates/csi-node.yaml passes node-driver-registrar, plus the mode.
  const chartArgs = [
    "--mode=registrar",
    "--csi-address=/csi/csi.sock",
    "--kubelet-registration-path=/var/lib/kubelet/plugins/storage.distort.io/csi.sock",
    "--http-endpoint=:9809",
  ];

  test("the chart's arguments, with upstream's defaults for the rest", () => {
    expect(parseRegistrarConfig(chartArgs, {})).toEqual({
      csiSocketPath: "/csi/csi.sock",
      kubeletRegistrationPath: "/var/lib/kubelet/plugins/storage.distort.io/csi.sock",
      registrationDir: "/registration",
      http: { host: "0.0.0.0", port: 9809 },
      callTimeoutMs: 1000,
      csiWaitMs: 120_000,
      logLevel: "info",
    });
  });

  test("Go flag spellings, unix:// addresses, every option set", () => {
    const cfg = parseRegistrarConfig(
      [
        "-mode",
        "registrar",
        "-csi-address",
        "unix:///run/csi/socket",
        "--kubelet-registration-path",
        "/k/plugins/x/csi.sock",
        "-plugin-registration-path=/k/plugins_registry/",
        "--http-endpoint=[::1]:0",
        "--timeout=2.5s",
        "--csi-wait-timeout=0",
        "--log-level=debug",
      ],
      {},
    );
    expect(cfg).toEqual({
      csiSocketPath: "/run/csi/socket",
      kubeletRegistrationPath: "/k/plugins/x/csi.sock",
      registrationDir: "/k/plugins_registry",
      http: { host: "::1", port: 0 },
      callTimeoutMs: 2500,
      csiWaitMs: 0,
      logLevel: "debug",
    });
  });

  test("no --http-endpoint: no health server; environment fills the DISTORT options", () => {
    const cfg = parseRegistrarConfig(
      ["--mode=registrar", "--kubelet-registration-path=/k/csi.sock", "--http-endpoint="],
      { DISTORT_LOG_LEVEL: "warn", DISTORT_REGISTRAR_CSI_WAIT_TIMEOUT: "10s" },
    );
    expect(cfg.http).toBeUndefined();
    expect([cfg.logLevel, cfg.csiWaitMs]).toEqual(["warn", 10_000]);
  });

  test.each([
    [["--mode=registrar"], "--kubelet-registration-path is required"],
    [
      ["--mode=registrar", "--kubelet-registration-path=csi.sock"],
      "--kubelet-registration-path must be an absolute path",
    ],
    [
      ["--mode=registrar", "--kubelet-registration-path=/k", "--csi-address=csi.sock"],
      "--csi-address must be an absolute path",
    ],
    [
      ["--mode=registrar", "--kubelet-registration-path=/k", "--http-endpoint=9809"],
      "--http-endpoint must be [host]:port",
    ],
    [
      ["--mode=registrar", "--kubelet-registration-path=/k", "--http-endpoint=:70000"],
      "--http-endpoint must be [host]:port",
    ],
    [
      ["--mode=registrar", "--kubelet-registration-path=/k", "--http-endpoint=node-a:9809"],
      "--http-endpoint host must be empty, localhost or an IP",
    ],
    [["--mode=registrar", "--kubelet-registration-path=/k", "--timeout=1"], "--timeout must be a duration"],
    [
      ["--mode=registrar", "--kubelet-registration-path=/k", "--log-level=loud"],
      "--log-level: must be debug",
    ],
    [
      ["--mode=registrar", "--kubelet-registration-path=/k", "--probe-timeout=1s"],
      "unknown flag --probe-timeout",
    ],
    [["--mode=registrar", "--kubelet-registration-path=/k", "extra"], 'unexpected argument "extra"'],
    [["--mode=registrar", "--kubelet-registration-path"], "--kubelet-registration-path needs a value"],
    [
      ["--mode=registrar", "--timeout=1s", "--timeout=2s", "--kubelet-registration-path=/k"],
      "--timeout given twice",
    ],
  ])("%j is refused: %s", (argv, msg) => {
    expect(problem(() => parseRegistrarConfig(argv, {}))).toContain(msg);
  });

  test("every problem is reported at once", () => {
    const msg = problem(() =>
      parseRegistrarConfig(["--mode=registrar", "--csi-address=x", "--timeout=soon"], {}),
    );
    expect(msg).toContain("--csi-address");
    expect(msg).toContain("--timeout");
    expect(msg).toContain("--kubelet-registration-path");
  });
});

describe("parseLivenessConfig", () => {
  test("the chart's arguments (csi-node and csi-controller pass the same)", () => {
    expect(
      parseLivenessConfig(
        ["--mode=liveness", "--csi-address=/csi/csi.sock", "--http-endpoint=:9808", "--probe-timeout=3s"],
        {},
      ),
    ).toEqual({
      csiSocketPath: "/csi/csi.sock",
      http: { host: "0.0.0.0", port: 9808 },
      probeTimeoutMs: 3000,
      logLevel: "info",
    });
  });

  test("upstream's defaults: /run/csi/socket, :9808 from --health-port, 1 s", () => {
    expect(parseLivenessConfig(["--mode=liveness"], {})).toEqual({
      csiSocketPath: "/run/csi/socket",
      http: { host: "0.0.0.0", port: 9808 },
      probeTimeoutMs: 1000,
      logLevel: "info",
    });
    expect(parseLivenessConfig(["--mode=liveness", "--health-port=9900"], {}).http).toEqual({
      host: "0.0.0.0",
      port: 9900,
    });
    expect(parseLivenessConfig(["--mode=liveness", "--http-endpoint=localhost:1"], {}).http).toEqual({
      host: "127.0.0.1",
      port: 1,
    });
  });

  test.each([
    [["--mode=liveness", "--probe-timeout=0s"], "--probe-timeout must be at least 1 ms"],
    [["--mode=liveness", "--probe-timeout=3"], "--probe-timeout must be a duration"],
    [["--mode=liveness", "--health-port=x"], "--health-port must be a whole number"],
    [["--mode=liveness", "--kubelet-registration-path=/k"], "unknown flag --kubelet-registration-path"],
    [["--mode=registrar"], "--mode:"],
  ])("%j is refused: %s", (argv, msg) => {
    expect(problem(() => parseLivenessConfig(argv, {}))).toContain(msg);
  });
});
