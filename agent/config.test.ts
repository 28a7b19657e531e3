// The agent's environment parsing: defaults, and a clear error naming each bad variable.
import { describe, expect, test } from "bun:test";
import { StorageError } from "../lib/errors.ts";
import { parseAgentConfig } from "./config.ts";

const base = { NODE_NAME: "node-a" };

describe("parseAgentConfig", () => {
  test("defaults", () => {
    const c = parseAgentConfig(base);
    expect(c).toMatchObject({
      nodeName: "node-a",
      namespace: "distort-system",
      backends: ["spdk", "kernel"],
      portalPort: 4420,
    });
    expect(c.spdkMemSizeMb).toBeUndefined();
    expect(c.nvmfTgtCommand).toEqual([]);
  });

  test("rebuilds: bandwidth cap (0: none) and per-node cap, defaults and bad values refused by name", () => {
    expect(parseAgentConfig(base)).toMatchObject({ rebuildBandwidthMbSec: 0, rebuildsPerNode: 2 });
    expect(
      parseAgentConfig({
        ...base,
        DISTORT_REBUILD_MAX_BANDWIDTH_MB_SEC: "50",
        DISTORT_REBUILDS_PER_NODE: "1",
      }),
    ).toMatchObject({ rebuildBandwidthMbSec: 50, rebuildsPerNode: 1 });
    expect(() => parseAgentConfig({ ...base, DISTORT_REBUILD_MAX_BANDWIDTH_MB_SEC: "fast" })).toThrow(
      /DISTORT_REBUILD_MAX_BANDWIDTH_MB_SEC: must be a whole number/,
    );
    expect(() => parseAgentConfig({ ...base, DISTORT_REBUILDS_PER_NODE: "65" })).toThrow(
      /DISTORT_REBUILDS_PER_NODE: must be <= 64/,
    );
    expect(parseAgentConfig({ ...base, DISTORT_REBUILDS_PER_NODE: "0" }).rebuildsPerNode).toBe(0);
  });

  test("rebuilds wait for the manager's cluster grant unless turned off", () => {
    expect(parseAgentConfig(base).rebuildNeedsGrant).toBe(true);
    expect(parseAgentConfig({ ...base, DISTORT_REBUILD_NEEDS_GRANT: "false" }).rebuildNeedsGrant).toBe(false);
    expect(() => parseAgentConfig({ ...base, DISTORT_REBUILD_NEEDS_GRANT: "maybe" })).toThrow(
      /DISTORT_REBUILD_NEEDS_GRANT/,
    );
  });

  test("lost-drive release bound: 10 min by default, in seconds, 0 and junk refused by name", () => {
    expect(parseAgentConfig(base).lostDriveReleaseAfterMs).toBe(600_000);
    expect(
      parseAgentConfig({ ...base, DISTORT_LOST_DRIVE_RELEASE_AFTER_SECONDS: "3600" }).lostDriveReleaseAfterMs,
    ).toBe(3_600_000);
    for (const bad of ["0", "soon", "-5"])
      expect(() => parseAgentConfig({ ...base, DISTORT_LOST_DRIVE_RELEASE_AFTER_SECONDS: bad })).toThrow(
        /DISTORT_LOST_DRIVE_RELEASE_AFTER_SECONDS/,
      );
  });

  test("nvmf_tgt command, core mask and DPDK memory", () => {
    const c = parseAgentConfig({
      ...base,
      DISTORT_NVMF_TGT: "/usr/local/bin/nvmf_tgt",
      DISTORT_SPDK_CORE_MASK: "0x3",
      DISTORT_SPDK_MEM_SIZE_MB: "2048",
    });
    expect(c.nvmfTgtCommand).toEqual(["/usr/local/bin/nvmf_tgt"]);
    expect(c.coreMask).toBe("0x3");
    expect(c.spdkMemSizeMb).toBe(2048);
  });

  test("portal networks: CIDRs parsed, bad ones and the address list beside them refused", () => {
    const c = parseAgentConfig({ ...base, DISTORT_PORTAL_NETWORKS: "198.18.0.0/24, 198.18.1.0/24" });
    expect(c.portalNetworks?.map((n) => n.text)).toEqual(["198.18.0.0/24", "198.18.1.0/24"]);
    expect(c.portalAddresses).toBeUndefined();
    expect(() => parseAgentConfig({ ...base, DISTORT_PORTAL_NETWORKS: "198.18.0.1/24" })).toThrow(
      /DISTORT_PORTAL_NETWORKS: 198\.18\.0\.1\/24: has host bits set/,
    );
    expect(() => parseAgentConfig({ ...base, DISTORT_PORTAL_NETWORKS: " , " })).toThrow(/at least one CIDR/);
    expect(() =>
      parseAgentConfig({
        ...base,
        DISTORT_PORTAL_NETWORKS: "198.18.0.0/24",
        DISTORT_PORTAL_ADDRESS: "198.18.0.5",
      }),
    ).toThrow(/not both/);
  });

  test("an external nvmf_tgt (its own container): no command, and both together are refused", () => {
    expect(parseAgentConfig(base).nvmfTgtExternal).toBe(false);
    expect(parseAgentConfig({ ...base, DISTORT_NVMF_TGT_EXTERNAL: "true" }).nvmfTgtExternal).toBe(true);
    expect(() =>
      parseAgentConfig({
        ...base,
        DISTORT_NVMF_TGT_EXTERNAL: "true",
        DISTORT_NVMF_TGT: "/usr/local/bin/nvmf_tgt",
      }),
    ).toThrow(/DISTORT_NVMF_TGT \(a command for the agent to start\) must then be empty/);
  });

  test("portal addresses: one, or several comma-separated (the primary first)", () => {
    expect(parseAgentConfig({ ...base, DISTORT_PORTAL_ADDRESS: "10.0.0.5" }).portalAddresses).toEqual([
      "10.0.0.5",
    ]);
    expect(
      parseAgentConfig({ ...base, DISTORT_PORTAL_ADDRESS: "10.0.0.5, 10.0.1.5,fd00::5" }).portalAddresses,
    ).toEqual(["10.0.0.5", "10.0.1.5", "fd00::5"]);
    expect(parseAgentConfig(base).portalAddresses).toBeUndefined();
  });

  const bad: [string, Record<string, string>, string][] = [
    ["missing node name", {}, "NODE_NAME"],
    ["too little DPDK memory", { ...base, DISTORT_SPDK_MEM_SIZE_MB: "100" }, "DISTORT_SPDK_MEM_SIZE_MB"],
    ["DPDK memory not a number", { ...base, DISTORT_SPDK_MEM_SIZE_MB: "2G" }, "DISTORT_SPDK_MEM_SIZE_MB"],
    ["core mask not hex", { ...base, DISTORT_SPDK_CORE_MASK: "3" }, "DISTORT_SPDK_CORE_MASK"],
    ["unknown backend", { ...base, DISTORT_BACKENDS: "spdk,ceph" }, "DISTORT_BACKENDS"],
    ["portal not an IP", { ...base, DISTORT_PORTAL_ADDRESS: "storage-a" }, "DISTORT_PORTAL_ADDRESS"],
    [
      "second portal not an IP",
      { ...base, DISTORT_PORTAL_ADDRESS: "10.0.0.5,storage-a" },
      "entries must be IP addresses",
    ],
    ["empty entry", { ...base, DISTORT_PORTAL_ADDRESS: "10.0.0.5,," }, "entries must be IP addresses"],
    ["wildcard portal", { ...base, DISTORT_PORTAL_ADDRESS: "0.0.0.0" }, "not a wildcard"],
    ["portal twice", { ...base, DISTORT_PORTAL_ADDRESS: "10.0.0.5,10.0.0.5" }, "an address twice"],
    [
      "too many portals",
      { ...base, DISTORT_PORTAL_ADDRESS: Array.from({ length: 9 }, (_, i) => `10.0.0.${i + 1}`).join(",") },
      "more than 8 portals",
    ],
    ["relative key directory", { ...base, DISTORT_KEY_DIR: "keys" }, "DISTORT_KEY_DIR"],
  ];
  for (const [name, env, variable] of bad) {
    test(`refuses: ${name}`, () => {
      let err: unknown;
      try {
        parseAgentConfig(env);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(StorageError);
      expect((err as StorageError).kind).toBe("invalid");
      expect((err as StorageError).message).toContain(variable);
    });
  }
});
