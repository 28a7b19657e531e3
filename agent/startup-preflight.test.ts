import { expect, test } from "bun:test";
import { reportOf } from "../lib/preflight/check.ts";
import { agentPreflightPlan, assertUsable, fatalChecks } from "./startup-preflight.ts";

const cfg = {
  backends: ["spdk", "kernel"] as ("spdk" | "kernel")[],
  coreMask: "0x3",
  spdkMemSizeMb: 2048,
  spdkSetup: "",
};

test("the plan follows the backends, nvmf_tgt -m/-s and the partitions placed here", () => {
  const placed = [
    { spec: { sizeBytes: 1, backend: "spdk", targetOptions: { transport: "tcp" } } },
    { spec: { sizeBytes: 1, backend: "spdk" } },
    { spec: { sizeBytes: 1, backend: "kernel", targetOptions: { transport: "tcp" } } },
  ] as never[];
  expect(agentPreflightPlan(cfg, placed)).toEqual({
    roles: ["spdk", "kernel-target"],
    transports: ["rdma", "tcp"],
    coreMask: "0x3",
    memSizeMiB: 2048,
    volumes: 2,
    spdkDrives: false,
  });
  expect(
    agentPreflightPlan(
      { ...cfg, backends: ["kernel"], spdkMemSizeMb: undefined, spdkSetup: "/setup.sh" },
      [],
    ),
  ).toEqual({
    roles: ["kernel-target"],
    transports: ["tcp"],
    coreMask: "0x3",
    volumes: 0,
    spdkDrives: true,
  });
});

test("only hugepages and core mask failures are fatal, and only when the agent starts nvmf_tgt", () => {
  const report = reportOf([
    {
      id: "hugepages",
      status: "fail",
      message: "no hugepages reserved; nvmf_tgt needs 2048 MiB",
      fix: "reserve",
    },
    { id: "cpu-cores", status: "pass", message: "ok" },
    { id: "module:nvmet_tcp", status: "fail", message: "nvmet_tcp not loaded" },
  ]);
  expect(fatalChecks(report, { nvmfTgtCommand: [] })).toEqual([]);
  const fatal = fatalChecks(report, { nvmfTgtCommand: ["/usr/local/bin/nvmf_tgt"] });
  expect(fatal.map((c) => c.id)).toEqual(["hugepages"]);
  expect(() => assertUsable(fatal)).toThrow(
    "preflight: this node cannot run nvmf_tgt: no hugepages reserved; nvmf_tgt needs 2048 MiB (fix: reserve)",
  );
  expect(() => assertUsable([])).not.toThrow();
});
