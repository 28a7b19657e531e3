// A replicated volume (two copies, on node-a and node-b) through the whole cluster: the Pod's
// node connects the serving node and the other copy node's standby as two paths of one device;
// the serving node dies (kill -9 of its agent and nvmf_tgt, its kubelet and containerd first so
// nothing restarts them) while the Pod writes; the manager fences the dead node from the copies
// and moves the volume; the survivor serves from its own copy, its standby path turns optimized
// and the Pod's held writes complete there. Every byte the writer had acknowledged is read back
// on another node; the dead node's nexus host is refused by the surviving copy (by a connect).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { kinds, type NVMePartition, type NVMeVolumeAttachment } from "../api/index.ts";
import { connectController, createFabric, createTcpFabric } from "../lab/sim/spdk/fabric.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../lib/volume-identity.ts";
import { hostNqnOf, volumeTarget } from "./storage-target.ts";
import { createPvc, deletePod, type E2eLab, e2eLab, FinalError, until, workloadPod } from "./support.ts";
import { waitHeld } from "./user-steps.ts";

let lab: E2eLab;
beforeAll(async () => {
  lab = await e2eLab();
}, 120_000);
afterAll(async () => {
  await lab.stop();
});

const FAILOVER_AFTER_S = 5;

test("replicas=2: the serving node is killed during writes; it is fenced, the other copy node serves, the Pod's writes resume on its standby path and verify", async () => {
  const [a, b] = lab.consumers;
  if (!a || !b) throw new Error("the lab needs two consumer nodes");
  if (lab.storage.length < 2) throw new Error("the lab needs two SPDK storage nodes");
  const sc = `e2e-repl-${randomBytes(3).toString("hex")}`;
  const base = await lab.storageApi.readStorageClass({ name: "distort-lab" });
  await lab.storageApi.createStorageClass({
    body: {
      metadata: { name: sc },
      provisioner: base.provisioner,
      parameters: {
        ...base.parameters,
        replicas: "2",
        transport: "tcp",
        failoverAfterSeconds: String(FAILOVER_AFTER_S),
        // Held, never failed: a lost path waits for the failover (10 minutes at most).
        ctrlLossTmo: "600",
        reconnectDelay: "1",
      },
      reclaimPolicy: "Delete",
      volumeBindingMode: "Immediate",
    },
  });
  const ns = await lab.newNamespace("replicated");
  const seed = `${ns}-repl`;
  const bytes = "512Mi";
  const parts = new ResourceClient(lab.conn, kinds.NVMePartition);
  const vas = new ResourceClient(lab.conn, kinds.NVMeVolumeAttachment);
  const clients: SpdkClient[] = [];
  const spdkOf = (node: string) => {
    const s = lab.storage.find((x) => x.name === node);
    if (!s) throw new Error(`${node} is no SPDK storage node of the lab`);
    const c = new SpdkClient({ socketPath: s.spdkSocket, logger: silentLogger, callTimeoutMs: 10_000 });
    clients.push(c);
    return new SpdkMethods(c);
  };
  let crashed: string | undefined;
  try {
    await createPvc(lab, ns, "data", { storageClass: sc, size: "1Gi" });
    const t = await volumeTarget(lab, ns, "data");
    const vol = t.partition;
    const volUid = vol.metadata.uid as string;
    const serving = t.storageNode;
    const copies = await until(
      "both copies exported",
      async () => {
        const l = (await parts.list({ namespace: lab.namespace })).items.filter(
          (p: NVMePartition) => p.spec.replicaOf?.uid === volUid && p.status?.state === "Exported",
        );
        return l.length === 2 ? l : undefined;
      },
      120_000,
    );
    const other = copies.map((c) => c.spec.nodeName as string).find((n) => n !== serving);
    if (!other) throw new Error(`both copies on ${serving}`);
    const standby = spdkOf(other);
    // The other copy node stands by: the volume's subsystem, no namespace, listener inaccessible.
    await until(
      `the standby export on ${other}`,
      async () => {
        const [sub] = await standby.nvmfGetSubsystems(t.nqn).catch(() => []);
        return sub && (sub.namespaces ?? []).length === 0 ? sub : undefined;
      },
      60_000,
    );
    const ana = (await standby.nvmfSubsystemGetListeners(t.nqn)).flatMap(
      (l) => l.ana_states?.map((g) => g.ana_state) ?? [],
    );
    expect(ana.length).toBeGreaterThan(0);
    expect(new Set(ana)).toEqual(new Set(["inaccessible"]));

    await lab.core.createNamespacedPod({
      namespace: ns,
      body: workloadPod("writer", a.name, "data", [
        "write",
        `--bytes=${bytes}`,
        `--seed=${seed}`,
        "--then-hold",
      ]),
    });
    const hostA = await hostNqnOf(lab, a.name);
    // The Pod's node holds a controller on both nodes: the serving path and the standby one.
    await until(
      "the consumer's controllers on both nodes",
      async () => {
        const p = await lab.core.readNamespacedPod({ name: "writer", namespace: ns });
        if (p.status?.phase === "Failed") throw new FinalError(`the writer failed: ${p.status?.message}`);
        if (p.status?.phase !== "Running") return undefined;
        const on = async (m: SpdkMethods) =>
          (await m.nvmfSubsystemGetControllers(t.nqn)).some((c) => c.hostnqn === hostA);
        return (await on(spdkOf(serving))) && (await on(standby)) ? true : undefined;
      },
      180_000,
    );
    const running = await lab.core.readNamespacedPod({ name: "writer", namespace: ns });
    if (running.status?.message?.startsWith("{")) throw new Error("the writer finished before the node died");

    // The serving node dies: its kubelet and containerd first (nothing restarts its containers),
    // then kill -9 of its agent and nvmf_tgt.
    const deadNode = lab.storage.find((s) => s.name === serving);
    if (!deadNode) throw new Error(`no storage node ${serving}`);
    const pids = [lab.pid(deadNode.agent), lab.pid(deadNode.target)];
    if (pids.some((p) => p === undefined)) throw new Error(`${serving}'s agent or nvmf_tgt is not running`);
    crashed = serving;
    const down = lab.crashNode(serving);
    for (const pid of pids) process.kill(pid as number, "SIGKILL");
    const killedAt = Date.now();

    // The manager fences the dead node (the copies' attachments admit the survivor's nexus host
    // only) and then moves the volume; the survivor serves it.
    const survivor = copies.find((c) => c.spec.nodeName === other) as NVMePartition;
    const dead = copies.find((c) => c.spec.nodeName === serving) as NVMePartition;
    // Served there: the survivor's own status (its portal, Ready) past the degrade, not the one
    // the dead node left.
    const moved = await until(
      `the volume served by ${other}`,
      async () => {
        const p = await parts.get(vol.metadata.name, lab.namespace);
        const ready = p?.status?.conditions?.find((c) => c.type === "Ready");
        return p?.spec.nodeName === other &&
          ready?.status === "True" &&
          p.status?.portalIP === survivor.status?.portalIP &&
          (p.status?.dataGeneration ?? 0) > 1
          ? p
          : undefined;
      },
      180_000,
    );
    const servedAfterMs = Date.now() - killedAt;
    // The live copy's attachment admits the survivor's nexus host alone (the dead node's copy
    // cannot be reached to change, and leaves the current set instead).
    const att = await vas.get(
      attachmentNameFor(survivor.metadata.name, survivor.metadata.uid as string),
      lab.namespace,
    );
    expect((att as NVMeVolumeAttachment).spec.hostNQN).toBe(nexusHostNqnFor(other));
    // Shown by a connect: the surviving copy refuses the dead node's nexus host.
    const fabric = lab.fabricDir ? createFabric(lab.fabricDir) : createTcpFabric();
    const oldHost = nexusHostNqnFor(serving);
    const fenced = await connectController(fabric, {
      trtype: "TCP",
      traddr: survivor.status?.portalIP as string,
      trsvcid: String(survivor.status?.portalPort),
      subnqn: survivor.status?.nqn as string,
      hostnqn: oldHost,
      hostid: "00000000-0000-4000-8000-00000000e2e1",
    }).then(
      (c) => {
        c.close();
        return "admitted";
      },
      (err: Error) => `refused: ${err.message}`,
    );
    expect(fenced).toStartWith("refused");
    // The survivor's copy holds every acknowledged write: the other copy left the current set.
    expect(moved.status?.replicas?.find((r) => r.name === survivor.metadata.name)).toMatchObject({
      state: "Online",
      generation: moved.status?.dataGeneration,
    });
    // The dead node's copy left the current set (the manager's failover records it Stale; the
    // survivor's nexus would record it Faulted): behind the generation, never read again.
    const gone = moved.status?.replicas?.find((r) => r.name === dead.metadata.name);
    expect(["Stale", "Faulted"]).toContain(gone?.state as string);
    expect(gone?.generation ?? 0).toBeLessThan(moved.status?.dataGeneration ?? 0);

    // The Pod's held writes complete through its standby path, now optimized.
    const written = await waitHeld(lab, ns, "writer", 300_000);
    expect(written).toMatchObject({ mode: "write", ok: true });
    const anaNow = (await standby.nvmfSubsystemGetListeners(t.nqn)).flatMap(
      (l) => l.ana_states?.map((g) => g.ana_state) ?? [],
    );
    expect(new Set(anaNow)).toEqual(new Set(["optimized"]));
    process.stdout.write(
      `replicated failover: served by ${other} ${(servedAfterMs / 1000).toFixed(1)} s after ${serving} was killed (failoverAfterSeconds ${FAILOVER_AFTER_S})\n`,
    );
    // Bound: the heartbeat timeout, the fencing, the survivor's wait on the lost copy (10 s) and
    // the path switch, with room for a loaded 2-core machine.
    expect(servedAfterMs).toBeLessThan(120_000);

    await down;
    await lab.restoreNode(serving);
    crashed = undefined;

    // Every byte the writer wrote, read on another node, as the writer reported it.
    await deletePod(lab, ns, "writer", 180_000);
    await lab.core.createNamespacedPod({
      namespace: ns,
      body: workloadPod("reader", b.name, "data", [
        "verify",
        `--bytes=${bytes}`,
        `--seed=${seed}`,
        "--then-hold",
      ]),
    });
    const read = await waitHeld(lab, ns, "reader", 300_000);
    expect(read).toMatchObject({ ok: true, sha256: written.sha256 });
  } catch (err) {
    for (const name of [`nvme-host_${a.name}`, `csi-node_${a.name}`]) {
      const log = join(lab.dir, "logs", `${name}.log`);
      if (!existsSync(log)) continue;
      const lines = readFileSync(log, "utf8")
        .split("\n")
        .filter((l) => /path|portal|connect|ana|error/i.test(l));
      process.stderr.write(`--- ${name} ---\n${lines.slice(-40).join("\n")}\n`);
    }
    throw err;
  } finally {
    if (crashed) await lab.restoreNode(crashed).catch(() => {});
    for (const c of clients) await c.close();
    for (const p of ["writer", "reader"]) await deletePod(lab, ns, p, 180_000).catch(() => {});
    await lab.core.deleteNamespacedPersistentVolumeClaim({ name: "data", namespace: ns }).catch(() => {});
    await lab.core.deleteNamespace({ name: ns }).catch(() => {});
    await lab.storageApi.deleteStorageClass({ name: sc }).catch(() => {});
  }
}, 900_000);
