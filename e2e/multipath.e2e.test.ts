// Two portals, end to end: every lab storage node listens on two addresses, the CSI controller
// hands the node both (volume context), the CSI node connects both as paths of one device, and
// when the path carrying a Pod's writes is lost (its listener removed on the target, which drops
// that path's controller) the writes go on through the other path with no error; the bytes are
// verified afterwards from another node.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { VolumeContextKeys } from "../lib/volume-context.ts";
import { hostNqnOf, volumeTarget } from "./storage-target.ts";
import {
  createPvc,
  deletePod,
  dumpNodeLogs,
  type E2eLab,
  e2eLab,
  FinalError,
  removeSuiteObjects,
  until,
  workloadPod,
} from "./support.ts";
import { waitHeld } from "./user-steps.ts";

let lab: E2eLab;
const frozen = new Set<number>();
const thaw = () => {
  for (const pid of frozen) {
    try {
      process.kill(pid, "SIGCONT");
    } catch {}
  }
  frozen.clear();
};
process.on("exit", thaw);
beforeAll(async () => {
  lab = await e2eLab();
}, 120_000);
afterAll(async () => {
  thaw();
  await lab.stop();
});

interface Qpair {
  cntlid: number;
  qid: number;
  hostnqn: string;
  listen_address: { traddr: string; trsvcid: string };
}

test("two portals: losing the path in use keeps the Pod's writes going through the other; the data verifies", async () => {
  const [a, b] = lab.consumers;
  if (!a || !b) throw new Error("the lab needs two consumer nodes");
  // Fast fail: a lost path with no other one fails the Pod's I/O within a second.
  const sc = `e2e-mp-${randomBytes(3).toString("hex")}`;
  const base = await lab.storageApi.readStorageClass({ name: "distort-lab" });
  await lab.storageApi.createStorageClass({
    body: {
      metadata: { name: sc },
      provisioner: base.provisioner,
      parameters: { ...base.parameters, ctrlLossTmo: "60", reconnectDelay: "1", fastIoFailTmo: "1" },
      reclaimPolicy: "Delete",
      volumeBindingMode: "Immediate",
    },
  });
  const ns = await lab.newNamespace("io-paths");
  const seed = `${ns}-mp`;
  const bytes = "768Mi";
  let client: SpdkClient | undefined;
  try {
    await createPvc(lab, ns, "data", { storageClass: sc, size: "2Gi" });
    const t = await volumeTarget(lab, ns, "data");
    const storage = lab.storage.find((s) => s.name === t.storageNode);
    if (!storage) throw new Error(`no storage node ${t.storageNode}`);
    // The agent read both listeners back from the target, and the PV's context lists both paths.
    const portals = t.partition.status?.portals ?? [];
    expect(portals.map((p) => p.anaState)).toEqual(["optimized", "optimized"]);
    const pvc = await lab.core.readNamespacedPersistentVolumeClaim({ name: "data", namespace: ns });
    const pv = await lab.core.readPersistentVolume({ name: pvc.spec?.volumeName as string });
    expect(pv.spec?.csi?.volumeAttributes?.[VolumeContextKeys.portals]).toBe(
      portals.map((p) => `${p.address}:${p.port}`).join(","),
    );

    client = new SpdkClient({ socketPath: t.spdkSocket, logger: silentLogger, callTimeoutMs: 10_000 });
    const rpc = client;
    const target = new SpdkMethods(rpc);
    const hostA = await hostNqnOf(lab, a.name);
    /** The host's controllers of the subsystem: the listener each came through, and whether it did I/O. */
    const paths = async () => {
      const qs = (await rpc.call("nvmf_subsystem_get_qpairs", { nqn: t.nqn })) as Qpair[];
      const cs = (await target.nvmfSubsystemGetControllers(t.nqn)).filter((c) => c.hostnqn === hostA);
      return cs.map((c) => ({
        cntlid: c.cntlid,
        traddr: qs.find((q) => q.cntlid === c.cntlid)?.listen_address.traddr,
        port: Number(qs.find((q) => q.cntlid === c.cntlid)?.listen_address.trsvcid ?? 4420),
        // SPDK counts a controller's I/O qpairs; the emulator opens one with the first command.
        io: c.num_io_qpairs ?? 0,
      }));
    };
    const writerFailed = async () => {
      const p = await lab.core.readNamespacedPod({ name: "writer", namespace: ns });
      if (p.status?.phase === "Failed" || p.status?.message?.includes('"ok":false')) {
        throw new FinalError(`the writer failed: ${p.status?.message ?? p.status?.phase}`);
      }
      return p;
    };

    await lab.core.createNamespacedPod({
      namespace: ns,
      body: workloadPod("writer", a.name, "data", [
        "write",
        `--bytes=${bytes}`,
        `--seed=${seed}`,
        "--then-hold",
      ]),
    });
    // The path in use: the one whose controller has carried I/O (staging formatted the volume
    // through it; the other path's controller has had none). Cut while the Pod is still writing.
    await until(
      "the writer running",
      async () => {
        const p = await writerFailed();
        if (p.status?.message?.startsWith("{"))
          throw new FinalError("the writer finished before a path was cut");
        return p.status?.phase === "Running";
      },
      180_000,
    );
    // Both portals connected as paths (checked after the cut: a single path must fail there, on
    // the Pod's I/O, not here).
    const before = await until(
      "the host's controllers on both portals",
      async () => {
        const now = await paths();
        return now.length >= 2 ? now : undefined;
      },
      30_000,
    ).catch(() => paths());
    const used = before.find((p) => p.io > 0);
    if (!used?.traddr) throw new Error(`no path of ${hostA} has carried I/O: ${JSON.stringify(before)}`);
    const spare = portals.find((p) => p.address !== used.traddr);
    if (!spare) throw new Error(`no second portal besides ${used.traddr}`);

    // The agent would put the listener back within its verify period: hold it still meanwhile.
    const agentPid = lab.pid(storage.agent);
    if (agentPid === undefined) throw new Error(`${storage.agent} is not running`);
    frozen.add(agentPid);
    process.kill(agentPid, "SIGSTOP");
    await target.nvmfSubsystemRemoveListener({
      nqn: t.nqn,
      listen_address: { trtype: "TCP", adrfam: "IPv4", traddr: used.traddr, trsvcid: String(used.port) },
    });
    // The lost path's controller is gone on the target, and the writes go on through the other.
    await until(
      "the writer's I/O on the other path",
      async () => {
        await writerFailed();
        const now = await paths();
        if (now.some((p) => p.traddr === used.traddr))
          throw new Error(`a controller still on ${used.traddr}`);
        return now.some((p) => p.traddr === spare.address && p.io > 0) ? true : undefined;
      },
      60_000,
    );
    thaw();
    const written = await waitHeld(lab, ns, "writer", 300_000);
    expect(written).toMatchObject({ mode: "write", ok: true });
    // Both portals were connected as paths before the loss, the spare one idle.
    expect(before.map((p) => p.traddr).sort()).toEqual(portals.map((p) => p.address).sort());
    expect(before.find((p) => p.traddr === spare.address)?.io).toBe(0);

    // The agent restores the listener and the host's lost path reconnects (within ctrl_loss_tmo).
    await until(
      "both paths connected again",
      async () => new Set((await paths()).map((p) => p.traddr)).size === 2,
      60_000,
    );

    // The bytes, read on another node through the target, are exactly what the writer wrote.
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
    // What the consumer's NVMe host and CSI node said about the volume's paths, for the failure.
    dumpNodeLogs(lab, a.name, ["nvme-host", "csi-node"], /path|portal|connect|fast_io|error/i);
    throw err;
  } finally {
    thaw();
    await client?.close();
    await removeSuiteObjects(lab, ns, { pods: ["writer", "reader"], claims: ["data"], storageClass: sc });
  }
}, 900_000);
