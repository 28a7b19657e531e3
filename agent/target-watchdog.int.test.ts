// The target watchdog, shown by I/O. Node A serves a replicated volume (two copies: A's local,
// B's over NVMe-oF; failoverAfterSeconds 5) and a consumer writes through A. A's agent runs as a
// child process and its emulated nvmf_tgt in this one, with the watchdog (distort-agent
// --mode=target-watchdog, a child process too) beside the target, as in the target's Pod.
// (1) While A's agent lives and renews its lease, the watchdog fences nothing: I/O through A goes
// on past several deadlines; a fence the watchdog sets on it (a stale lease) is lifted by the agent
// after its next heartbeat. (2) A's agent is SIGKILLed: nobody self-fences, the target keeps
// serving A's local copy. Past the lease's deadline (the last heartbeat + 60% of the bound) the
// watchdog sets A's listener inaccessible: a read through A is refused with a path error, before
// the manager's failover bound. (3) A's agent restarted (the volume still names A) while the API
// server refuses its heartbeats (an admission policy on its RDMAStorageNode's status) serves
// nothing; once they go through it serves again, after a heartbeat newer than the fence (without
// the fence record read at start, it served before any heartbeat). (4) Killed again and not restarted: fenced again;
// then the failover, played as the manager does it at its bound (A fenced from both copies, the
// volume moved to B): B serves, a write through B is acknowledged, and no read through A returns
// the older data. (5) A's agent back after that: still no read through A returns data.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { rm } from "node:fs/promises";
import { join } from "node:path";
import { kinds, type NVMePartition, type NVMeVolumeAttachment } from "../api/index.ts";
import { eventually } from "../lab/cluster/test-support.ts";
import {
  type ReplicatedLab,
  serveReplicatedVolume,
  startReplicatedLab,
} from "../lab/harness/replicated-lab.ts";
import { connectController } from "../lab/sim/spdk/fabric.ts";
import { PATH_ERRNO } from "../lab/sim/spdk/rpc-error.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { createLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../lib/volume-identity.ts";
import { externalIdFor, nqnFor } from "./partitions/identity.ts";
import { writeFileAtomic } from "./watchdog/atomic-file.ts";
import { parseFenceRecord, parseLease, watchdogPaths } from "./watchdog/lease.ts";

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;
const A = "127.0.54.1";
const B = "127.0.54.2";
const PORT = 40000 + Math.floor(Math.random() * 3000);
const NODE_A = "wd-a";
const NODE_B = "wd-b";
const CONSUMER_ID = randomUUID();
const CONSUMER = `nqn.2014-08.org.nvmexpress:uuid:${CONSUMER_ID}`;
const FAILOVER_AFTER_S = 5;
const POLL_MS = 250;

let lab: ReplicatedLab | undefined;
let watchdog: ReturnType<typeof Bun.spawn> | undefined;
let watchdogLog = "";

beforeAll(async () => {
  lab = await startReplicatedLab({
    namespacePrefix: "watchdog",
    nodes: [
      {
        name: NODE_A,
        address: A,
        drives: [{ serial: "SIMWDA01", pciAddress: "0000:3d:00.0", sizeBytes: 4 * GiB }],
      },
      {
        name: NODE_B,
        address: B,
        drives: [{ serial: "SIMWDB01", pciAddress: "0000:3d:00.0", sizeBytes: 4 * GiB }],
      },
    ],
    port: PORT,
    agentEnv: {
      DISTORT_HEARTBEAT_PERIOD_MS: "500",
      DISTORT_REBUILDS_PER_NODE: "0",
      DISTORT_NEXUS_DEGRADE_AFTER_MS: "2000",
      // No verify pass puts a fenced export back on its own within the test's windows.
      DISTORT_VERIFY_PERIOD_MS: "60000",
    },
    childAgents: [NODE_A],
  });
  const nodeA = lab.nodes[0];
  if (!nodeA) throw new Error("no node A");
  // The watchdog beside A's target: the agent binary's entry mode, its own SPDK connection.
  watchdog = Bun.spawn([process.execPath, join(import.meta.dir, "main.ts"), "--mode=target-watchdog"], {
    env: {
      PATH: process.env.PATH ?? "",
      DISTORT_SPDK_SOCKET: nodeA.spdkSocket,
      NODE_NAME: NODE_A,
      DISTORT_WATCHDOG_POLL_MS: String(POLL_MS),
      DISTORT_LOG_LEVEL: "info",
    },
    stdout: "ignore",
    stderr: "pipe",
  });
  void (async () => {
    const dec = new TextDecoder();
    for await (const chunk of watchdog.stderr as ReadableStream<Uint8Array>) watchdogLog += dec.decode(chunk);
  })();
}, 300_000);

afterAll(async () => {
  if (watchdog && watchdog.exitCode === null) {
    watchdog.kill("SIGTERM");
    await Promise.race([watchdog.exited, Bun.sleep(5_000)]);
    if (watchdog.exitCode === null && watchdog.signalCode === null) watchdog.kill("SIGKILL");
  }
  await lab?.close();
  if (process.env.DISTORT_TEST_LOG) process.stderr.write(watchdogLog);
});

test("a live agent's renewed lease is never fenced; a dead agent's target is fenced by the watchdog before the failover bound, and no read through it returns data older than the new serving node acknowledged", async () => {
  const l = lab as ReplicatedLab;
  const { fabric } = l;
  const nodeA = l.nodes[0] as (typeof l.nodes)[number];
  const paths = watchdogPaths(nodeA.spdkSocket);
  const { uid: volUid, copies } = await serveReplicatedVolume(l, {
    name: "vol",
    sizeBytes: 64 * MiB,
    copies: [
      ["SIMWDA01", "vol-r0"],
      ["SIMWDB01", "vol-r1"],
    ],
    servingNode: NODE_A,
    spec: { failoverAfterSeconds: FAILOVER_AFTER_S },
    consumer: { hostNQN: CONSUMER, nodeId: `consumer-1/${CONSUMER}` },
  });
  const nqn = nqnFor(externalIdFor(volUid));
  const connect = (traddr: string) =>
    connectController(fabric, {
      trtype: "TCP",
      traddr,
      trsvcid: String(PORT),
      subnqn: nqn,
      hostnqn: CONSUMER,
      hostid: CONSUMER_ID,
    });
  const lease = () => {
    const r = parseLease(readFileSync(paths.lease, "utf8"), NODE_A);
    if (r.kind !== "valid") throw new Error(`lease not valid: ${JSON.stringify(r)}`);
    return r.lease;
  };
  const block = (v: number) => Buffer.alloc(64 * 1024, v);
  const OFF = 8 * MiB;
  const pathA = await connect(A);
  /** A read through A: "data:<first byte>" or "refused:<errno>", or "no answer" within 3 s. */
  const readA = () =>
    Promise.race([
      pathA.read(1, OFF, 64 * 1024).then(
        (d) => `data:${d[0]}${d.equals(block(d[0] as number)) ? "" : " (mixed)"}`,
        (err: Error & { errno?: number }) => `refused:${err.errno}`,
      ),
      Bun.sleep(3_000).then(() => "no answer"),
    ]);
  try {
    // The lease names the served nexus with the agent's own self-fence deadline.
    await eventually(
      async () => (existsSync(paths.lease) && lease().nqns.includes(nqn) ? true : undefined),
      20_000,
      "A's lease naming the volume",
    );
    const first = lease();
    expect(first.fenceAtMs).toBe(first.heartbeatMs + FAILOVER_AFTER_S * 1000 * 0.6);

    // (1) Alive: I/O through A goes on across more than two lease deadlines (3 s each).
    await pathA.write(1, OFF, block(1));
    await pathA.flush(1);
    const liveUntil = Date.now() + 7_000;
    let liveIos = 0;
    for (let i = 0; i < 200 && Date.now() < liveUntil; i++) {
      expect(await readA()).toBe("data:1");
      liveIos++;
      await Bun.sleep(200);
    }
    expect(liveIos).toBeGreaterThan(10);
    expect(lease().heartbeatMs).toBeGreaterThan(first.fenceAtMs as number);
    expect(existsSync(paths.record)).toBe(false);
    expect(pathA.anaState).toBe("optimized");

    /**
     * Kills A's agent (SIGKILL, by PID; not restarted) and shows the watchdog's fence by I/O: A
     * serves block `v` until the lease's deadline, then refuses, before the failover bound.
     */
    const killAndShowFence = async (v: number) => {
      const agentA = l.agents[0];
      const pid = agentA?.pid;
      if (!pid) throw new Error("A's agent is not a child process");
      process.kill(pid, "SIGKILL");
      await agentA.exited;
      const killedAt = Date.now();
      const last = lease();
      const fenceAt = last.fenceAtMs as number;
      const failoverAt = last.heartbeatMs + FAILOVER_AFTER_S * 1000;
      // Until the deadline, A still serves its local copy (nobody else fences it).
      let refused = "";
      let refusedAt = 0;
      for (let i = 0; i < 400 && Date.now() < killedAt + 20_000; i++) {
        const r = await readA();
        if (r.startsWith("refused")) {
          refused = r;
          refusedAt = Date.now();
          break;
        }
        expect(r).toBe(`data:${v}`);
        await Bun.sleep(50);
      }
      process.stdout.write(
        `target watchdog: a read through A refused ${refusedAt - fenceAt} ms after the lease's deadline, ${failoverAt - refusedAt} ms before the failover bound (${refused})\n`,
      );
      expect(refused).toBe(`refused:${PATH_ERRNO}`);
      // Not before the deadline; within a poll and a loaded machine's slack after it; before the
      // manager may fail over.
      expect(refusedAt).toBeGreaterThanOrEqual(fenceAt);
      expect(refusedAt - fenceAt).toBeLessThan(POLL_MS + 1_250);
      expect(refusedAt).toBeLessThan(failoverAt);
      await eventually(
        async () => (pathA.anaState === "inaccessible" ? true : undefined),
        5_000,
        "ANA notice on A's path",
      );
      const record = await eventually(
        async () => {
          if (!existsSync(paths.record)) return undefined;
          const r = parseFenceRecord(readFileSync(paths.record, "utf8"));
          return "record" in r && r.record.leaseHeartbeatMs === last.heartbeatMs ? r.record : undefined;
        },
        5_000,
        "fence record of this lease",
      );
      expect(record.nqns).toEqual([nqn]);
      expect(watchdogLog).toContain("serving lease expired");
      return { failoverAt, record };
    };

    // (1b) The watchdog fences a live agent (its lease went stale for a moment: a heartbeat
    // slower than the deadline), played here as the watchdog does it: A's listener set
    // inaccessible over A's RPC socket, then the fence record. The agent takes the record in and
    // serves again after its next heartbeat, not at its next verify (a minute here).
    const spdkA = new SpdkMethods(
      new SpdkClient({ socketPath: nodeA.spdkSocket, logger: createLogger({ level: "error" }) }),
    );
    const fencedAt = Date.now();
    for (const li of await spdkA.nvmfSubsystemGetListeners(nqn))
      await spdkA.nvmfSubsystemListenerSetAnaState({
        nqn,
        listen_address: {
          trtype: li.address.trtype,
          adrfam: (li.address.adrfam ?? "IPv4") as "IPv4",
          traddr: li.address.traddr,
          trsvcid: li.address.trsvcid ?? "",
        },
        ana_state: "inaccessible",
      });
    expect(await readA()).toBe(`refused:${PATH_ERRNO}`);
    const cur = lease();
    await writeFileAtomic(
      paths.record,
      `${JSON.stringify({ version: 1, node: NODE_A, fencedAtMs: fencedAt, leaseHeartbeatMs: cur.heartbeatMs, fenceAtMs: cur.heartbeatMs, nqns: [nqn] })}\n`,
    );
    const back = await eventually(
      async () => ((await readA()) === "data:1" ? Date.now() : undefined),
      10_000,
      "A serving again after the watchdog's fence on a live agent",
    );
    process.stdout.write(
      `target watchdog: a live agent served again ${back - fencedAt} ms after the watchdog's fence\n`,
    );
    await rm(paths.record);

    // (2) A's agent is killed; its target (in this process) and the watchdog go on.
    await pathA.write(1, OFF, block(2));
    await pathA.flush(1);
    expect(await readA()).toBe("data:2");
    const firstFence = await killAndShowFence(2);

    // (3) A's agent comes back before any failover (the volume still names A). It reads the fence
    // record: A serves again only once a heartbeat newer than the fence went through. To show the
    // order, the API server refuses A's heartbeats at first (an admission policy on its
    // RDMAStorageNode's status), and nothing is served through A meanwhile.
    const policyName = `wd-no-heartbeat-${l.ns}`.slice(0, 63);
    const vap = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies";
    const vapb = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings";
    const post = async (path: string, body: unknown) => {
      const r = await l.tc.conn.request(path, {
        method: "POST",
        body: JSON.stringify(body),
        contentType: "application/json",
      });
      if (!r.ok) throw new Error(`POST ${path}: ${r.status} ${await r.text()}`);
    };
    await post(vap, {
      apiVersion: "admissionregistration.k8s.io/v1",
      kind: "ValidatingAdmissionPolicy",
      metadata: { name: policyName },
      spec: {
        failurePolicy: "Fail",
        matchConstraints: {
          resourceRules: [
            {
              apiGroups: ["storage.distort.io"],
              apiVersions: ["*"],
              operations: ["UPDATE"],
              resources: ["rdmastoragenodes/status"],
            },
          ],
        },
        validations: [
          {
            expression: `!(object.metadata.name == '${NODE_A}' && object.metadata.namespace == '${l.ns}')`,
            message: "heartbeats of this node are refused by the test",
          },
        ],
      },
    });
    await post(vapb, {
      apiVersion: "admissionregistration.k8s.io/v1",
      kind: "ValidatingAdmissionPolicyBinding",
      metadata: { name: policyName },
      spec: { policyName, validationActions: ["Deny"] },
    });
    const statusPath = `/apis/storage.distort.io/v1alpha1/namespaces/${l.ns}/rdmastoragenodes/${NODE_A}/status`;
    await eventually(
      async () => {
        const r = await l.tc.conn.request(statusPath, {
          method: "PATCH",
          body: "{}",
          contentType: "application/merge-patch+json",
        });
        return r.status === 403 || r.status === 422 ? true : undefined;
      },
      30_000,
      "A's heartbeats refused",
    );
    const startedBlindAt = Date.now();
    await l.startAgent(0);
    const blindUntil = Date.now() + 4_000;
    const blind = new Set<string>();
    for (let i = 0; i < 100 && Date.now() < blindUntil; i++) {
      blind.add(await readA());
      await Bun.sleep(100);
    }
    // Reconciled (ready) and holding a fresh list naming A, but no heartbeat: nothing served.
    expect([...blind]).toEqual([`refused:${PATH_ERRNO}`]);
    expect(lease().heartbeatMs).toBeLessThan(startedBlindAt);
    for (const path of [vapb, vap]) await l.tc.conn.request(`${path}/${policyName}`, { method: "DELETE" });
    const restartedAt = Date.now();
    // The restarted agent's first heartbeat, as its first lease names it.
    let firstHeartbeatMs = 0;
    const watchLease = (async () => {
      for (let i = 0; i < 3000 && !firstHeartbeatMs && Date.now() < restartedAt + 60_000; i++) {
        const r = parseLease(readFileSync(paths.lease, "utf8"), NODE_A);
        if (r.kind === "valid" && r.lease.heartbeatMs > restartedAt) firstHeartbeatMs = r.lease.heartbeatMs;
        await Bun.sleep(10);
      }
    })();
    let servedAgainAt = 0;
    for (let i = 0; i < 600 && Date.now() < restartedAt + 60_000; i++) {
      const r = await readA();
      if (r === "data:2") {
        servedAgainAt = Date.now();
        break;
      }
      expect(r).toBe(`refused:${PATH_ERRNO}`);
      await Bun.sleep(50);
    }
    expect(servedAgainAt).toBeGreaterThan(0);
    await watchLease;
    // Served again only after that heartbeat (the agent read the watchdog's record).
    expect(firstHeartbeatMs).toBeGreaterThan(0);
    expect(servedAgainAt).toBeGreaterThan(firstHeartbeatMs);
    const nodes = new ResourceClient(l.tc.conn, kinds.RDMAStorageNode);
    const heartbeat = Date.parse((await nodes.get(NODE_A, l.ns))?.status?.lastHeartbeatTime ?? "");
    expect(heartbeat).toBeGreaterThan(firstFence.record.fencedAtMs);
    expect(lease().heartbeatMs).toBeGreaterThan(firstFence.record.fencedAtMs);
    process.stdout.write(
      `target watchdog: A's restarted agent served again ${servedAgainAt - restartedAt} ms after its heartbeats were let through\n`,
    );
    await pathA.write(1, OFF, block(4));
    await pathA.flush(1);
    expect(await readA()).toBe("data:4");

    // (4) Killed again, for good: fenced again at the new lease's deadline.
    const { failoverAt } = await killAndShowFence(4);

    // The manager's failover at its bound: A fenced from both copies, then the volume moved to B.
    await Bun.sleep(Math.max(0, failoverAt - Date.now()));
    const parts = new ResourceClient(l.tc.conn, kinds.NVMePartition);
    const vas = new ResourceClient(l.tc.conn, kinds.NVMeVolumeAttachment);
    for (const c of copies as NVMePartition[]) {
      const name = attachmentNameFor(c.metadata.name, c.metadata.uid as string);
      const a = (await vas.get(name, l.ns)) as NVMeVolumeAttachment;
      await vas.replace({
        ...a,
        spec: {
          ...a.spec,
          nodeId: `${NODE_B}/${nexusHostNqnFor(NODE_B)}`,
          hostNQN: nexusHostNqnFor(NODE_B),
          attachmentId: `nexus-${c.metadata.name}-${NODE_B}`,
        },
      });
    }
    await parts.mergePatch("vol", l.ns, { metadata: { uid: volUid }, spec: { nodeName: NODE_B } });
    // B serves (A's copy is out of reach: its dead agent cannot admit B; B degrades to its own).
    const pathB = await eventually(
      async () => {
        const c = await connect(B).catch(() => undefined);
        if (c && c.anaState === "optimized" && c.namespaces.length === 1) return c;
        c?.close();
        return undefined;
      },
      60_000,
      "B serving the volume",
    );
    try {
      expect((await pathB.read(1, OFF, 64 * 1024)).equals(block(4))).toBe(true);
      await pathB.write(1, OFF, block(3));
      await pathB.flush(1);
      expect((await pathB.read(1, OFF, 64 * 1024)).equals(block(3))).toBe(true);
      // B acknowledged block 3; A's local copy still holds block 4. No read through A returns it.
      const results = new Set<string>();
      for (let i = 0; i < 10; i++) {
        results.add(await readA());
        await Bun.sleep(100);
      }
      expect([...results]).toEqual([`refused:${PATH_ERRNO}`]);
      // A fresh connection to A is no way around it.
      const again = await connect(A);
      try {
        expect(again.anaState).toBe("inaccessible");
        const r = await again.read(1, OFF, 64 * 1024).then(
          (d) => `data:${d[0]}`,
          (err: Error & { errno?: number }) => `refused:${err.errno}`,
        );
        expect(r).toBe(`refused:${PATH_ERRNO}`);
      } finally {
        again.close();
      }

      // (5) A's agent back after the failover: it reads the fence record, finds the volume served
      // by B and turns A's export standby. Through none of it does a read through A return data.
      await l.startAgent(0);
      const seen = new Set<string>();
      const until = Date.now() + 6_000;
      for (let i = 0; i < 100 && Date.now() < until; i++) {
        seen.add((await readA()).replace(/^refused:.*/, "refused"));
        await Bun.sleep(100);
      }
      expect([...seen]).toEqual(["refused"]);
      expect((await pathB.read(1, OFF, 64 * 1024)).equals(block(3))).toBe(true);
    } finally {
      pathB.close();
    }
  } finally {
    pathA.close();
  }
}, 240_000);
