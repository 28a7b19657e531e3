// Replicated volumes through the whole cluster (three SPDK storage nodes: node-a, node-b, node-c).
// replicas=2: the Pod's node connects the serving node and the other copy node's standby as two
// paths of one device; the serving node dies (kill -9 of its agent and nvmf_tgt, its kubelet and
// containerd first so nothing restarts them) while the Pod writes; the manager fences the dead node
// from the copies and moves the volume; the survivor serves from its own copy, its standby path
// turns optimized and the Pod's held writes complete there. Every byte the writer had
// acknowledged is read back on another node; the dead node's nexus host is refused by the
// surviving copy (by a connect).
// replicas=2, the serving node frozen in place (cgroup freezer and SIGSTOP: a paused VM, its
// sockets open) past the failover bound while the Pod writes, then thawed: the survivor serves,
// the thawed node stands by and serves again only after its copy is rebuilt; every byte the
// writer was told is written reads back, and again from the rebuilt copy once the survivor dies.
// replicas=3, two of three copy nodes down and back in the other order: a copy node dies while
// the serving node writes, then the serving node dies during the next writes (different bytes
// over the same blocks) and the last copy serves; the serving node comes back first, then the
// other: each is stale, never serves (no namespace on its target while the last copy serves),
// is rebuilt, and only then counts as current; the data read back is the newest bytes, and after
// the last original copy is killed too, the rebuilt copies serve those same bytes.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { kinds, type NVMePartition, type NVMeVolumeAttachment, type ReplicaStatus } from "../api/index.ts";
import { connectController, createTcpFabric } from "../lab/sim/spdk/fabric.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../lib/volume-identity.ts";
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
import { replicatedStorageClass, waitHeld } from "./user-steps.ts";

let lab: E2eLab;
beforeAll(async () => {
  lab = await e2eLab();
}, 120_000);
afterAll(async () => {
  await lab.stop();
});

const FAILOVER_AFTER_S = 5;
const BYTES = "512Mi";
const say = (s: string) => process.stdout.write(`${s}\n`);

/** A StorageClass like the lab's with `replicas` copies and the short failover bound. */
function replicatedClass(replicas: number): Promise<string> {
  return replicatedStorageClass(lab, {
    prefix: `e2e-repl${replicas}`,
    replicas,
    failoverAfterSeconds: FAILOVER_AFTER_S,
  });
}

/** One test's view of the cluster: the volume's objects, each storage node's target, node deaths. */
function fixture() {
  const parts = new ResourceClient(lab.conn, kinds.NVMePartition);
  const vas = new ResourceClient(lab.conn, kinds.NVMeVolumeAttachment);
  const clients: SpdkClient[] = [];
  const crashed = new Set<string>();
  const spdkOf = (node: string) => {
    const s = lab.storage.find((x) => x.name === node);
    if (!s) throw new Error(`${node} is no SPDK storage node of the lab`);
    const c = new SpdkClient({ socketPath: s.spdkSocket, logger: silentLogger, callTimeoutMs: 10_000 });
    clients.push(c);
    return new SpdkMethods(c);
  };
  const volume = (name: string) => parts.get(name, lab.namespace) as Promise<NVMePartition | undefined>;
  return {
    parts,
    vas,
    spdkOf,
    volume,
    /** The volume's `n` copies, once each is Exported. */
    copies: (volUid: string, n: number) =>
      until(
        `${n} copies exported`,
        async () => {
          const l = (await parts.list({ namespace: lab.namespace })).items.filter(
            (p: NVMePartition) => p.spec.replicaOf?.uid === volUid && p.status?.state === "Exported",
          );
          return l.length === n ? l : undefined;
        },
        180_000,
      ),
    /** The volume served by `copy`'s node: its own status (portal, Ready) past generation `after`. */
    servedBy: (name: string, copy: NVMePartition, after: number) =>
      until(
        `the volume served by ${copy.spec.nodeName} past generation ${after}`,
        async () => {
          const p = await volume(name);
          if (!p) return undefined;
          const ready = p.status?.conditions?.find((c) => c.type === "Ready");
          return p.spec.nodeName === copy.spec.nodeName &&
            ready?.status === "True" &&
            p.status?.portalIP === copy.status?.portalIP &&
            (p.status?.dataGeneration ?? 0) > after
            ? p
            : undefined;
        },
        180_000,
      ),
    /** The node dies: its kubelet and containerd (nothing restarts its containers), then kill -9 of its agent and nvmf_tgt. */
    kill(node: string): { down: Promise<number>; at: number } {
      const s = lab.storage.find((x) => x.name === node);
      if (!s) throw new Error(`no storage node ${node}`);
      const pids = [lab.pid(s.agent), lab.pid(s.target)];
      if (pids.some((p) => p === undefined)) throw new Error(`${node}'s agent or nvmf_tgt is not running`);
      crashed.add(node);
      const down = lab.crashNode(node);
      for (const pid of pids) process.kill(pid as number, "SIGKILL");
      return { down, at: Date.now() };
    },
    /** Brings a killed node back: Ready, and its agent and nvmf_tgt running again (the kubelet restarts them after its back-off), so the lab is left as found. */
    async restore(node: string): Promise<void> {
      await lab.restoreNode(node);
      crashed.delete(node);
      const s = lab.storage.find((x) => x.name === node);
      if (!s) return;
      await until(
        `${node}'s agent and nvmf_tgt running again`,
        async () => lab.pid(s.agent) !== undefined && lab.pid(s.target) !== undefined,
        300_000,
      );
    },
    async close(): Promise<void> {
      for (const n of crashed) await lab.restoreNode(n).catch(() => {});
      for (const c of clients) await c.close();
    },
  };
}

/** The ANA states of a target's listeners for `nqn`. */
async function anaStates(m: SpdkMethods, nqn: string): Promise<Set<string>> {
  return new Set(
    (await m.nvmfSubsystemGetListeners(nqn)).flatMap((l) => l.ana_states?.map((g) => g.ana_state) ?? []),
  );
}

/** The volume's namespaces on a node's target (none: a standby, or no export at all). */
async function namespacesOn(m: SpdkMethods, nqn: string): Promise<number> {
  const [sub] = await m.nvmfGetSubsystems(nqn).catch(() => []);
  return (sub?.namespaces ?? []).length;
}

const entryOf = (v: NVMePartition | undefined, copy: NVMePartition): ReplicaStatus | undefined =>
  v?.status?.replicas?.find((r) => r.name === copy.metadata.name);
/** A copy the volume counts as holding every acknowledged write. */
const isCurrent = (v: NVMePartition | undefined, copy: NVMePartition) => {
  const e = entryOf(v, copy);
  return (
    e !== undefined &&
    e.generation === v?.status?.dataGeneration &&
    (e.state === "Online" || e.state === "Degraded")
  );
};

/**
 * A replicas=2 volume's writer: the copies (both Exported), the other copy node's standby export
 * (no namespace, listeners inaccessible), and a writer Pod ("writer", `BYTES` of `seed`, held)
 * on a consumer node without a copy, running with a controller on both copy nodes.
 */
async function writerOnBothPaths(
  f: ReturnType<typeof fixture>,
  ns: string,
  t: Awaited<ReturnType<typeof volumeTarget>>,
  seed: string,
  onWriterNode: (node: string) => void,
): Promise<{ copies: NVMePartition[]; other: string; standby: SpdkMethods; writerNode: string }> {
  const serving = t.storageNode;
  const copies = await f.copies(t.partition.metadata.uid as string, 2);
  const copyNodes = copies.map((c) => c.spec.nodeName as string);
  const other = copyNodes.find((n) => n !== serving);
  if (!other) throw new Error(`both copies on ${serving}`);
  // The writer runs on a node that holds no copy (its node must outlive the serving node).
  const writerNode =
    lab.consumers.map((c) => c.name).find((n) => !copyNodes.includes(n)) ?? lab.kernelStorage[0]?.name ?? "";
  if (!writerNode) throw new Error("no consumer node without a copy");
  onWriterNode(writerNode);
  const standby = f.spdkOf(other);
  // The other copy node stands by: the volume's subsystem, no namespace, listener inaccessible.
  await until(
    `the standby export on ${other}`,
    async () => {
      const [sub] = await standby.nvmfGetSubsystems(t.nqn).catch(() => []);
      return sub && (sub.namespaces ?? []).length === 0 ? sub : undefined;
    },
    60_000,
  );
  expect(await anaStates(standby, t.nqn)).toEqual(new Set(["inaccessible"]));

  await lab.core.createNamespacedPod({
    namespace: ns,
    body: workloadPod("writer", writerNode, "data", [
      "write",
      `--bytes=${BYTES}`,
      `--seed=${seed}`,
      "--then-hold",
    ]),
  });
  const host = await hostNqnOf(lab, writerNode);
  // The Pod's node holds a controller on both nodes: the serving path and the standby one.
  await until(
    "the consumer's controllers on both nodes",
    async () => {
      const p = await lab.core.readNamespacedPod({ name: "writer", namespace: ns });
      if (p.status?.phase === "Failed") throw new FinalError(`the writer failed: ${p.status?.message}`);
      if (p.status?.phase !== "Running") return undefined;
      const on = async (m: SpdkMethods) =>
        (await m.nvmfSubsystemGetControllers(t.nqn)).some((c) => c.hostnqn === host);
      return (await on(f.spdkOf(serving))) && (await on(standby)) ? true : undefined;
    },
    180_000,
  );
  const running = await lab.core.readNamespacedPod({ name: "writer", namespace: ns });
  if (running.status?.message?.startsWith("{")) throw new Error("the writer finished before the node died");
  return { copies, other, standby, writerNode };
}

test("replicas=2: the serving node is killed during writes; it is fenced, the other copy node serves, the Pod's writes resume on its standby path and verify", async () => {
  if (lab.storage.length < 2) throw new Error("the lab needs two SPDK storage nodes");
  const sc = await replicatedClass(2);
  const ns = await lab.newNamespace("replicated");
  const seed = `${ns}-repl`;
  const f = fixture();
  let writerNode = "";
  try {
    await createPvc(lab, ns, "data", { storageClass: sc, size: "1Gi" });
    const t = await volumeTarget(lab, ns, "data");
    const vol = t.partition;
    const serving = t.storageNode;
    const w = await writerOnBothPaths(f, ns, t, seed, (n) => {
      writerNode = n;
    });
    const { copies, other, standby } = w;

    const death = f.kill(serving);

    // The manager fences the dead node (the copies' attachments admit the survivor's nexus host
    // only) and then moves the volume; the survivor serves it.
    const survivor = copies.find((c) => c.spec.nodeName === other) as NVMePartition;
    const dead = copies.find((c) => c.spec.nodeName === serving) as NVMePartition;
    const moved = await f.servedBy(vol.metadata.name, survivor, 1);
    const servedAfterMs = Date.now() - death.at;
    // The live copy's attachment admits the survivor's nexus host alone (the dead node's copy
    // cannot be reached to change, and leaves the current set instead).
    const att = await f.vas.get(
      attachmentNameFor(survivor.metadata.name, survivor.metadata.uid as string),
      lab.namespace,
    );
    expect((att as NVMeVolumeAttachment).spec.hostNQN).toBe(nexusHostNqnFor(other));
    // Shown by a connect: the surviving copy refuses the dead node's nexus host.
    const fabric = createTcpFabric();
    const fenced = await connectController(fabric, {
      trtype: "TCP",
      traddr: survivor.status?.portalIP as string,
      trsvcid: String(survivor.status?.portalPort),
      subnqn: survivor.status?.nqn as string,
      hostnqn: nexusHostNqnFor(serving),
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
    expect(entryOf(moved, survivor)).toMatchObject({
      state: "Online",
      generation: moved.status?.dataGeneration,
    });
    // The dead node's copy left the current set (the manager's failover records it Stale; the
    // survivor's nexus would record it Faulted): behind the generation, never read again.
    const gone = entryOf(moved, dead);
    expect(["Stale", "Faulted"]).toContain(gone?.state as string);
    expect(gone?.generation ?? 0).toBeLessThan(moved.status?.dataGeneration ?? 0);

    // The Pod's held writes complete through its standby path, now optimized.
    const written = await waitHeld(lab, ns, "writer", 300_000);
    expect(written).toMatchObject({ mode: "write", ok: true });
    expect(await anaStates(standby, t.nqn)).toEqual(new Set(["optimized"]));
    say(
      `replicated failover: served by ${other} ${(servedAfterMs / 1000).toFixed(1)} s after ${serving} was killed (failoverAfterSeconds ${FAILOVER_AFTER_S})`,
    );
    // Bound: the heartbeat timeout, the fencing, the survivor's wait on the lost copy (10 s) and
    // the path switch, with room for a loaded 2-core machine.
    expect(servedAfterMs).toBeLessThan(120_000);

    await death.down;
    await f.restore(serving);

    // Every byte the writer wrote, read on another node, as the writer reported it.
    await deletePod(lab, ns, "writer", 180_000);
    await lab.core.createNamespacedPod({
      namespace: ns,
      body: workloadPod("reader", other, "data", [
        "verify",
        `--bytes=${BYTES}`,
        `--seed=${seed}`,
        "--then-hold",
      ]),
    });
    const read = await waitHeld(lab, ns, "reader", 300_000);
    expect(read).toMatchObject({ ok: true, sha256: written.sha256 });
  } catch (err) {
    if (writerNode)
      dumpNodeLogs(lab, writerNode, ["nvme-host", "csi-node"], /path|portal|connect|ana|error/i);
    throw err;
  } finally {
    await f.close();
    await removeSuiteObjects(lab, ns, { pods: ["writer", "reader"], claims: ["data"], storageClass: sc });
  }
}, 900_000);

test("replicas=2: the serving node freezes in place (a paused VM: its processes stopped, its sockets open) past the failover bound during writes, then runs on: the other copy serves, nothing the frozen node completes late is lost, its copy serves again only after a rebuild, and then serves the same bytes", async () => {
  if (lab.storage.length < 2) throw new Error("the lab needs two SPDK storage nodes");
  const sc = await replicatedClass(2);
  const ns = await lab.newNamespace("frozen");
  const seed = `${ns}-frozen`;
  const f = fixture();
  let writerNode = "";
  let frozen: string | undefined;
  try {
    await createPvc(lab, ns, "data", { storageClass: sc, size: "1Gi" });
    const t = await volumeTarget(lab, ns, "data");
    const name = t.partition.metadata.name;
    const serving = t.storageNode;
    const { copies, other } = await writerOnBothPaths(f, ns, t, seed, (n) => {
      writerNode = n;
    });
    const survivor = copies.find((c) => c.spec.nodeName === other) as NVMePartition;
    const old = copies.find((c) => c.spec.nodeName === serving) as NVMePartition;

    // Frozen with writes in flight to it: its target holds them, unanswered, in open sockets.
    const frozeAt = Date.now();
    frozen = serving;
    await lab.freezeNode(serving);
    const moved = await f.servedBy(name, survivor, 1);
    say(
      `frozen node: ${other} served ${((Date.now() - frozeAt) / 1000).toFixed(1)} s after ${serving} froze (failoverAfterSeconds ${FAILOVER_AFTER_S})`,
    );
    expect(isCurrent(moved, old)).toBe(false);
    // The writer goes on through the survivor for a while before the old node runs again.
    await Bun.sleep(5_000);
    await lab.thawNode(serving);
    frozen = undefined;

    // Thawed, the old node stands by (no namespace of the volume on its target) and its copy
    // counts again only once rebuilt; the survivor serves throughout.
    const oldTarget = f.spdkOf(serving);
    let seenStale = false;
    await until(
      `${serving}'s copy rebuilt after the thaw, ${other} serving throughout`,
      async () => {
        const v = await f.volume(name);
        if (v?.spec.nodeName !== other)
          throw new FinalError(`the volume moved to ${v?.spec.nodeName} while ${other} was alive`);
        if ((await namespacesOn(oldTarget, t.nqn).catch(() => 0)) > 0) return undefined;
        if (!isCurrent(v, old)) {
          seenStale = true;
          return undefined;
        }
        return v;
      },
      300_000,
    );
    expect(seenStale).toBe(true);
    const written = await waitHeld(lab, ns, "writer", 300_000);
    expect(written).toMatchObject({ mode: "write", ok: true });

    // Every byte the writer was told is written, read through the survivor.
    await deletePod(lab, ns, "writer", 180_000);
    const readBack = async (pod: string) => {
      await lab.core.createNamespacedPod({
        namespace: ns,
        body: workloadPod(pod, writerNode, "data", [
          "verify",
          `--bytes=${BYTES}`,
          `--seed=${seed}`,
          "--then-hold",
        ]),
      });
      expect(await waitHeld(lab, ns, pod, 300_000)).toMatchObject({ ok: true, sha256: written.sha256 });
      await deletePod(lab, ns, pod, 180_000);
    };
    await readBack("reader");

    // Failback: the survivor dies; the rebuilt copy on the once-frozen node serves the same bytes.
    const g = (await f.volume(name))?.status?.dataGeneration ?? 0;
    const death = f.kill(other);
    await f.servedBy(name, old, g);
    say(
      `frozen node: ${serving} (rebuilt) served ${((Date.now() - death.at) / 1000).toFixed(1)} s after ${other} was killed`,
    );
    await readBack("reader-2");
    await death.down;
    await f.restore(other);
  } catch (err) {
    if (writerNode)
      dumpNodeLogs(lab, writerNode, ["nvme-host", "csi-node"], /path|portal|connect|ana|error/i);
    throw err;
  } finally {
    if (frozen) await lab.thawNode(frozen).catch(() => {});
    await f.close();
    await removeSuiteObjects(lab, ns, {
      pods: ["writer", "reader", "reader-2"],
      claims: ["data"],
      storageClass: sc,
    });
  }
}, 1_200_000);

test("replicas=3: two copy nodes down (a copy node, then the serving node, during writes) and back in the other order: the stale copies never serve, are rebuilt, and then serve the newest bytes", async () => {
  if (lab.storage.length < 3) throw new Error("the lab needs three SPDK storage nodes");
  // The writer's node holds no copy: the kernel-backend node, a consumer of SPDK volumes too.
  const writerNode = lab.kernelStorage[0]?.name;
  if (!writerNode) throw new Error("the lab needs its kernel-backend node as a consumer");
  const sc = await replicatedClass(3);
  const ns = await lab.newNamespace("replicated3");
  const f = fixture();
  const pods = ["writer-1", "writer-2", "reader-1", "reader-2"];
  const runPod = async (name: string, args: string[]) => {
    await lab.core.createNamespacedPod({ namespace: ns, body: workloadPod(name, writerNode, "data", args) });
  };
  const writing = (name: string) =>
    until(
      `${name} writing`,
      async () => {
        const p = await lab.core.readNamespacedPod({ name, namespace: ns });
        if (p.status?.phase === "Failed") throw new FinalError(`${name} failed: ${p.status?.message}`);
        return p.status?.phase === "Running" ? true : undefined;
      },
      180_000,
    );
  try {
    await createPvc(lab, ns, "data", { storageClass: sc, size: "1Gi" });
    const t = await volumeTarget(lab, ns, "data");
    const name = t.partition.metadata.name;
    const copies = await f.copies(t.partition.metadata.uid as string, 3);
    const nodes = copies.map((c) => c.spec.nodeName as string);
    expect(new Set(nodes).size).toBe(3);
    const copyOn = (n: string) => copies.find((c) => c.spec.nodeName === n) as NVMePartition;
    // S serves; Y dies first, then S; Z is the last current copy. Back: S first, then Y.
    const s = t.storageNode;
    const [y, z] = nodes.filter((n) => n !== s) as [string, string];
    const host = await hostNqnOf(lab, writerNode);
    say(`replicas=3: copies on ${nodes.join(", ")}; ${s} serves; ${y} dies first, then ${s}`);

    // Writes 1 (seed 1) run while Y dies: the serving node's nexus goes on with S and Z.
    await runPod("writer-1", ["write", `--bytes=${BYTES}`, `--seed=${ns}-one`, "--then-hold"]);
    await writing("writer-1");
    await until(
      "the writer's controllers on all three copy nodes",
      async () => {
        for (const n of nodes)
          if (!(await f.spdkOf(n).nvmfSubsystemGetControllers(t.nqn)).some((c) => c.hostnqn === host))
            return undefined;
        return true;
      },
      180_000,
    );
    const deathY = f.kill(y);
    const one = await waitHeld(lab, ns, "writer-1", 300_000);
    expect(one).toMatchObject({ mode: "write", ok: true });
    const afterY = await until(
      `${y}'s copy out of the current set`,
      async () => {
        const v = await f.volume(name);
        return v && !isCurrent(v, copyOn(y)) && isCurrent(v, copyOn(z)) ? v : undefined;
      },
      120_000,
    );
    expect(afterY.spec.nodeName).toBe(s);
    await deletePod(lab, ns, "writer-1", 180_000);

    // Writes 2 (seed 2, over the same blocks) run while S dies: Z alone is current and serves.
    await runPod("writer-2", ["write", `--bytes=${BYTES}`, `--seed=${ns}-two`, "--then-hold"]);
    await writing("writer-2");
    const g1 = afterY.status?.dataGeneration ?? 0;
    const deathS = f.kill(s);
    const onZ = await f.servedBy(name, copyOn(z), g1);
    say(`replicas=3: ${z} served ${((Date.now() - deathS.at) / 1000).toFixed(1)} s after ${s} was killed`);
    const two = await waitHeld(lab, ns, "writer-2", 300_000);
    expect(two).toMatchObject({ mode: "write", ok: true });
    expect(two.sha256).not.toBe(one.sha256);
    for (const n of [s, y]) expect(isCurrent(onZ, copyOn(n))).toBe(false);
    await deathY.down;
    await deathS.down;

    // Back in the other order: S (the stale former serving node) first, then Y. While a node is
    // stale, Z alone has the volume's namespace; it serves again only once rebuilt to the
    // current generation.
    const zTarget = f.spdkOf(z);
    const staleUntilRebuilt = async (n: string) => {
      const m = f.spdkOf(n);
      let seenStale = false;
      const rebuilt = await until(
        `${n}'s copy rebuilt to the current generation, ${z} serving throughout`,
        async () => {
          const v = await f.volume(name);
          if (v?.spec.nodeName !== z)
            throw new FinalError(`the volume moved to ${v?.spec.nodeName} while ${z} was alive`);
          const namespaces = await namespacesOn(m, t.nqn).catch(() => 0);
          if (namespaces > 0) throw new FinalError(`${n} exports the volume's namespace while ${z} serves`);
          if (!isCurrent(v, copyOn(n))) {
            seenStale = true;
            return undefined;
          }
          return v;
        },
        300_000,
      );
      expect(seenStale).toBe(true);
      expect(await namespacesOn(zTarget, t.nqn)).toBe(1);
      return rebuilt;
    };
    await f.restore(s);
    await staleUntilRebuilt(s);
    await f.restore(y);
    const all = await staleUntilRebuilt(y);
    for (const n of nodes)
      expect(entryOf(all, copyOn(n))).toMatchObject({
        state: "Online",
        generation: all.status?.dataGeneration,
      });
    // A standby on every other copy node, inaccessible; the serving listener optimized.
    for (const n of [s, y]) {
      await until(
        `${n}'s standby export`,
        async () =>
          (await namespacesOn(f.spdkOf(n), t.nqn)) === 0 &&
          (await anaStates(f.spdkOf(n), t.nqn)).has("inaccessible")
            ? true
            : undefined,
        60_000,
      );
    }

    // The newest bytes (seed 2), read while Z serves.
    await deletePod(lab, ns, "writer-2", 180_000);
    await runPod("reader-1", ["verify", `--bytes=${BYTES}`, `--seed=${ns}-two`, "--then-hold"]);
    expect(await waitHeld(lab, ns, "reader-1", 300_000)).toMatchObject({ ok: true, sha256: two.sha256 });
    await deletePod(lab, ns, "reader-1", 180_000);

    // Z dies too: the volume is served from a rebuilt copy, and reads the same newest bytes.
    const g2 = all.status?.dataGeneration ?? 0;
    const deathZ = f.kill(z);
    const next = await until(
      `the volume served by ${s} or ${y} past generation ${g2}`,
      async () => {
        const v = await f.volume(name);
        const ready = v?.status?.conditions?.find((c) => c.type === "Ready");
        return v &&
          [s, y].includes(v.spec.nodeName as string) &&
          ready?.status === "True" &&
          (v.status?.dataGeneration ?? 0) > g2
          ? v
          : undefined;
      },
      180_000,
    );
    say(
      `replicas=3: ${next.spec.nodeName} (rebuilt) served ${((Date.now() - deathZ.at) / 1000).toFixed(1)} s after ${z} was killed`,
    );
    await runPod("reader-2", ["verify", `--bytes=${BYTES}`, `--seed=${ns}-two`, "--then-hold"]);
    expect(await waitHeld(lab, ns, "reader-2", 300_000)).toMatchObject({ ok: true, sha256: two.sha256 });
    await deathZ.down;
    await f.restore(z);
  } catch (err) {
    dumpNodeLogs(lab, writerNode, ["nvme-host", "csi-node"], /path|portal|connect|ana|error/i);
    throw err;
  } finally {
    await f.close();
    await removeSuiteObjects(lab, ns, { pods, claims: ["data"], storageClass: sc });
  }
}, 1_500_000);
