// Shared raw block for a live migration (ReadWriteMany, Block): two nodes hold one volume at once
// and each reads, through the target, the bytes the other wrote; a third node is kept off while
// two hold it; once one lets go, the target admits only the one left, and the third node gets in
// and reads both nodes' bytes.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import type * as k8s from "@kubernetes/client-node";
import { hostNqnOf, targetAllowedHosts, type VolumeTarget, volumeTarget } from "./storage-target.ts";
import { deletePod, type E2eLab, e2eLab, FinalError, until } from "./support.ts";
import { blockWorkloadPod, eventsAbout, teardownNamespace } from "./user-steps.ts";

let lab: E2eLab;
let ns: string;
/** Three consumer nodes: a migration's source and destination, and a third that waits its turn. */
let src: string;
let dst: string;
let third: string;

const MiB = 1024 * 1024;
/** Each writer's region: the source writes the first MiB, the destination the second. */
const REGION = MiB;
const DEVICE = "/dev/xvda";

beforeAll(async () => {
  lab = await e2eLab();
  const names = lab.consumers.map((c) => c.name);
  if (names.length < 3) throw new Error(`the lab has ${names.length} consumer nodes; this suite needs 3`);
  [src, dst, third] = names as [string, string, string];
  ns = await lab.newNamespace("shared-block");
}, 120_000);

afterAll(async () => {
  if (ns) await teardownNamespace(lab, ns);
  await lab.stop();
}, 300_000);

/** The region a writer fills: `word` and a newline, repeated, cut at one MiB (what `yes word` gives). */
function pattern(word: string): Buffer {
  return Buffer.from(`${word}\n`.repeat(Math.ceil(REGION / (word.length + 1)))).subarray(0, REGION);
}
const sha = (b: Buffer) => createHash("sha256").update(b).digest("hex");

/** Shell: the sha256 of region `index` as read from the device with O_DIRECT (no page cache). */
const readRegion = (index: number) =>
  `dd if=${DEVICE} bs=65536 skip=${(index * REGION) / 65536} count=${REGION / 65536} iflag=direct 2>/dev/null | sha256sum | cut -c1-64`;

/**
 * Shell that waits (1 s polls, at most `polls`) until every region in `want` reads back its sha256,
 * printing "read <index> <sha>" for each, and exits 1 naming what it read last if one never does.
 */
function awaitRegions(want: Record<number, string>, polls: number): string {
  const checks = Object.entries(want)
    .map(
      ([i, s]) =>
        `got=$(${readRegion(Number(i))}); if [ "$got" = "${s}" ]; then echo "read ${i} $got after $n s"; else ok=0; last="region ${i}: $got"; fi`,
    )
    .join("; ");
  return `n=0; while [ $n -lt ${polls} ]; do ok=1; ${checks}; [ $ok = 1 ] && exit 0; n=$((n+1)); sleep 1; done; echo "never read what was expected; last $last"; exit 1`;
}

/**
 * A Pod on `node` that gets the claim as a raw device and runs `script` under busybox sh (the
 * workload image carries it): its stdout is the Pod's log.
 */
function shellPod(name: string, node: string, script: string): k8s.V1Pod {
  const pod = blockWorkloadPod(name, node, "shared", ["hold"]);
  const c = pod.spec?.containers[0] as k8s.V1Container;
  c.command = ["/bin/sh", "-c", `set -u; ${script}`];
  delete c.args;
  return pod;
}

/** A Pod's log once it Succeeded; fails the test with the log if it Failed. */
async function succeeded(name: string, timeoutMs: number): Promise<string> {
  const log = () => lab.core.readNamespacedPodLog({ name, namespace: ns }).catch(() => "");
  return until(
    `Pod ${ns}/${name} to succeed`,
    async () => {
      const p = await lab.core.readNamespacedPod({ name, namespace: ns });
      if (p.status?.phase === "Failed") throw new FinalError(`Pod ${name} failed: ${await log()}`);
      return p.status?.phase === "Succeeded" ? await log() : undefined;
    },
    timeoutMs,
  );
}

/** Resolves once Pod `name` runs (its volume attached and mapped); fails if it ended. */
function running(name: string): Promise<true> {
  return until(
    `Pod ${ns}/${name} to run`,
    async () => {
      const p = await lab.core.readNamespacedPod({ name, namespace: ns });
      const phase = p.status?.phase;
      if (phase === "Failed" || phase === "Succeeded") throw new FinalError(`Pod ${name} ended ${phase}`);
      return phase === "Running" ? true : undefined;
    },
    180_000,
  );
}

const SRC_WORD = "migration-source";
const DST_WORD = "migration-destination";
let volume: VolumeTarget;

test("two nodes hold a ReadWriteMany block volume at once and each reads the other's writes through the target", async () => {
  await lab.core.createNamespacedPersistentVolumeClaim({
    namespace: ns,
    body: {
      metadata: { name: "shared" },
      spec: {
        accessModes: ["ReadWriteMany"],
        storageClassName: "distort-lab",
        volumeMode: "Block",
        resources: { requests: { storage: "1Gi" } },
      },
    },
  });
  // Each writes its own region with O_DIRECT and fsync, then waits for the other's bytes: a read
  // that matches is a read through its own host's path of what the other host wrote, both attached.
  const writer = (word: string, region: number, other: string, otherRegion: number) =>
    `yes ${word} | head -c ${REGION} | dd of=${DEVICE} bs=65536 seek=${(region * REGION) / 65536} iflag=fullblock oflag=direct conv=notrunc,fsync 2>/dev/null; ` +
    `echo "wrote ${region} $(${readRegion(region)})"; ${awaitRegions({ [otherRegion]: sha(pattern(other)) }, 240)}`;
  await lab.core.createNamespacedPod({
    namespace: ns,
    body: shellPod("source", src, writer(SRC_WORD, 0, DST_WORD, 1)),
  });
  await lab.core.createNamespacedPod({
    namespace: ns,
    body: shellPod("destination", dst, writer(DST_WORD, 1, SRC_WORD, 0)),
  });
  const [srcLog, dstLog] = await Promise.all([
    succeeded("source", 300_000),
    succeeded("destination", 300_000),
  ]);
  // Each read back its own write, then the other's region as the other wrote it.
  expect(srcLog).toContain(`wrote 0 ${sha(pattern(SRC_WORD))}`);
  expect(srcLog).toContain(`read 1 ${sha(pattern(DST_WORD))}`);
  expect(dstLog).toContain(`wrote 1 ${sha(pattern(DST_WORD))}`);
  expect(dstLog).toContain(`read 0 ${sha(pattern(SRC_WORD))}`);
  volume = await volumeTarget(lab, ns, "shared");
  await Promise.all([deletePod(lab, ns, "source"), deletePod(lab, ns, "destination")]);
}, 600_000);

test("a third node stays off while two hold the volume; once one lets go only the other is admitted, then the third gets in", async () => {
  expect(volume).toBeDefined();
  const [srcHost, dstHost, thirdHost] = (await Promise.all(
    [src, dst, third].map((n) => hostNqnOf(lab, n)),
  )) as [string, string, string];
  // The two holders of a migration window: both hosts on the target's ACL.
  await lab.core.createNamespacedPod({
    namespace: ns,
    body: blockWorkloadPod("hold-src", src, "shared", ["hold"]),
  });
  await lab.core.createNamespacedPod({
    namespace: ns,
    body: blockWorkloadPod("hold-dst", dst, "shared", ["hold"]),
  });
  await Promise.all([running("hold-src"), running("hold-dst")]);
  await until("both holders' hosts on the target", async () => {
    const hosts = await targetAllowedHosts(volume);
    return hosts.includes(srcHost) && hosts.includes(dstHost) ? true : undefined;
  });

  // A third node: its attach is refused while two hold the volume, and the target never lists it.
  const verify = awaitRegions({ 0: sha(pattern(SRC_WORD)), 1: sha(pattern(DST_WORD)) }, 60);
  await lab.core.createNamespacedPod({ namespace: ns, body: shellPod("third", third, verify) });
  await until(
    "the third node's attach to be refused",
    async () => {
      const events = await eventsAbout(lab, ns, "Pod", "third");
      return events.some((e) => e.reason === "FailedAttachVolume") ? true : undefined;
    },
    180_000,
  );
  const during = await targetAllowedHosts(volume);
  expect(during).not.toContain(thirdHost);
  expect(during.filter((h) => h === srcHost || h === dstHost)).toHaveLength(2);
  const third1 = await lab.core.readNamespacedPod({ name: "third", namespace: ns });
  expect(third1.status?.phase).toBe("Pending");

  // The source lets go: the target admits the destination alone (its own ACL, read from it).
  await deletePod(lab, ns, "hold-src");
  const after = await until("the source's host revoked on the target", async () => {
    const hosts = await targetAllowedHosts(volume);
    return hosts.includes(srcHost) ? undefined : hosts;
  });
  expect(after).toContain(dstHost);
  expect(after).not.toContain(srcHost);

  // The third node gets in beside the destination and reads both writers' bytes.
  const log = await succeeded("third", 420_000);
  expect(log).toContain(`read 0 ${sha(pattern(SRC_WORD))}`);
  expect(log).toContain(`read 1 ${sha(pattern(DST_WORD))}`);
  await Promise.all([deletePod(lab, ns, "third"), deletePod(lab, ns, "hold-dst")]);
  await until(
    "every host off the target",
    async () => ((await targetAllowedHosts(volume)).length === 0 ? true : undefined),
    180_000,
  );
}, 900_000);
