// Several portals end to end through the agent, against the real kube-apiserver and the nvmf_tgt
// emulator: a node configured with three addresses, of which it has two, exports each partition on
// both (ANA optimized), reports in status.portals what the target really listens on, warns once
// about the missing one, and the CSI controller's volume context hands the node both paths.
import { afterAll, beforeAll, expect, test } from "bun:test";
import * as k8s from "@kubernetes/client-node";
import { kinds, type NVMePartition } from "../api/index.ts";
import { volumeContextOf } from "../csi/controller/volume-view.ts";
import { parseStageContexts } from "../csi/node/validate.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import {
  claimDevice,
  createPlaced,
  placedPartition,
  type SimStorageNode,
  startSimStorageNode,
} from "../lab/harness/storage-node.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { createLogger } from "../lib/log.ts";
import { PublishContextKeys, VolumeContextKeys } from "../lib/volume-context.ts";
import { parseAgentConfig } from "./config.ts";
import { type RunningAgent, runAgent } from "./main.ts";
import { externalIdFor, nqnFor } from "./partitions/identity.ts";

const GiB = 1024 ** 3;
const PRIMARY = "127.0.0.1";
const SECOND = "127.0.2.1";
/** Configured, but not an address of the node. */
const ABSENT = "127.0.9.9";

let tc: TestCluster;
let node: SimStorageNode;
let agent: RunningAgent;
let ns: string;

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("portals");
  node = await startSimStorageNode({
    nodeName: "node-mp",
    drives: [{ serial: "SIMP0001", pciAddress: "0000:3b:00.0", sizeBytes: 4 * GiB }],
    hostAddresses: [PRIMARY, SECOND],
  });
  const cfg = parseAgentConfig(
    node.agentEnv(tc.kubeconfigPath, ns, { DISTORT_PORTAL_ADDRESS: `${PRIMARY},${SECOND},${ABSENT}` }),
  );
  agent = await runAgent(cfg, createLogger({ level: (process.env.DISTORT_TEST_LOG as "info") ?? "warn" }));
}, 300_000);

afterAll(async () => {
  await agent?.stop();
  await node?.close();
  await tc?.stop();
});

test("a partition is exported on every portal the node has, optimized, and the volume context lists both paths", async () => {
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  const device = await eventually(
    async () => (await devices.list()).items.find((d) => d.spec.serial === "SIMP0001"),
    15_000,
    "NVMeDevice reported",
  );
  const claim = await claimDevice(tc.conn, device, ns);
  const created = await createPlaced(
    tc.conn,
    placedPartition("mp1", ns, device, claim, 64 * 1024 * 1024),
    device,
  );
  const nqn = nqnFor(externalIdFor(created.metadata.uid as string));
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const exported = await eventually(
    async () => {
      const p = await parts.get("mp1", ns);
      return p?.status?.state === "Exported" ? p : undefined;
    },
    30_000,
    "Exported",
  );
  expect(exported.status).toMatchObject({ nqn, portalIP: PRIMARY, portalPort: 4420 });
  expect(exported.status?.portals).toEqual([
    { address: PRIMARY, port: 4420, anaState: "optimized" },
    { address: SECOND, port: 4420, anaState: "optimized" },
  ]);
  const ready = exported.status?.conditions?.find((c) => c.type === "Ready");
  expect(ready?.message).toContain(`not listening on ${ABSENT}:4420`);

  // The target agrees: two listeners, each ANA-optimized, on a subsystem with ana_reporting.
  const sub = node.emulator.state().subsystems.find((s) => s.nqn === nqn);
  expect(sub?.listeners.map((l) => l.traddr).sort()).toEqual([PRIMARY, SECOND]);

  // One Warning for the address that does not listen, not one per verify pass (every second here).
  const warnings = async () =>
    (await tc.conn.api(k8s.EventsV1Api).listNamespacedEvent({ namespace: ns })).items.filter(
      (e) => e.reason === "PortalUnavailable" && e.regarding?.name === "mp1",
    );
  const [w] = await eventually(
    async () => {
      const l = await warnings();
      return l.length > 0 ? l : undefined;
    },
    10_000,
    "PortalUnavailable event",
  );
  expect(w?.type).toBe("Warning");
  expect(w?.note).toContain(`${ABSENT}:4420`);
  const passes = async () => {
    const text = await (await fetch(`http://127.0.0.1:${agent.healthPort}/metrics`)).text();
    return text
      .split("\n")
      .filter((l) => l.startsWith("distort_reconcile_total{") && l.includes('controller="partitions"'))
      .reduce((n, l) => n + Number(l.split(" ").at(-1)), 0);
  };
  const before = await passes();
  // Three more verify passes of the partition (1 s period here), each retrying the absent address.
  await eventually(async () => ((await passes()) >= before + 3 ? true : undefined), 20_000, "verify passes");
  const again = await warnings();
  expect(again).toHaveLength(1);
  expect(again[0]?.series?.count ?? 1).toBe(1);

  // The CSI controller's volume context and the node's reading of it: both paths, primary first.
  const ctx = volumeContextOf((await parts.get("mp1", ns)) as NVMePartition, undefined);
  expect(ctx?.[VolumeContextKeys.portals]).toBe(`${PRIMARY}:4420,${SECOND}:4420`);
  const target = parseStageContexts(ctx ?? {}, {
    [PublishContextKeys.hostNQN]: "nqn.2014-08.org.nvmexpress:uuid:0d4c1d0e-1b2c-4d3e-8f40-5a6b7c8d9e0f",
    [PublishContextKeys.attachmentId]: "att-1",
  });
  expect(target.connect).toMatchObject({ address: PRIMARY, port: 4420, nqn });
  expect(target.morePortals).toEqual([{ address: SECOND, port: 4420 }]);
}, 120_000);
