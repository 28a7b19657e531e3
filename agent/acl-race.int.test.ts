// Forces the ACL race between the agent's partitions and attachments passes: the partitions pass
// is stopped between computing an export's hosts and applying them while a takeover's attachments
// pass runs; the target must never admit the old host while the new attachment reads AccessReady.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { kinds, type NVMeDevice, type NVMePartition, type NVMeVolumeAttachment } from "../api/index.ts";
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
import { attachmentNameFor } from "../lib/volume-identity.ts";
import type { BackendName, TargetBackend } from "./backends/types.ts";
import { parseAgentConfig } from "./config.ts";
import { type RunningAgent, runAgent } from "./main.ts";
import { aclLocks } from "./partitions/acl-lock.ts";
import { externalIdFor, nqnFor } from "./partitions/identity.ts";

const GiB = 1024 ** 3;
const HOST_A = "nqn.2014-08.org.nvmexpress:uuid:1a2b3c4d-5e6f-4a1b-8c2d-3e4f5a6b7c8d";
const HOST_B = "nqn.2014-08.org.nvmexpress:uuid:9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a";

/** A one-shot pause of the partitions controller's next setHosts on one NQN. */
class Gate {
  nqn = "";
  armed = false;
  /** Hosts the paused call was about to apply; set once it is paused. */
  held: string[] | undefined;
  private open: (() => void) | undefined;
  arm(nqn: string) {
    this.nqn = nqn;
    this.armed = true;
    this.held = undefined;
  }
  release() {
    this.open?.();
  }
  wrap(b: TargetBackend): TargetBackend {
    return new Proxy(b, {
      get: (target, prop, receiver) => {
        if (prop !== "setHosts") {
          const v = Reflect.get(target, prop, receiver);
          return typeof v === "function" ? v.bind(target) : v;
        }
        return async (...args: Parameters<TargetBackend["setHosts"]>) => {
          const [nqn, hosts] = args;
          if (this.armed && nqn === this.nqn) {
            this.armed = false;
            await new Promise<void>((resolve) => {
              this.open = resolve;
              this.held = [...hosts];
            });
          }
          return target.setHosts(...args);
        };
      },
    });
  }
}

const gate = new Gate();
/** What the target admitted and the attachment claimed right after the paused pass applied. */
let afterAcl: { hosts: string[]; observedAttachmentId?: string; ready?: string } | undefined;
let watchAcl: { key: string; vaName: string; nqn: string } | undefined;

let tc: TestCluster;
let node: SimStorageNode;
let agent: RunningAgent;
let ns: string;
let device: NVMeDevice;
let parts: ResourceClient<NVMePartition>;
let vas: ResourceClient<NVMeVolumeAttachment>;

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("acl-race");
  node = await startSimStorageNode({
    nodeName: "node-race",
    drives: [{ serial: "SIMRACE1", pciAddress: "0000:3c:00.0", sizeBytes: 2 * GiB }],
  });
  // Exported partitions are re-verified every second: a pass that wakes no attachments pass.
  const cfg = parseAgentConfig(node.agentEnv(tc.kubeconfigPath, ns, { DISTORT_VERIFY_PERIOD_MS: "1000" }));
  agent = await runAgent(cfg, createLogger({ level: (process.env.DISTORT_TEST_LOG as "info") ?? "warn" }), {
    controllerBackends: (controller, backends) => {
      if (controller !== "partitions") return backends;
      const out: Partial<Record<BackendName, TargetBackend>> = {};
      for (const [name, b] of Object.entries(backends)) out[name as BackendName] = gate.wrap(b);
      return out;
    },
    afterStep: async (step, key) => {
      const w = watchAcl;
      if (step !== "acl" || !w || key !== w.key) return;
      watchAcl = undefined;
      const va = await vas.get(w.vaName, ns);
      afterAcl = {
        hosts: [...(node.emulator.state().subsystems.find((s) => s.nqn === w.nqn)?.hosts ?? [])],
        ...(va?.status?.observedAttachmentId ? { observedAttachmentId: va.status.observedAttachmentId } : {}),
        ...(va?.status?.conditions?.find((c) => c.type === "AccessReady")?.status
          ? { ready: va.status?.conditions?.find((c) => c.type === "AccessReady")?.status }
          : {}),
      };
    },
  });
  parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  vas = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  device = await eventually(
    async () =>
      (await new ResourceClient(tc.conn, kinds.NVMeDevice).list()).items.find(
        (d) => d.spec.serial === "SIMRACE1",
      ),
    15_000,
    "NVMeDevice reported",
  );
}, 300_000);

afterAll(async () => {
  gate.release();
  await agent?.stop();
  await node?.close();
  await tc?.stop();
});

test("a partitions pass that computed the old host before a takeover never applies it after the new host was granted", async () => {
  const claim = await claimDevice(tc.conn, device, ns);
  const created = await createPlaced(
    tc.conn,
    placedPartition("race", ns, device, claim, 64 * 1024 * 1024),
    device,
  );
  const uid = created.metadata.uid as string;
  const nqn = nqnFor(externalIdFor(uid));
  const vaName = attachmentNameFor("race", uid);
  const hostsOnTarget = () => node.emulator.state().subsystems.find((s) => s.nqn === nqn)?.hosts ?? [];
  await eventually(
    async () => (await parts.get("race", ns))?.status?.state === "Exported",
    30_000,
    "Exported",
  );
  await vas.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: { name: vaName, namespace: ns },
    spec: {
      partitionName: "race",
      partitionUID: uid,
      nodeId: "worker-1",
      hostNQN: HOST_A,
      attachmentId: "att-1",
    },
  } as NVMeVolumeAttachment);
  await eventually(
    async () => (await vas.get(vaName, ns))?.status?.observedAttachmentId === "att-1",
    20_000,
    "att-1 AccessReady",
  );
  expect(hostsOnTarget()).toEqual([HOST_A]);

  // The next verify pass stops right before it applies the hosts it computed.
  gate.arm(nqn);
  await eventually(() => gate.held !== undefined, 20_000, "partitions pass paused at setHosts");
  expect(gate.held).toEqual([HOST_A]);

  // Takeover: the attachment now names host B.
  watchAcl = { key: `${ns}/race`, vaName, nqn };
  const va = (await vas.get(vaName, ns)) as NVMeVolumeAttachment;
  await vas.replace({
    ...va,
    spec: { ...va.spec, nodeId: "worker-2", hostNQN: HOST_B, attachmentId: "att-2" },
  });
  // The attachments pass either got through (and granted B) or waits for the export's ACL lock
  // the paused pass holds; only then does the paused pass go on.
  await eventually(
    async () =>
      aclLocks.pending(nqn) >= 2 || (await vas.get(vaName, ns))?.status?.observedAttachmentId === "att-2",
    20_000,
    "attachments pass granted att-2 or waits for the ACL lock",
  );
  gate.release();
  await eventually(() => afterAcl !== undefined, 20_000, "paused pass applied its ACL");
  const seen = afterAcl as NonNullable<typeof afterAcl>;
  // Whichever attachment lifetime reads AccessReady, the target admits no host but its own: att-1
  // still ready with [A] (or with [] while the revoke of A runs ahead of the grant of B) is safe;
  // att-2 ready with A on the target is the race.
  expect(seen.ready).toBe("True");
  const owner = seen.observedAttachmentId === "att-2" ? HOST_B : HOST_A;
  expect({
    observed: seen.observedAttachmentId,
    strangers: seen.hosts.filter((h) => h !== owner),
  }).toEqual({ observed: seen.observedAttachmentId === "att-2" ? "att-2" : "att-1", strangers: [] });

  // And it converges: att-2 ready, the target admits only B.
  await eventually(
    async () => (await vas.get(vaName, ns))?.status?.observedAttachmentId === "att-2",
    20_000,
    "att-2 AccessReady",
  );
  expect(hostsOnTarget()).toEqual([HOST_B]);
}, 120_000);
