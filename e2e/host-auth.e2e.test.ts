// DH-HMAC-CHAP on both backends, through the lab's real processes: a partition asking for
// authentication (targetOptions.dhchapSecretRef) is placed by the manager, exported by the agent
// (SPDK keyring on nvmf_tgt; the nvmet host entry's dhchap_key in configfs), its ACL granted to a
// host by an NVMeVolumeAttachment, and then a host connecting over the lab fabric is admitted with
// the Secret's key and refused with a wrong key or none. StorageClass parameters cannot carry a
// key yet (the CSI controller refuses them, issue 16), so the partition is made directly.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomBytes, randomUUID } from "node:crypto";
import { kinds, type NVMePartition, type NVMeVolumeAttachment } from "../api/index.ts";
import { attachmentNameFor } from "../csi/controller/volume-id.ts";
import { connectController, createTcpFabric, type FabricController } from "../lab/sim/spdk/fabric.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { type E2eLab, e2eLab, until } from "./support.ts";

const BACKENDS = [
  { backend: "spdk", storage: (l: E2eLab) => l.storage.map((s) => s.name) },
  { backend: "kernel", storage: (l: E2eLab) => l.kernelStorage.map((s) => s.name) },
] as const;

let lab: E2eLab;
beforeAll(async () => {
  lab = await e2eLab();
}, 120_000);
afterAll(async () => {
  await lab.stop();
});

/** A DH-HMAC-CHAP secret in its exchange form (TP 8006): 32 random bytes and their CRC-32, base64. */
function dhchapSecret(): string {
  const key = randomBytes(32);
  const crc = Buffer.alloc(4);
  crc.writeUInt32LE(Bun.hash.crc32(key) >>> 0);
  return `DHHC-1:00:${Buffer.concat([key, crc]).toString("base64")}:`;
}

/** The connect's outcome: "admitted" (and the controller closed again) or the error's message. */
async function tryConnect(
  p: NVMePartition,
  hostnqn: string,
  secret: string | undefined,
  open: FabricController[],
): Promise<string> {
  try {
    // The fabric is TCP between node addresses, which this host reaches over the lab bridge.
    const fabric = createTcpFabric();
    const c = await connectController(fabric, {
      trtype: "TCP",
      traddr: p.status?.portalIP as string,
      trsvcid: String(p.status?.portalPort),
      subnqn: p.status?.nqn as string,
      hostnqn,
      hostid: hostnqn.slice(-36),
      ...(secret ? { dhchap: { secret } } : {}),
    });
    open.push(c);
    return "admitted";
  } catch (err) {
    return `refused: ${(err as Error).message}`;
  }
}

for (const { backend, storage } of BACKENDS) {
  describe(`DH-HMAC-CHAP (${backend})`, () => {
    test("the granted host is admitted with the Secret's key and refused with a wrong key or none", async () => {
      const ns = lab.namespace;
      const name = `e2e-chap-${backend}-${randomBytes(3).toString("hex")}`;
      const parts = new ResourceClient(lab.conn, kinds.NVMePartition);
      const vas = new ResourceClient(lab.conn, kinds.NVMeVolumeAttachment);
      const host = `nqn.2014-08.org.nvmexpress:uuid:${randomUUID()}`;
      const open: FabricController[] = [];
      let vaName: string | undefined;
      await lab.core.createNamespacedSecret({
        namespace: ns,
        body: { metadata: { name }, stringData: { key: dhchapSecret() } },
      });
      try {
        const created = await parts.create({
          apiVersion: "storage.distort.io/v1alpha1",
          kind: "NVMePartition",
          metadata: { name, namespace: ns },
          spec: {
            sizeBytes: 64 * 1024 * 1024,
            backend,
            volumeManager: "partition",
            targetOptions: { transport: "tcp", dhchapSecretRef: { name, key: "key" } },
          },
        } as NVMePartition);
        const uid = created.metadata.uid as string;
        const exported = await until(
          `${name} Exported`,
          async () => {
            const x = await parts.get(name, ns);
            return x?.status?.state === "Exported" && x.status.portalIP ? x : undefined;
          },
          120_000,
        );
        // The backend's own nodes serve it: the manager kept it off the other backend's drives.
        expect(storage(lab)).toContain(exported.spec.nodeName as string);
        vaName = attachmentNameFor(name, uid);
        await vas.create({
          apiVersion: "storage.distort.io/v1alpha1",
          kind: "NVMeVolumeAttachment",
          metadata: { name: vaName, namespace: ns },
          spec: {
            partitionName: name,
            partitionUID: uid,
            nodeId: "e2e-host",
            hostNQN: host,
            attachmentId: "att-1",
          },
        } as NVMeVolumeAttachment);
        await until(
          "access granted",
          async () => (await vas.get(vaName as string, ns))?.status?.observedAttachmentId === "att-1",
          60_000,
        );

        const secret = (await lab.core.readNamespacedSecret({ name, namespace: ns })).data?.key as string;
        const right = Buffer.from(secret, "base64").toString();
        expect(await tryConnect(exported, host, right, open)).toBe("admitted");
        // I/O works for the admitted host: the positive control that the refusals below are about the key.
        const [admitted] = open;
        await admitted?.write(1, 0, Buffer.alloc(4096, 0x5a));
        expect((await admitted?.read(1, 0, 4096))?.equals(Buffer.alloc(4096, 0x5a))).toBe(true);

        // Refused for the reason each case is about: the exchange fails (ECONNREFUSED as Linux's
        // host reports it), the target demands a key the host does not have (ENOKEY), the ACL.
        expect(await tryConnect(exported, host, dhchapSecret(), open)).toMatch(
          /^refused: .*DH-HMAC-CHAP refused by the controller/,
        );
        expect(await tryConnect(exported, host, undefined, open)).toMatch(
          /^refused: Required key not available: the target requires DH-HMAC-CHAP/,
        );
        // The key alone admits nobody else: a host outside the ACL is refused with it.
        const stranger = `nqn.2014-08.org.nvmexpress:uuid:${randomUUID()}`;
        expect(await tryConnect(exported, stranger, right, open)).toMatch(/^refused: .*not allowed/);
        expect(open).toHaveLength(1);
      } finally {
        for (const c of open) c.close();
        if (vaName) await vas.delete(vaName, ns).catch(() => {});
        await parts.delete(name, ns).catch(() => {});
        await until("partition gone", async () => !(await parts.get(name, ns)), 120_000).catch(() => {});
        await lab.core.deleteNamespacedSecret({ name, namespace: ns }).catch(() => {});
      }
    }, 300_000);
  });
}
