// A replicated volume's rebuild, timed against a plain copy of the same bytes (issue 14): two
// emulated nvmf_tgt processes on the TCP fabric, node B exporting thick lvols as remote copies,
// node A (the serving node) mirroring its local lvol with one of them in a raid1 (superblock), as
// the nexus does. The copy on B is removed, the local one filled with a known pattern, and the
// time from bdev_raid_add_base_bdev until the rebuild process is gone and the member configured
// is measured by polling bdev_raid_get_bdevs; then again onto a fresh copy with
// process_max_bandwidth_mb_sec set. Yardsticks, same run: this process copying the same bytes
// from A's export of the raid to B's export of a third lvol, window by window over the same
// fabric, and dd between two files on one filesystem. The source's and every copy's data region
// is read back and checksummed against the pattern written; a mismatch fails the bench.
// Run: bun bench/rebuild.bench.ts [MiB, default 1024]
import { closeSync, mkdtempSync, openSync, writeFileSync, writeSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { connectController, createTcpFabric, type FabricController } from "../lab/sim/spdk/fabric.ts";
import { createLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { sh } from "./fio.ts";
import { capFor, keptToCap, mibPerSecond, pattern } from "./rebuild-math.ts";
import { type Figure, fmt, writeResult } from "./report.ts";

const MIB = 2 ** 20;
const SIZE_MIB = Number(process.argv[2] ?? 1024);
const SIZE = SIZE_MIB * MIB;
/** The raid's (and the plain copy's) window: SPDK's default process_window_size_kb, 1 MiB. */
const WINDOW_KB = 1024;
const WINDOW = WINDOW_KB * 1024;
/** A superblock raid keeps the first 1 MiB of each member; the lvols are that much larger. */
const SB_BYTES = MIB;
const POLL_MS = 20;
const ROOT = join(import.meta.dir, "..");
const BUN = process.execPath;
const PORT = String(30000 + (process.pid % 20000));
const A_ADDR = { trtype: "TCP", adrfam: "IPv4", traddr: "127.0.0.210", trsvcid: PORT };
const B_ADDR = { trtype: "TCP", adrfam: "IPv4", traddr: "127.0.0.211", trsvcid: PORT };
const HOST_A = "nqn.2016-06.io.spdk:bench-rebuild-node-a";
const HOST_BENCH = "nqn.2016-06.io.spdk:bench-rebuild-host";
const NQN_RAID = "nqn.2016-06.io.spdk:bench-rebuild-raid";
const nqnCopy = (c: string) => `nqn.2016-06.io.spdk:bench-rebuild-${c}`;
const say = (s: string) => process.stdout.write(`${s}\n`);

/** A deadline for one phase: throws once `ms` have passed since its creation. */
function deadline(what: string, ms: number): () => void {
  const end = performance.now() + ms;
  return () => {
    if (performance.now() > end) throw new Error(`${what} not done within ${Math.round(ms / 1000)} s`);
  };
}

interface Node {
  name: string;
  proc: Subprocess;
  rpc: SpdkClient;
  log: string;
}

async function startNode(dir: string, name: string, pci: string, driveBytes: number): Promise<Node> {
  const drives = join(dir, `${name}-drives.json`);
  writeFileSync(
    drives,
    JSON.stringify([
      { pciAddress: pci, serial: `BENCHRB${name}`, model: "DISTORT bench", sizeBytes: driveBytes },
    ]),
  );
  const sock = join(dir, `${name}.sock`);
  const log = join(dir, `${name}.log`);
  const proc = Bun.spawn(
    [
      BUN,
      join(ROOT, "lab/sim/spdk/nvmf-tgt.ts"),
      "-r",
      sock,
      "--sim-data-dir",
      join(dir, name),
      "--sim-drives",
      drives,
      "--sim-fabric",
      "tcp",
      "--sim-host-nqn",
      name === "a" ? HOST_A : `nqn.2016-06.io.spdk:bench-rebuild-node-${name}`,
      "--sim-rpc-poll-ms",
      "0",
    ],
    { stdout: "ignore", stderr: Bun.file(log) },
  );
  const rpc = new SpdkClient({ socketPath: sock, logger: createLogger({ level: "error" }) });
  const node = { name, proc, rpc, log };
  const check = deadline(`node ${name} start`, 30_000);
  for (;;) {
    if (
      await rpc.call("spdk_get_version").then(
        () => true,
        () => false,
      )
    )
      return node;
    if (proc.exitCode !== null) throw new Error(`node ${name} exited: ${await Bun.file(log).text()}`);
    check();
    await Bun.sleep(50);
  }
}

interface RaidInfo {
  name: string;
  state: string;
  num_base_bdevs_discovered: number;
  process?: { type: string; target: string; progress: { blocks: number; percent: number } };
  base_bdevs_list: { name: string | null; is_configured: boolean; data_offset: number; data_size: number }[];
}

async function raidInfo(rpc: SpdkClient, name: string): Promise<RaidInfo> {
  const all = (await rpc.call("bdev_raid_get_bdevs", { category: "all" })) as RaidInfo[];
  const r = all.find((x) => x.name === name);
  if (!r) throw new Error(`raid ${name} is gone`);
  return r;
}

/**
 * bdev_raid_add_base_bdev of `member`, then bdev_raid_get_bdevs every POLL_MS until no process
 * runs and `member` is a configured member: the milliseconds from the add to that poll. Throws
 * when the member drops out instead (a failed rebuild) or after `limitMs`.
 */
async function timedRebuild(
  rpc: SpdkClient,
  raid: string,
  member: string,
  limitMs: number,
): Promise<{ ms: number; polls: number; sawProcess: boolean }> {
  const check = deadline(`rebuild onto ${member}`, limitMs);
  const t0 = performance.now();
  await rpc.call("bdev_raid_add_base_bdev", { raid_bdev: raid, base_bdev: member });
  let polls = 0;
  let sawProcess = false;
  for (;;) {
    const r = await raidInfo(rpc, raid);
    polls++;
    const slot = r.base_bdevs_list.find((s) => s.name === member);
    if (r.process) {
      sawProcess = true;
      if (r.process.target !== member)
        throw new Error(`the raid rebuilds ${r.process.target}, not ${member}`);
    } else {
      if (slot?.is_configured && r.num_base_bdevs_discovered === r.base_bdevs_list.length) {
        return { ms: performance.now() - t0, polls, sawProcess };
      }
      throw new Error(`no process on ${raid} and ${member} is not a configured member: the rebuild failed`);
    }
    check();
    await Bun.sleep(POLL_MS);
  }
}

/** Connects this process as a host to namespace 1 of `nqn` at `addr`. */
async function host(addr: typeof A_ADDR, nqn: string): Promise<FabricController> {
  return connectController(createTcpFabric(), {
    ...addr,
    subnqn: nqn,
    hostnqn: HOST_BENCH,
    hostid: crypto.randomUUID(),
  });
}

/** SHA-256 of `length` bytes of namespace 1 of `c` from byte `offset`, read in windows. */
async function checksum(
  c: FabricController,
  offset: number,
  length: number,
  limitMs: number,
): Promise<string> {
  const check = deadline("checksum read", limitMs);
  const h = new Bun.CryptoHasher("sha256");
  for (let at = 0; at < length; at += WINDOW) {
    h.update(await c.read(1, offset + at, Math.min(WINDOW, length - at)));
    check();
  }
  return h.digest("hex");
}

async function main(): Promise<void> {
  if (!(Number.isInteger(SIZE_MIB) && SIZE_MIB >= 4))
    throw new Error(`size ${process.argv[2]} MiB: give 4 or more`);
  const dir = mkdtempSync(join(tmpdir(), "distort-rebuild-"));
  const nodes: Node[] = [];
  const hosts: FabricController[] = [];
  const memberBytes = SIZE + SB_BYTES;
  const memberMib = memberBytes / MIB;
  // Generous bounds for a loaded 2-core machine: 1 MiB/s at the least for an unpaced copy.
  const copyLimitMs = Math.max(120_000, (SIZE / MIB) * 1000);
  const profile: string[] = [];
  const t00 = performance.now();
  const mark = (what: string) => {
    const line = `${fmt((performance.now() - t00) / 1000)} s: ${what}`;
    profile.push(line);
    say(line);
  };
  try {
    const a = await startNode(dir, "a", "0000:a1:00.0", memberBytes + 64 * MIB);
    nodes.push(a);
    const b = await startNode(dir, "b", "0000:b1:00.0", 3 * memberBytes + 64 * MIB);
    nodes.push(b);

    // Node B: three thick copies (c1 and c2 rebuild targets, c3 the plain copy's target), each
    // exported to node A and to this process.
    await b.rpc.call("bdev_nvme_attach_controller", {
      name: "NvmeB",
      trtype: "PCIe",
      traddr: "0000:b1:00.0",
    });
    await b.rpc.call("bdev_lvol_create_lvstore", { bdev_name: "NvmeBn1", lvs_name: "lvsB", cluster_sz: MIB });
    await b.rpc.call("nvmf_create_transport", { trtype: "TCP" });
    for (const c of ["c1", "c2", "c3"]) {
      await b.rpc.call("bdev_lvol_create", {
        lvs_name: "lvsB",
        lvol_name: c,
        size_in_mib: memberMib,
        thin_provision: false,
      });
      await b.rpc.call("nvmf_create_subsystem", { nqn: nqnCopy(c), allow_any_host: false });
      await b.rpc.call("nvmf_subsystem_add_ns", { nqn: nqnCopy(c), namespace: { bdev_name: `lvsB/${c}` } });
      await b.rpc.call("nvmf_subsystem_add_listener", { nqn: nqnCopy(c), listen_address: B_ADDR });
      for (const h of [HOST_A, HOST_BENCH])
        await b.rpc.call("nvmf_subsystem_add_host", { nqn: nqnCopy(c), host: h });
    }

    // Node A: the local copy, the remote ones attached as the nexus attaches them.
    await a.rpc.call("bdev_nvme_attach_controller", {
      name: "NvmeA",
      trtype: "PCIe",
      traddr: "0000:a1:00.0",
    });
    await a.rpc.call("bdev_lvol_create_lvstore", { bdev_name: "NvmeAn1", lvs_name: "lvsA", cluster_sz: MIB });
    await a.rpc.call("bdev_lvol_create", {
      lvs_name: "lvsA",
      lvol_name: "local",
      size_in_mib: memberMib,
      thin_provision: false,
    });
    for (const c of ["c1", "c2"]) {
      await a.rpc.call("bdev_nvme_attach_controller", {
        name: c,
        trtype: "tcp",
        adrfam: "ipv4",
        traddr: B_ADDR.traddr,
        trsvcid: B_ADDR.trsvcid,
        subnqn: nqnCopy(c),
        hostnqn: HOST_A,
        ctrlr_loss_timeout_sec: -1,
        reconnect_delay_sec: 1,
      });
    }
    await a.rpc.call("bdev_raid_set_options", {
      process_window_size_kb: WINDOW_KB,
      process_max_bandwidth_mb_sec: 0,
    });
    await a.rpc.call("bdev_raid_create", {
      name: "r1",
      raid_level: "raid1",
      base_bdevs: ["lvsA/local", "c1n1"],
      superblock: true,
    });
    // The remote copy goes away (as when its node fails); the raid serves from the local one.
    await a.rpc.call("bdev_raid_remove_base_bdev", { name: "c1n1" });
    const degraded = await raidInfo(a.rpc, "r1");
    const [bd] = (await a.rpc.call("bdev_get_bdevs", { name: "r1" })) as {
      block_size: number;
      num_blocks: number;
    }[];
    const bs = bd?.block_size ?? 0;
    const local = degraded.base_bdevs_list.find((s) => s.name === "lvsA/local");
    if (!local || degraded.num_base_bdevs_discovered !== 1 || !bd)
      throw new Error(`unexpected raid after the removal: ${JSON.stringify(degraded)}`);
    const dataOffset = local.data_offset * bs;
    const dataBytes = local.data_size * bs;
    if (dataBytes !== SIZE || bd.num_blocks * bs !== SIZE)
      throw new Error(`raid data region ${dataBytes} B, bdev ${bd.num_blocks * bs} B, wanted ${SIZE}`);
    say(`raid r1: block size ${bs}, data_offset ${local.data_offset} blocks, data ${SIZE_MIB} MiB`);

    await a.rpc.call("nvmf_create_transport", { trtype: "TCP" });
    await a.rpc.call("nvmf_create_subsystem", { nqn: NQN_RAID, allow_any_host: false });
    await a.rpc.call("nvmf_subsystem_add_ns", { nqn: NQN_RAID, namespace: { bdev_name: "r1" } });
    await a.rpc.call("nvmf_subsystem_add_listener", { nqn: NQN_RAID, listen_address: A_ADDR });
    await a.rpc.call("nvmf_subsystem_add_host", { nqn: NQN_RAID, host: HOST_BENCH });
    const raidHost = await host(A_ADDR, NQN_RAID);
    hosts.push(raidHost);

    // The fill: the pattern through the degraded raid's export, 4 windows in flight.
    mark("fill start");
    const expected = new Bun.CryptoHasher("sha256");
    const fillCheck = deadline("fill", copyLimitMs);
    const tf = performance.now();
    for (let at = 0; at < SIZE; at += 4 * WINDOW) {
      const parts: Buffer[] = [];
      for (let w = at; w < Math.min(SIZE, at + 4 * WINDOW); w += WINDOW)
        parts.push(pattern(w, Math.min(WINDOW, SIZE - w)));
      for (const p of parts) expected.update(p);
      await Promise.all(parts.map((p, i) => raidHost.write(1, at + i * WINDOW, p)));
      fillCheck();
    }
    const fillMs = performance.now() - tf;
    const want = expected.digest("hex");
    mark(`fill done: ${fmt(mibPerSecond(SIZE, fillMs))} MiB/s (pattern generation included)`);

    // Yardstick: a plain copy of the data region, read from A's export of the (degraded) raid
    // and written to c3 on B at the member's data offset, one window at a time as the rebuild.
    const c3 = await host(B_ADDR, nqnCopy("c3"));
    hosts.push(c3);
    const plainCheck = deadline("plain copy", copyLimitMs);
    const tp = performance.now();
    for (let at = 0; at < SIZE; at += WINDOW) {
      const data = await raidHost.read(1, at, Math.min(WINDOW, SIZE - at));
      await c3.write(1, dataOffset + at, data);
      plainCheck();
    }
    const plainMs = performance.now() - tp;
    mark(`plain copy done: ${fmt(plainMs / 1000)} s`);

    // The rebuild, unpaced: c1 back into the raid (its stale superblock names its old slot).
    const r1 = await timedRebuild(a.rpc, "r1", "c1n1", copyLimitMs);
    mark(`rebuild onto c1n1 done: ${fmt(r1.ms / 1000)} s, ${r1.polls} polls`);
    const rebuildRate = mibPerSecond(SIZE, r1.ms);

    // The rebuild with the cap, onto the fresh c2.
    await a.rpc.call("bdev_raid_remove_base_bdev", { name: "c1n1" });
    const cap = capFor(rebuildRate);
    await a.rpc.call("bdev_raid_set_options", { process_max_bandwidth_mb_sec: cap });
    const r2 = await timedRebuild(a.rpc, "r1", "c2n1", Math.max(120_000, (SIZE / MIB / cap) * 3000));
    mark(`capped rebuild onto c2n1 done: ${fmt(r2.ms / 1000)} s, ${r2.polls} polls`);
    const cappedRate = mibPerSecond(SIZE, r2.ms);

    // Correctness: the source (the raid with only the local copy left) and every copy's data region.
    await a.rpc.call("bdev_raid_remove_base_bdev", { name: "c2n1" });
    const sums: Record<string, string> = {};
    sums.source = await checksum(raidHost, 0, SIZE, copyLimitMs);
    for (const c of ["c1", "c2"]) {
      const h = await host(B_ADDR, nqnCopy(c));
      hosts.push(h);
      sums[c] = await checksum(h, dataOffset, SIZE, copyLimitMs);
    }
    sums.c3 = await checksum(c3, dataOffset, SIZE, copyLimitMs);
    mark("checksums read");
    const wrong = Object.entries(sums)
      .filter(([, s]) => s !== want)
      .map(([k]) => k);

    // For scale: dd between two files on one filesystem (the page cache, as the emulators' drives).
    const src = join(dir, "dd-src");
    const fd = openSync(src, "w");
    for (let at = 0; at < SIZE; at += 16 * WINDOW)
      writeSync(fd, pattern(at, Math.min(16 * WINDOW, SIZE - at)));
    closeSync(fd);
    const td = performance.now();
    await sh(["dd", `if=${src}`, `of=${join(dir, "dd-dst")}`, "bs=1M", "status=none"], copyLimitMs);
    const ddMs = performance.now() - td;
    mark(`dd done: ${fmt(ddMs / 1000)} s`);

    const plainRate = mibPerSecond(SIZE, plainMs);
    const ddRate = mibPerSecond(SIZE, ddMs);
    const label = SIZE_MIB >= 1024 ? `${SIZE_MIB / 1024} GiB` : `${SIZE_MIB} MiB`;
    const bad =
      wrong.length > 0 ? `data differs from the pattern written on: ${wrong.join(", ")}` : undefined;
    const measured: Figure[] = [
      {
        id: "rebuild-seconds",
        label: `raid1 rebuild of ${label} onto a remote copy (TCP fabric), add_base_bdev to configured`,
        value: r1.ms / 1000,
        unit: "s",
        better: "lower",
        yardstick: { label: "plain copy, same bytes, same fabric", value: plainMs / 1000, unit: "s" },
        ratio: r1.ms / plainMs,
        ratioLabel: "rebuild / plain copy",
      },
      {
        id: "rebuild-rate",
        label: `raid1 rebuild of ${label}, unpaced`,
        value: rebuildRate,
        unit: "MiB/s",
        better: "higher",
        yardstick: { label: "plain copy, same bytes, same fabric", value: plainRate, unit: "MiB/s" },
        ratio: rebuildRate / plainRate,
        ratioLabel: "rebuild / plain copy",
      },
      {
        id: "rebuild-vs-dd",
        label: `raid1 rebuild of ${label}, unpaced, against dd between two files`,
        value: rebuildRate,
        unit: "MiB/s",
        better: "higher",
        yardstick: { label: `dd bs=1M of ${label}, same filesystem`, value: ddRate, unit: "MiB/s" },
        ratio: rebuildRate / ddRate,
        ratioLabel: "rebuild / dd",
      },
      {
        id: "rebuild-capped-rate",
        label: `raid1 rebuild of ${label} with process_max_bandwidth_mb_sec ${cap}`,
        value: cappedRate,
        unit: "MiB/s",
        better: "lower",
        yardstick: { label: "the cap", value: cap, unit: "MiB/s" },
        ratio: cappedRate / cap,
        ratioLabel: "measured / cap",
        target: { text: `<= ${fmt(cap * 1.1)} MiB/s (cap + 10 %)`, met: keptToCap(cappedRate, cap) },
      },
    ];
    const figures = measured.map((f): Figure => (bad ? { ...f, value: Number.NaN, failed: bad } : f));
    writeResult({
      bench: "rebuild",
      figures,
      notes: [
        `Two emulated nvmf_tgt processes on the TCP fabric (loopback ${A_ADDR.traddr} and ${B_ADDR.traddr}); node A's raid1 r1 (superblock, data_offset ${local.data_offset} blocks of ${bs} B) of a local thick lvol and thick lvols on node B attached with bdev_nvme_attach_controller; members of ${memberMib} MiB, data region ${SIZE_MIB} MiB; process_window_size_kb ${WINDOW_KB}; bdev_raid_get_bdevs polled every ${POLL_MS} ms (unpaced: ${r1.polls} polls, process seen ${r1.sawProcess}; capped: ${r2.polls} polls, process seen ${r2.sawProcess}).`,
        `Unpaced rebuild ${fmt(r1.ms / 1000)} s (${fmt(rebuildRate)} MiB/s): c1 removed, the source filled, c1 re-added (a full copy). Capped rebuild onto a fresh c2 at process_max_bandwidth_mb_sec ${cap} (100, or half the unpaced rate when that is below 200): ${fmt(r2.ms / 1000)} s (${fmt(cappedRate)} MiB/s).`,
        `Plain copy (yardstick): this bench process reading the data region from node A's NVMe-oF export of the raid (served by the local lvol alone, the raid degraded) and writing it to node B's export of a third lvol at the member data offset, 1 MiB windows, one at a time as the rebuild copies: ${fmt(plainMs / 1000)} s (${fmt(plainRate)} MiB/s). The emulator has no RPC that copies between bdevs, so this is the closest copy through the same layers: the same lvols, raid read path, target and TCP fabric, with the data crossing the fabric twice (A to the bench, the bench to B) where the rebuild sends it once (A to B).`,
        `dd bs=1M between two files in ${tmpdir()} (page cache, no fsync, as the emulators' drive files are not synced): ${fmt(ddMs / 1000)} s (${fmt(ddRate)} MiB/s). Fill through the raid's export, 4 windows in flight: ${fmt(mibPerSecond(SIZE, fillMs))} MiB/s.`,
        `Correctness: SHA-256 of the data region read back over the fabric (the source through the raid, c1, c2 and the plain copy's c3 from data_offset on B's exports) against the pattern written: ${bad ?? "all equal"}.`,
        `Machine load average ${loadavg()
          .map((l) => l.toFixed(1))
          .join(" / ")} at the end.`,
      ],
      profile,
    });
    if (bad) {
      process.stderr.write(`rebuild bench: ${bad}\n`);
      process.exitCode = 1;
    }
  } finally {
    for (const h of hosts) h.close();
    for (const n of nodes) await n.rpc.close().catch(() => {});
    for (const n of nodes) n.proc.kill("SIGTERM");
    await Promise.race([Promise.all(nodes.map((n) => n.proc.exited)), Bun.sleep(10_000)]);
    for (const n of nodes) if (n.proc.exitCode === null && n.proc.signalCode === null) n.proc.kill("SIGKILL");
    await sh(["rm", "-rf", "--one-file-system", dir]).catch(() => {});
  }
}

if (import.meta.main) await main();
