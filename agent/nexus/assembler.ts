// The SPDK side of serving a replicated volume: attaches each current copy's export over NVMe-oF
// (bdev_nvme_attach_controller, as this node's nexus host), builds or keeps the raid1 bdev over
// them, and on deletion takes both apart. Every step looks before it acts, so it can be repeated
// after a crash at any point; a raid that examine re-assembled from its superblocks is kept.
//
// Every copy is reached through the fabric, the one on this node's own drive included: revoking
// the nexus host on a copy's subsystem then cuts this node off that copy wherever it lives, which
// is the one fencing mechanism failover relies on.
import { StorageError } from "../../lib/errors.ts";
import type { Logger } from "../../lib/log.ts";
import type { SpdkMethods } from "../../lib/spdk/methods.ts";
import type { RaidBdev } from "../../lib/spdk/schemas.ts";
import type { CopyEndpoint, NexusPlan, NexusTeardown } from "./decide.ts";
import { controllerOfMemberBdev, nexusMemberBdevFor, replicaNamespaceUuidFor } from "./identity.ts";

const ZERO_UUID = "00000000-0000-0000-0000-000000000000";

/** The SPDK calls the nexus makes (SpdkMethods, through the agent's read cache). */
export type NexusSpdk = Pick<
  SpdkMethods,
  | "bdevNvmeGetControllers"
  | "bdevNvmeAttachController"
  | "bdevNvmeDetachController"
  | "bdevGetBdevs"
  | "bdevRaidGetBdevs"
  | "bdevRaidCreate"
  | "bdevRaidDelete"
  | "bdevRaidRemoveBaseBdev"
  | "bdevNullCreate"
  | "bdevNullDelete"
  | "bdevRaidAddBaseBdev"
  | "bdevRaidSetOptions"
>;

/** details.unreachable of ensureRaid's "unavailable": copy name -> why it could not be attached. */
export const UNREACHABLE_COPIES = "unreachable";

/** The null bdev that holds a raid1's second slot for a moment while it starts degraded. */
export function standInBdevFor(raidBdev: string): string {
  return `${raidBdev}-standin`;
}

/** The slots a raid made for `plan` gets: its copies, at least its members and two. */
function slotsOf(plan: NexusPlan): number {
  return Math.max(2, plan.members.length, plan.slots ?? 0);
}

/**
 * How a copy's controller behaves when its connection is lost. bdev_nvme holds the I/O of a
 * controller that is reconnecting (it fails it only after fast_io_fail_timeout_sec, when set), and
 * a raid1 write completes only once every member answered. So with no fast_io_fail and no
 * controller loss timeout, a write to a raid with a lost copy is held, not acknowledged, until
 * this node decides: either the copy comes back (reconnecting every second, so a target restart
 * costs a pause) or the agent first records in the API that the copy stopped receiving writes
 * (it leaves the current set at a raised data generation) and only then detaches its controller,
 * which fails the held I/O on that member and lets the raid complete it on the others. A write is
 * therefore never acknowledged by fewer copies than the API holds current: the copy a failover
 * or a restart may pick is never one that missed it.
 */
export const NEXUS_ATTACH_TIMEOUTS = {
  reconnect_delay_sec: 1,
  ctrlr_loss_timeout_sec: -1,
} as const;

/** Controller state SPDK prints for a path that carries I/O (bdev_nvme_get_controllers). */
export const CONTROLLER_ENABLED = "enabled";

function isKind(err: unknown, ...kinds: string[]): boolean {
  return err instanceof StorageError && kinds.includes(err.kind);
}

/** What ensureRaid found or made. */
export interface RaidResult {
  raid: RaidBdev;
  /** Bytes the raid bdev holds (what the volume's export serves). */
  sizeBytes: number;
  /** What this pass had to do: "controller:<copy>", "raid", "removed-member:<bdev>"... */
  repaired: string[];
}

export class NexusAssembler {
  constructor(
    private readonly spdk: NexusSpdk,
    private readonly logger: Logger,
  ) {}

  /**
   * Makes the raid of `plan` exist over its members: attaches every member not attached yet (or
   * attached at another address), creates the raid when there is none, keeps one that exists
   * (re-assembled by examine after a restart, or made by an earlier pass), and takes out of it any
   * member that is not in the plan (a copy no longer current). Rejects "unavailable" while the
   * raid is still assembling, "precondition" when a controller reaches another subsystem than
   * expected (it is detached again). Members named in `rebuilding` (bdev names: copies being rebuilt
   * onto) are left in the raid although the plan does not list them.
   */
  async ensureRaid(plan: NexusPlan, rebuilding: ReadonlySet<string> = new Set()): Promise<RaidResult> {
    const repaired: string[] = [];
    const members: string[] = [];
    const ctrls = await this.spdk.bdevNvmeGetControllers();
    // Every copy is tried; the ones that cannot be reached are named together, so the caller can
    // time each (and, past its bound, record it out of the current set first).
    const unreachable: Record<string, string> = {};
    for (const m of plan.members) {
      const existing = ctrls.find((c) => c.name === m.controller);
      try {
        members.push(await this.ensureController(m, plan.hostNqn, existing, repaired));
      } catch (err) {
        if (!isKind(err, "unavailable")) throw err;
        unreachable[m.name] = (err as Error).message;
      }
    }
    if (Object.keys(unreachable).length > 0) {
      throw new StorageError(
        "unavailable",
        `copies not reachable from this node yet: ${Object.entries(unreachable)
          .map(([n, why]) => `${n} (${why})`)
          .join("; ")}`,
        { details: { [UNREACHABLE_COPIES]: unreachable } },
      );
    }
    let raid = await this.findRaid(plan.raidBdev);
    if (!raid && members.length < slotsOf(plan)) {
      // Fewer current copies than the volume has (raid1 also takes two members at creation):
      // made with a stand-in in each missing copy's slot, which a rebuild fills later.
      raid = await this.startDegraded(plan, members, undefined, repaired);
    }
    if (!raid) {
      try {
        await this.spdk.bdevRaidCreate({
          name: plan.raidBdev,
          raid_level: "raid1",
          base_bdevs: members,
          superblock: true,
          uuid: plan.raidUuid,
        });
        repaired.push("raid");
      } catch (err) {
        // Made meanwhile (examine assembling it from a member's superblock): read it below.
        if (!isKind(err, "already-exists")) throw err;
      }
      raid = await this.findRaid(plan.raidBdev);
      if (!raid) throw new StorageError("unavailable", `raid ${plan.raidBdev} vanished right after creation`);
    }
    if (raid.uuid.toLowerCase() !== plan.raidUuid.toLowerCase()) {
      throw new StorageError(
        "precondition",
        `bdev ${plan.raidBdev} has uuid ${raid.uuid}, not ${plan.raidUuid}: it is not this volume's raid, and it is left alone`,
      );
    }
    if (raid.state !== "online") {
      // Examine re-assembles a raid from its members' superblocks; a slot it still waits for
      // that is none of the planned copies (their namespace UUIDs are derived) never arrives,
      // since only current copies are attached.
      const planned = new Set(plan.members.map((m) => replicaNamespaceUuidFor(m.uid)));
      const awaited = raid.base_bdevs_list.filter((b) => !b.is_configured && b.uuid !== ZERO_UUID);
      const foreign = awaited.filter((b) => !planned.has(b.uuid.toLowerCase()));
      const present = raid.base_bdevs_list
        .filter((b) => b.is_configured && b.name !== null)
        .map((b) => b.name);
      if (
        foreign.length > 0 &&
        foreign.length === awaited.length &&
        members.every((m) => present.includes(m))
      ) {
        // It waits only for members that are not current copies (a serving node that died with
        // every slot configured left that in the superblocks): started again over the current
        // copies alone, the others being out of the current set in the API already.
        this.logger.warn("raid waits for copies that are not current: it starts degraded", {
          raid: plan.raidBdev,
          waiting: foreign.map((b) => b.uuid),
        });
        raid = await this.startDegraded(plan, members, raid, repaired);
      } else if (foreign.length > 0) {
        throw new StorageError(
          "precondition",
          `raid ${plan.raidBdev} is assembling from its superblocks and waits for member(s) ${foreign.map((b) => b.uuid).join(", ")}, which are not current copies, while current copies are missing from it: it is not served`,
        );
      } else {
        throw new StorageError(
          "unavailable",
          `raid ${plan.raidBdev} is ${raid.state} (${raid.num_base_bdevs_discovered}/${raid.num_base_bdevs} members present)`,
        );
      }
    }
    // A member that is not in the plan is a copy that is not current any more: no read may reach
    // it. Taken out only while a planned member remains (removing the last deletes the raid).
    const configured = raid.base_bdevs_list.filter((b) => b.is_configured && b.name !== null);
    const keep = configured.filter((b) => members.includes(b.name as string));
    if (keep.length === 0) {
      throw new StorageError(
        "precondition",
        `raid ${plan.raidBdev} holds none of the current copies (${members.join(", ")}): it is not served`,
      );
    }
    for (const b of configured) {
      if (members.includes(b.name as string) || rebuilding.has(b.name as string)) continue;
      await this.spdk.bdevRaidRemoveBaseBdev(b.name as string).catch((err) => {
        if (!isKind(err, "not-found")) throw err;
      });
      repaired.push(`removed-member:${b.name}`);
      if (b.name?.startsWith(standInBdevFor(plan.raidBdev))) {
        await this.spdk.bdevNullDelete(b.name).catch((err) => {
          if (!isKind(err, "not-found")) throw err;
        });
      }
      this.logger.warn("a raid member that is not a current copy was taken out", {
        raid: plan.raidBdev,
        member: b.name,
      });
    }
    if (repaired.some((r) => r.startsWith("removed-member:"))) {
      raid = (await this.findRaid(plan.raidBdev)) ?? raid;
    }
    const [bdev] = await this.spdk.bdevGetBdevs({ name: plan.raidBdev });
    if (!bdev) throw new StorageError("unavailable", `raid bdev ${plan.raidBdev} is not registered`);
    return { raid, sizeBytes: bdev.num_blocks * bdev.block_size, repaired };
  }

  /**
   * Attaches copy `m` as controller m.controller unless it already is, at the same address, as
   * this host; resolves with its namespace bdev after checking that the controller reached the
   * copy's own subsystem (serial number).
   */
  private async ensureController(
    m: CopyEndpoint,
    hostNqn: string,
    existing: Awaited<ReturnType<NexusSpdk["bdevNvmeGetControllers"]>>[number] | undefined,
    repaired: string[],
  ): Promise<string> {
    const bdevName = nexusMemberBdevFor(m.controller);
    const samePath = existing?.ctrlrs.some(
      (c) =>
        c.trid.trtype.toUpperCase() === m.trtype &&
        c.trid.traddr === m.traddr &&
        c.trid.trsvcid === m.trsvcid &&
        c.trid.subnqn === m.subnqn &&
        (c.host?.nqn === undefined || c.host.nqn === hostNqn),
    );
    if (existing && !samePath) {
      // The copy is exported elsewhere now (its node's portal changed): reach it where it is.
      await this.detach(m.controller);
      repaired.push(`moved:${m.name}`);
    }
    if (!existing || !samePath) {
      try {
        await this.spdk.bdevNvmeAttachController({
          name: m.controller,
          trtype: m.trtype,
          adrfam: m.adrfam,
          traddr: m.traddr,
          trsvcid: m.trsvcid,
          subnqn: m.subnqn,
          hostnqn: hostNqn,
          ...NEXUS_ATTACH_TIMEOUTS,
        });
        repaired.push(`controller:${m.name}`);
      } catch (err) {
        if (isKind(err, "already-exists")) {
          // Attached by an overlapping pass: checked below like any other.
        } else if (isKind(err, "precondition")) {
          throw new StorageError(
            "unavailable",
            `copy ${m.name} refused this node's host ${hostNqn} at ${m.traddr}:${m.trsvcid} (its attachment for this node is not admitted yet)`,
            { cause: err },
          );
        } else {
          throw err;
        }
      }
    }
    const bdev = await this.spdk
      .bdevGetBdevs({ name: bdevName })
      .then((l) => l[0])
      .catch((err) => {
        if (isKind(err, "not-found")) return undefined;
        throw err;
      });
    if (!bdev) {
      throw new StorageError(
        "unavailable",
        `copy ${m.name} is attached as ${m.controller} but has no namespace bdev ${bdevName} (its namespace UUID may be held by another bdev here)`,
      );
    }
    const serial = bdev.driver_specific?.nvme?.[0]?.ctrlr_data?.serial_number?.trim();
    if (serial !== undefined && serial !== m.serialNumber) {
      await this.detach(m.controller);
      throw new StorageError(
        "precondition",
        `controller ${m.controller} for copy ${m.name} reached serial ${serial}, expected ${m.serialNumber}: detached again`,
      );
    }
    return bdevName;
  }

  /**
   * Makes raid `plan.raidBdev` online over `members` alone (one or more current copies, fewer
   * than raid1 takes, or fewer than the superblocks wait for): a raid still assembling is deleted
   * (its members are released, their superblocks stay), a raid1 is created over the members and
   * a null bdev of the same size, and the null bdev is taken out again at once, which leaves the
   * raid online and degraded with fresh superblocks naming the members only. Nothing reads the
   * raid meanwhile: it is exported only after this returns. Repeatable after a crash at any step
   * (a stand-in left in a raid is a member outside the plan, and is taken out like one).
   */
  private async startDegraded(
    plan: NexusPlan,
    members: string[],
    assembling: RaidBdev | undefined,
    repaired: string[],
  ): Promise<RaidBdev> {
    const [first] = await this.spdk.bdevGetBdevs({ name: members[0] as string });
    if (!first) throw new StorageError("unavailable", `copy bdev ${members[0]} vanished`);
    if (assembling) {
      await this.spdk.bdevRaidDelete(plan.raidBdev).catch((err) => {
        if (!isKind(err, "not-found")) throw err;
      });
    }
    const standIns = [...Array(Math.max(1, slotsOf(plan) - members.length)).keys()].map((i) =>
      i === 0 ? standInBdevFor(plan.raidBdev) : `${standInBdevFor(plan.raidBdev)}-${i}`,
    );
    for (const standIn of standIns)
      await this.spdk
        .bdevNullCreate({ name: standIn, num_blocks: first.num_blocks, block_size: first.block_size })
        .catch((err) => {
          if (!isKind(err, "already-exists")) throw err;
        });
    try {
      await this.spdk.bdevRaidCreate({
        name: plan.raidBdev,
        raid_level: "raid1",
        base_bdevs: [...members, ...standIns],
        superblock: true,
        uuid: plan.raidUuid,
      });
      for (const standIn of standIns) await this.spdk.bdevRaidRemoveBaseBdev(standIn);
    } finally {
      for (const standIn of standIns)
        await this.spdk.bdevNullDelete(standIn).catch((err) => {
          if (!isKind(err, "not-found")) throw err;
        });
    }
    repaired.push("raid-degraded");
    const raid = await this.findRaid(plan.raidBdev);
    if (raid?.state !== "online")
      throw new StorageError("unavailable", `raid ${plan.raidBdev} did not come online degraded`);
    return raid;
  }

  /**
   * The plan's members whose controller carries no I/O now (any state but enabled): by copy
   * name, with the state SPDK prints (`down`), and every member whose controller was looked at
   * (`checked`; one not attached is not).
   */
  async unreachableMembers(plan: NexusPlan): Promise<{ down: Map<string, string>; checked: Set<string> }> {
    const ctrls = await this.spdk.bdevNvmeGetControllers();
    const down = new Map<string, string>();
    const checked = new Set<string>();
    for (const m of plan.members) {
      const c = ctrls.find((x) => x.name === m.controller);
      if (!c) continue; // not attached yet: ensureRaid attaches it (and times it if it cannot)
      checked.add(m.name);
      const up = c.ctrlrs.some((x) => (x.state ?? CONTROLLER_ENABLED) === CONTROLLER_ENABLED);
      if (!up) down.set(m.name, c.ctrlrs.map((x) => x.state ?? "?").join(",") || "no path");
    }
    return { down, checked };
  }

  /**
   * Attaches copy `m` (a copy to rebuild onto) as this node's nexus host unless it already is;
   * resolves with its namespace bdev. Rejections as ensureRaid's.
   */
  async attachCopy(m: CopyEndpoint, hostNqn: string): Promise<string> {
    const ctrls = await this.spdk.bdevNvmeGetControllers();
    return this.ensureController(
      m,
      hostNqn,
      ctrls.find((c) => c.name === m.controller),
      [],
    );
  }

  /** bdev_raid_add_base_bdev: `bdev` joins raid `raid` and a rebuild onto it starts. */
  async addMember(raid: string, bdev: string): Promise<void> {
    await this.spdk.bdevRaidAddBaseBdev(raid, bdev);
  }

  /** The raid named `name`, if any. */
  async raid(name: string): Promise<RaidBdev | undefined> {
    return this.findRaid(name);
  }

  /** Names of this node's controllers that carry I/O now. */
  async controllersUp(): Promise<Set<string>> {
    const ctrls = await this.spdk.bdevNvmeGetControllers();
    return new Set(
      ctrls
        .filter((c) => c.ctrlrs.some((x) => (x.state ?? CONTROLLER_ENABLED) === CONTROLLER_ENABLED))
        .map((c) => c.name),
    );
  }

  /** bdev_raid_set_options: the bandwidth cap of every raid's background process (0: none). */
  async setRebuildBandwidth(mbPerSec: number): Promise<void> {
    await this.spdk.bdevRaidSetOptions({ process_max_bandwidth_mb_sec: mbPerSec });
  }

  /** Detaches controller `controller` (absent: done). */
  async detachController(controller: string): Promise<void> {
    await this.detach(controller);
  }

  /** Detaches the controller of copy `m` (fails its held I/O; the raid completes it without it). */
  async dropMember(m: CopyEndpoint): Promise<void> {
    await this.detach(m.controller);
  }

  /**
   * Takes copy `m` out of raid `raidBdev` gracefully (bdev_raid_remove_base_bdev: the raid stops
   * writing to it), then detaches its controller. A member already out, or a raid or controller
   * already gone, counts as done. The caller has recorded the copy out of the current set first.
   */
  async retireMember(raidBdev: string, m: CopyEndpoint): Promise<void> {
    const raid = await this.findRaid(raidBdev);
    const bdev = nexusMemberBdevFor(m.controller);
    if (raid?.base_bdevs_list.some((b) => b.name === bdev)) {
      await this.spdk.bdevRaidRemoveBaseBdev(bdev).catch((err) => {
        if (!isKind(err, "not-found")) throw err;
      });
    }
    await this.detach(m.controller);
  }

  private async findRaid(name: string): Promise<RaidBdev | undefined> {
    return (await this.spdk.bdevRaidGetBdevs("all")).find((r) => r.name === name);
  }

  private async detach(controller: string): Promise<void> {
    await this.spdk.bdevNvmeDetachController(controller).catch((err) => {
      if (!isKind(err, "not-found")) throw err;
    });
  }

  /**
   * Deletes the raid (if any) and detaches every controller the teardown names and every
   * controller the raid still held; absent things count as gone. The export is removed before
   * (by the caller), so nothing reaches the raid while it goes.
   */
  async teardown(t: NexusTeardown): Promise<string[]> {
    const raid = await this.findRaid(t.raidBdev);
    const controllers = new Set(t.controllers);
    for (const b of raid?.base_bdevs_list ?? []) {
      const c = b.name ? controllerOfMemberBdev(b.name) : undefined;
      if (c) controllers.add(c);
    }
    if (raid) {
      await this.spdk.bdevRaidDelete(t.raidBdev).catch((err) => {
        if (!isKind(err, "not-found")) throw err;
      });
    }
    const have = new Set((await this.spdk.bdevNvmeGetControllers()).map((c) => c.name));
    const detached: string[] = [];
    for (const c of [...controllers].sort()) {
      if (!have.has(c)) continue;
      await this.detach(c);
      detached.push(c);
    }
    return detached;
  }
}
