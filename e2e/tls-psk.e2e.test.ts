// NVMe/TCP TLS with a PSK per host on the real cluster (SPDK backend; the agent-lab image's nvmf_tgt
// emulator poses as v26.01, its --sim-spdk-version default): the right host with its PSK writes and
// reads through a Pod; the same NQN from another node, through that node's NVMe host driver, with
// a wrong PSK or none is refused by the TLS listener; the PSK is in no process's argv or
// environment (every container's included), log file (every node's, Pod logs included), Event or
// object but its own Secret; unpublish drops it.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { HostControlInitiator } from "../lab/sim/fabric/host-control.ts";
import { DHCHAP_NODE_STAGE_SECRET_TEMPLATE, dhchapSecretName, hostPskFrom } from "../lib/nvme/dhchap-keys.ts";
import { generateInterchangePsk } from "../lib/nvme/tls-psk.ts";
import { VolumeContextKeys } from "../lib/volume-context.ts";
import { leaks, logFiles } from "./key-leaks.ts";
import { hostNqnOf, volumeTarget } from "./storage-target.ts";
import { createPvc, deletePod, type E2eLab, e2eLab, runWorkload, until, workloadPod } from "./support.ts";

const BYTES = 8 * 1024 * 1024;
let lab: E2eLab;
beforeAll(async () => {
  lab = await e2eLab();
}, 300_000);
afterAll(async () => {
  await lab?.stop();
}, 300_000);

test("TLS: the right host with its PSK does I/O; a wrong PSK and none are refused; no PSK leaks", async () => {
  const [a, b] = lab.consumers;
  if (!a || !b) throw new Error("the lab needs two consumer nodes");
  const sc = "distort-tls-spdk";
  await lab.storageApi.createStorageClass({
    body: {
      metadata: { name: sc },
      provisioner: "storage.distort.io",
      parameters: {
        backend: "spdk",
        volumeManager: "spdk-lvol",
        transport: "tcp",
        tls: "required",
        "csi.storage.k8s.io/fstype": "ext4",
        "csi.storage.k8s.io/node-stage-secret-name": DHCHAP_NODE_STAGE_SECRET_TEMPLATE,
        "csi.storage.k8s.io/node-stage-secret-namespace": lab.namespace,
      },
      reclaimPolicy: "Delete",
      volumeBindingMode: "WaitForFirstConsumer",
    },
  });
  const ns = await lab.newNamespace("tls");
  try {
    await createPvc(lab, ns, "data", { storageClass: sc, size: "1Gi" });
    const report = await runWorkload(lab, ns, "writer", a.name, "data", [
      "write-verify",
      `--bytes=${BYTES}`,
      `--seed=${ns}`,
    ]);
    expect(report).toMatchObject({ mode: "write-verify", bytes: BYTES, ok: true });
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
    const pvName = (await lab.core.readNamespacedPersistentVolumeClaim({ name: "data", namespace: ns })).spec
      ?.volumeName as string;
    const secretName = dhchapSecretName(pvName);
    const secret = await lab.core.readNamespacedSecret({ name: secretName, namespace: lab.namespace });
    const data = Object.fromEntries(
      Object.entries(secret.data ?? {}).map(([k, v]) => [k, Buffer.from(v, "base64").toString("utf8")]),
    );
    const psk = hostPskFrom(data, hostA);
    if (!psk) throw new Error(`Secret ${secretName} holds no PSK for ${hostA}`);

    const attrs = (await lab.core.readPersistentVolume({ name: pvName })).spec?.csi?.volumeAttributes ?? {};
    const base = {
      transport: "tcp" as const,
      address: attrs[VolumeContextKeys.portalIP] as string,
      port: Number(attrs[VolumeContextKeys.portalPort]),
      nqn: t.nqn,
      hostNqn: hostA,
      ctrlLossTmo: 1,
    };
    const hostB = new HostControlInitiator(b.hostSocket, 60_000);
    for (const [what, tls] of [
      ["no PSK", undefined],
      ["a wrong PSK", { psk: generateInterchangePsk() }],
    ] as const) {
      const err = await hostB.connect(tls ? { ...base, tls } : base).then(
        () => undefined,
        (e: unknown) => e as Error,
      );
      expect({ what, refused: err !== undefined }).toEqual({ what, refused: true });
      expect(err?.message ?? "").not.toContain("NVMeTLSkey-1:01:");
      expect((await hostB.list()).some((s) => s.nqn === t.nqn)).toBe(false);
    }
    // The same NQN with the right PSK gets through the handshake.
    await hostB.connect({ ...base, tls: { psk } });
    expect((await hostB.list()).some((s) => s.nqn === t.nqn)).toBe(true);
    await hostB.disconnect(t.nqn);

    const needles = [psk, psk.split(":")[2] as string];
    expect(logFiles(lab.dir).length).toBeGreaterThan(0);
    expect(await leaks(lab, needles, { namespace: lab.namespace, name: secretName })).toEqual([]);
    expect(await leaks(lab, needles, { namespace: "-", name: "-" })).toContain(
      `secret ${lab.namespace}/${secretName}`,
    );

    await deletePod(lab, ns, "holder");
    await until(
      "the host's PSK dropped after unpublish",
      async () => {
        const s = await lab.core.readNamespacedSecret({ name: secretName, namespace: lab.namespace });
        const d = Object.fromEntries(
          Object.entries(s.data ?? {}).map(([k, v]) => [k, Buffer.from(v, "base64").toString("utf8")]),
        );
        return hostPskFrom(d, hostA) === undefined;
      },
      180_000,
    );
  } finally {
    await lab.core.deleteNamespace({ name: ns }).catch(() => {});
    await lab.storageApi.deleteStorageClass({ name: sc }).catch(() => {});
  }
}, 900_000);
