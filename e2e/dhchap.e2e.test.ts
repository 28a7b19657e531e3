// DH-HMAC-CHAP end to end on the real cluster: a StorageClass asking for bidirectional
// authentication gets keys generated per volume and host; the right host writes and reads; a
// host presenting the right NQN with no key, a wrong key or a wrong controller key is refused by
// the target (or refuses the target) when it connects through a lab host daemon's control socket,
// as `nvme connect` would; and no key shows up in any process's argv or environment, any log
// file (the lab directory's: on the cluster every node's logs, Pod logs included), any Event or
// any object but its own Secret; on the cluster the process scan covers every container's
// processes. On both backends (the lab's kernel node serves the kernel one);
// DISTORT_E2E_DHCHAP_BACKEND=spdk|kernel runs only one.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { HostControlInitiator } from "../lab/sim/fabric/host-control.ts";
import { generateDhchapSecret } from "../lib/nvme/dhchap.ts";
import {
  DHCHAP_NODE_STAGE_SECRET_TEMPLATE,
  dhchapSecretName,
  hostKeyPairFrom,
} from "../lib/nvme/dhchap-keys.ts";
import { VolumeContextKeys } from "../lib/volume-context.ts";
import { leaks, logFiles } from "./key-leaks.ts";
import { allowedHosts, hostNqnOf, targetRpc, volumeTarget } from "./storage-target.ts";
import { createPvc, deletePod, type E2eLab, e2eLab, runWorkload, until, workloadPod } from "./support.ts";

const DRIVER = "storage.distort.io";
const BACKENDS: readonly ("spdk" | "kernel")[] =
  process.env.DISTORT_E2E_DHCHAP_BACKEND === "spdk" || process.env.DISTORT_E2E_DHCHAP_BACKEND === "kernel"
    ? [process.env.DISTORT_E2E_DHCHAP_BACKEND]
    : ["spdk", "kernel"];
const BYTES = 8 * 1024 * 1024;

let lab: E2eLab;
beforeAll(async () => {
  lab = await e2eLab();
}, 300_000);
afterAll(async () => {
  await lab?.stop();
}, 300_000);

describe.each(BACKENDS)("DH-HMAC-CHAP, bidirectional (%s backend)", (BACKEND) => {
  test("the right host writes and reads; right NQN without key, wrong key, wrong controller key are refused; no key leaks", async () => {
    const [a, b] = lab.consumers;
    if (!a || !b) throw new Error("the lab needs two consumer nodes");
    const sc = `distort-dhchap-${BACKEND}`;
    await lab.storageApi.createStorageClass({
      body: {
        metadata: { name: sc },
        provisioner: DRIVER,
        parameters: {
          backend: BACKEND,
          volumeManager: BACKEND === "spdk" ? "spdk-lvol" : "parted",
          transport: "tcp",
          "csi.storage.k8s.io/fstype": "ext4",
          dhchapMode: "bidirectional",
          dhchapHash: "sha256",
          dhchapGroup: "ffdhe2048",
          "csi.storage.k8s.io/node-stage-secret-name": DHCHAP_NODE_STAGE_SECRET_TEMPLATE,
          "csi.storage.k8s.io/node-stage-secret-namespace": lab.namespace,
        },
        reclaimPolicy: "Delete",
        volumeBindingMode: "WaitForFirstConsumer",
      },
    });
    const ns = await lab.newNamespace("dhchap");
    try {
      await createPvc(lab, ns, "data", { storageClass: sc, size: "1Gi" });
      // The right host: NodeStage connects with the keys kubelet handed over, the Pod's data
      // survives a write and a read back.
      const report = await runWorkload(lab, ns, "writer", a.name, "data", [
        "write-verify",
        `--bytes=${BYTES}`,
        `--seed=${ns}`,
      ]);
      expect(report).toMatchObject({ mode: "write-verify", bytes: BYTES, ok: true });
      // A Pod that holds the volume keeps node a admitted while the impostors try.
      await deletePod(lab, ns, "writer");
      await lab.core.createNamespacedPod({
        namespace: ns,
        body: workloadPod("holder", a.name, "data", [
          "verify",
          `--bytes=${BYTES}`,
          `--seed=${ns}`,
          "--then-hold",
        ]),
      });
      await until(
        "holder running",
        async () =>
          (await lab.core.readNamespacedPod({ name: "holder", namespace: ns })).status?.phase === "Running",
        180_000,
      );

      const t = await volumeTarget(lab, ns, "data");
      const hostA = await hostNqnOf(lab, a.name);
      if (BACKEND === "spdk") {
        // SPDK admits the host with both keyring keys (nvmet's host entry is checked by the
        // impostors below: they reach the same subsystem with the same NQN).
        const { rpc, close } = targetRpc(t.spdkSocket);
        try {
          expect(await allowedHosts(rpc, t.nqn)).toEqual([hostA]);
          const [sub] = await rpc.nvmfGetSubsystems(t.nqn);
          const h = sub?.hosts.find((x) => x.nqn === hostA);
          expect(h?.dhchap_key).toBeString();
          expect(h?.dhchap_ctrlr_key).toBeString();
        } finally {
          await close();
        }
      }

      // The keys, as only the Secret holds them.
      const pvName = (await lab.core.readNamespacedPersistentVolumeClaim({ name: "data", namespace: ns }))
        .spec?.volumeName as string;
      const secretName = dhchapSecretName(pvName);
      const secret = await lab.core.readNamespacedSecret({ name: secretName, namespace: lab.namespace });
      expect(secret.metadata?.ownerReferences?.[0]?.kind).toBe("NVMePartition");
      const data = Object.fromEntries(
        Object.entries(secret.data ?? {}).map(([k, v]) => [k, Buffer.from(v, "base64").toString("utf8")]),
      );
      const pair = hostKeyPairFrom(data, hostA);
      if (!pair?.ctrlSecret) throw new Error(`Secret ${secretName} holds no bidirectional pair for ${hostA}`);

      // Impostors on node b presenting node a's NQN, through node b's host daemon.
      const pv = await lab.core.readPersistentVolume({ name: pvName });
      const attrs = pv.spec?.csi?.volumeAttributes ?? {};
      const base = {
        transport: "tcp" as const,
        address: attrs[VolumeContextKeys.portalIP] as string,
        port: Number(attrs[VolumeContextKeys.portalPort]),
        nqn: t.nqn,
        hostNqn: hostA,
        ctrlLossTmo: 1,
      };
      const hostB = new HostControlInitiator(b.hostSocket, 60_000);
      const refused = async (what: string, dhchap?: { secret: string; ctrlSecret?: string }) => {
        const err = await hostB.connect(dhchap ? { ...base, dhchap } : base).then(
          () => undefined,
          (e: unknown) => e as Error,
        );
        expect({ what, refused: err !== undefined }).toEqual({ what, refused: true });
        // Refused by authentication: the NQN itself is on the ACL.
        expect(err?.message).not.toContain("not allowed");
        expect((await hostB.list()).some((s) => s.nqn === t.nqn)).toBe(false);
        return err?.message ?? "";
      };
      const messages = [
        await refused("no key"),
        await refused("a wrong key", {
          secret: generateDhchapSecret({ hash: 1 }),
          ctrlSecret: pair.ctrlSecret,
        }),
        await refused("a wrong controller key", {
          secret: pair.secret,
          ctrlSecret: generateDhchapSecret({ hash: 1 }),
        }),
      ];
      expect(messages[0]).toContain("no key");
      for (const m of messages) expect(m).not.toMatch(/DHHC-1:0[0-3]:[A-Za-z0-9+/]{8}/);
      if (process.env.DISTORT_E2E_REPORT)
        writeFileSync(process.env.DISTORT_E2E_REPORT, JSON.stringify(messages));
      // The same NQN with the right pair authenticates both ways (and is then let go again).
      await hostB.connect({ ...base, dhchap: pair });
      expect((await hostB.list()).some((s) => s.nqn === t.nqn)).toBe(true);
      await hostB.disconnect(t.nqn);

      // Nothing but the Secret holds the keys.
      const needles = [pair.secret, pair.ctrlSecret].flatMap((s) => [s, s.split(":")[2] as string]);
      expect(logFiles(lab.dir).length).toBeGreaterThan(0);
      expect(await leaks(lab, needles, { namespace: lab.namespace, name: secretName })).toEqual([]);
      // The search does find a key where one is: the Secret itself, when not excluded.
      expect(await leaks(lab, needles, { namespace: "-", name: "-" })).toContain(
        `secret ${lab.namespace}/${secretName}`,
      );

      // Unpublish drops the host's pair; deleting the volume drops the Secret (owner GC).
      await deletePod(lab, ns, "holder");
      await until(
        "the host's pair dropped after unpublish",
        async () => {
          const s = await lab.core.readNamespacedSecret({ name: secretName, namespace: lab.namespace });
          const d = Object.fromEntries(
            Object.entries(s.data ?? {}).map(([k, v]) => [k, Buffer.from(v, "base64").toString("utf8")]),
          );
          return hostKeyPairFrom(d, hostA) === undefined;
        },
        180_000,
      );
    } finally {
      await lab.core.deleteNamespace({ name: ns }).catch(() => {});
      await lab.storageApi.deleteStorageClass({ name: sc }).catch(() => {});
    }
  }, 900_000);
});
