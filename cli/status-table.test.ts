// Unit tests of the pure half of `distort status`: health polarity, report building from the API
// examples, table alignment, human units and the JSON document's shape.
import { describe, expect, test } from "bun:test";
import type { Condition } from "../api/common.ts";
import {
  exampleNVMeDevice,
  exampleNVMeDeviceClaim,
  exampleNVMePartition,
  exampleNVMeSnapshot,
  exampleNVMeVolumeAttachment,
  exampleRDMAStorageNode,
} from "../api/examples.ts";
import type { NVMePartition } from "../api/nvme-partition.ts";
import {
  buildReport,
  DEFAULT_STALENESS_MS,
  devicesInScope,
  exitCodeFor,
  formatAge,
  formatSize,
  formatTable,
  formatTotals,
  healthyStatus,
  isUnhealthyCondition,
  renderJson,
  renderTables,
  type StatusInput,
} from "./status-table.ts";

const GiB = 1024 ** 3;
// The examples' condition and heartbeat times are 2026-02-01T10:00:00Z; ten seconds later is fresh.
const NOW = new Date("2026-02-01T10:00:10Z");
const CREATED = "2026-02-01T09:00:00Z";

function cond(type: string, status: Condition["status"], reason = "Because", message = ""): Condition {
  return { type, status, reason, message, lastTransitionTime: "2026-02-01T09:55:00Z" };
}

/** One healthy cluster: a node, its claimed drive, a claim, an exported partition, its attachment, a snapshot. */
function healthyInput(): StatusInput {
  const node = exampleRDMAStorageNode();
  const device = exampleNVMeDevice();
  device.status!.conditions = [cond("Present", "True", "BoundToSpdk"), cond("Overcommitted", "False")];
  const partition = exampleNVMePartition();
  partition.metadata.creationTimestamp = CREATED;
  const attachment = exampleNVMeVolumeAttachment();
  attachment.metadata.creationTimestamp = CREATED;
  return {
    storageNodes: [node],
    devices: [device],
    claims: [exampleNVMeDeviceClaim()],
    partitions: [partition],
    attachments: [attachment],
    snapshots: [exampleNVMeSnapshot()],
  };
}

function report(input: StatusInput, namespace: string | null = null) {
  return buildReport(input, { now: NOW, namespace });
}

/** The lines of one section of the rendered text, header first, without the title. */
function sectionLines(text: string, title: string): string[] {
  const block = text.split("\n\n").find((b) => b.startsWith(`${title}\n`));
  if (!block) throw new Error(`no section ${title} in:\n${text}`);
  return block.split("\n").slice(1);
}

describe("health polarity", () => {
  test("positive types are healthy when True, abnormal-true types when False", () => {
    for (const t of ["Ready", "NVMeInventoryReady", "Present", "Scheduled", "Bound", "AccessReady"]) {
      expect(healthyStatus(t)).toBe("True");
    }
    for (const t of [
      "Overcommitted",
      "DeletionBlocked",
      "SpaceExhausted",
      "Degraded",
      "example.com/Degraded",
      "DiskPressure",
    ]) {
      expect(healthyStatus(t)).toBe("False");
    }
  });

  test("Ready=False and Overcommitted=True are unhealthy; Unknown never is", () => {
    expect(isUnhealthyCondition(cond("Ready", "False"))).toBe(true);
    expect(isUnhealthyCondition(cond("Ready", "True"))).toBe(false);
    expect(isUnhealthyCondition(cond("Ready", "Unknown", "Provisioning"))).toBe(false);
    expect(isUnhealthyCondition(cond("Overcommitted", "True"))).toBe(true);
    expect(isUnhealthyCondition(cond("Overcommitted", "False"))).toBe(false);
    expect(isUnhealthyCondition(cond("DeletionBlocked", "True", "ClonesExist"))).toBe(true);
  });

  test("a failure reason counts even at the healthy status", () => {
    expect(isUnhealthyCondition(cond("Ready", "True", "ReconcileFailed"))).toBe(true);
    expect(isUnhealthyCondition(cond("Degraded", "False", "ProbeError"))).toBe(true);
    expect(isUnhealthyCondition(cond("Ready", "True", "Exported"))).toBe(false);
  });
});

describe("buildReport", () => {
  test("a healthy set has no unhealthy rows and exit code 0", () => {
    const r = report(healthyInput());
    expect(r.unhealthy).toEqual([]);
    expect(r.healthy).toBe(true);
    expect(exitCodeFor(r)).toBe(0);
    expect(sectionLines(renderTables(r), "UNHEALTHY")).toEqual(["(none)"]);
  });

  test("a Ready=False partition appears in UNHEALTHY and makes the exit code 1", () => {
    const input = healthyInput();
    const failed = exampleNVMePartition();
    failed.metadata = { name: "pvc-broken", namespace: "distort-system", uid: "u-broken" };
    failed.status = {
      state: "Failed",
      conditions: [cond("Ready", "False", "DeviceNotFound", "device S4EWNX0R123456 is not on node-a")],
    };
    const r = report({ ...input, partitions: [...input.partitions, failed] });
    expect(r.unhealthy).toEqual([
      {
        kind: "NVMePartition",
        namespace: "distort-system",
        name: "pvc-broken",
        type: "Ready",
        status: "False",
        reason: "DeviceNotFound",
        message: "device S4EWNX0R123456 is not on node-a",
        since: "2026-02-01T09:55:00Z",
      },
    ]);
    expect(exitCodeFor(r)).toBe(1);
    const rows = sectionLines(renderTables(r), "UNHEALTHY");
    expect(rows[0]).toMatch(/^KIND\s+NAME\s+CONDITION\s+REASON\s+SINCE\s+MESSAGE$/);
    expect(rows[1]).toMatch(
      /^NVMePartition\s+distort-system\/pvc-broken\s+Ready=False\s+DeviceNotFound\s+5m10s\s+device S4EWNX0R123456/,
    );
    expect(r.totals.partitionsByPhase).toMatchObject({ Exported: 1, Failed: 1 });
  });

  test("an overcommitted device shows in HEALTH and in UNHEALTHY", () => {
    const input = healthyInput();
    input.devices[0]!.status!.conditions = [cond("Overcommitted", "True", "LedgerExceedsCapacity")];
    const r = report(input);
    expect(r.devices[0]!.problems).toEqual(["Overcommitted=True"]);
    expect(r.unhealthy.map((u) => `${u.kind}/${u.name}/${u.type}`)).toEqual([
      "NVMeDevice/node-a-3f2c9e1b/Overcommitted",
    ]);
    expect(sectionLines(renderTables(r), "DEVICES")[1]).toMatch(/\s+Overcommitted=True$/);
  });

  test("a stale heartbeat is flagged only while Ready does not already say so", () => {
    const input = healthyInput();
    const late = new Date(Date.parse("2026-02-01T10:00:00Z") + DEFAULT_STALENESS_MS + 1000);
    const stale = buildReport(input, { now: late, namespace: null });
    expect(stale.storageNodes[0]!.heartbeatFresh).toBe(false);
    expect(stale.unhealthy.map((u) => [u.type, u.reason])).toEqual([["Heartbeat", "HeartbeatStale"]]);

    input.storageNodes[0]!.status!.conditions = [cond("Ready", "False", "HeartbeatStale")];
    const expired = buildReport(input, { now: late, namespace: null });
    expect(expired.unhealthy.map((u) => [u.type, u.reason])).toEqual([["Ready", "HeartbeatStale"]]);

    input.storageNodes[0]!.status = undefined;
    const never = buildReport(input, { now: NOW, namespace: null });
    expect(never.unhealthy.map((u) => u.reason)).toEqual(["NoHeartbeat"]);
  });

  test("objects that failed the schema are listed as unhealthy", () => {
    const r = report({
      ...healthyInput(),
      invalid: [{ kind: "NVMePartition", namespace: "ns", name: "odd", message: "does not match" }],
    });
    expect(r.unhealthy.map((u) => [u.kind, u.name, u.type, u.reason])).toEqual([
      ["NVMePartition", "odd", "Schema", "SchemaMismatch"],
    ]);
  });

  test("partitions: attachments by exact UID, portal, volume handle, phase before status", () => {
    const input = healthyInput();
    const stranger = exampleNVMeVolumeAttachment();
    stranger.metadata = { name: "va-old", namespace: "distort-system" };
    stranger.spec.partitionUID = "uid-of-a-deleted-namesake";
    stranger.spec.nodeId = "node-z";
    const fresh: NVMePartition = {
      ...exampleNVMePartition(),
      metadata: { name: "pvc-new", namespace: "distort-system", uid: "u-new" },
      status: undefined,
    };
    const v6 = exampleNVMePartition();
    v6.metadata = { name: "pvc-v6", namespace: "distort-system", uid: "u-v6" };
    v6.status!.portalIP = "fd00::10";
    v6.status!.transport = "tcp";
    const r = report({
      ...input,
      partitions: [...input.partitions, fresh, v6],
      attachments: [...input.attachments, stranger],
    });
    const byName = Object.fromEntries(r.partitions.map((p) => [p.name, p]));
    expect(byName["pvc-0f8fad5b"]!.attachedTo).toEqual(["node-b"]);
    expect(byName["pvc-0f8fad5b"]!.portal).toBe("rdma://192.168.100.10:4420");
    expect(byName["pvc-0f8fad5b"]!.volumeHandle).toBe("distort-system/pvc-0f8fad5b");
    expect(byName["pvc-v6"]!.portal).toBe("tcp://[fd00::10]:4420");
    expect(byName["pvc-new"]!.phase).toBe("Pending");
    expect(byName["pvc-new"]!.attachedTo).toEqual([]);
  });

  test("attachment phases follow AccessReady and the lifetimes", () => {
    const ready = exampleNVMeVolumeAttachment();
    const pending = exampleNVMeVolumeAttachment();
    pending.metadata.name = "va-pending";
    pending.status = undefined;
    const takeover = exampleNVMeVolumeAttachment();
    takeover.metadata.name = "va-takeover";
    takeover.spec.attachmentId = "att-2";
    const refused = exampleNVMeVolumeAttachment();
    refused.metadata.name = "va-refused";
    refused.status!.conditions = [cond("AccessReady", "False", "NotExported")];
    const revoking = exampleNVMeVolumeAttachment();
    revoking.metadata.name = "va-revoking";
    revoking.metadata.deletionTimestamp = "2026-02-01T10:00:05Z";
    const r = report({
      ...healthyInput(),
      attachments: [ready, pending, takeover, refused, revoking],
    });
    expect(Object.fromEntries(r.attachments.map((a) => [a.name, [a.phase, a.reason]]))).toEqual({
      "pvc-0f8fad5b-c812e1edb6": ["Ready", null],
      "va-pending": ["Pending", null],
      "va-takeover": ["TakingOver", "HostAllowed"],
      "va-refused": ["NotReady", "NotExported"],
      "va-revoking": ["Revoking", "HostAllowed"],
    });
    expect(r.unhealthy.map((u) => u.name)).toEqual(["va-refused"]);
  });

  test("a namespace view keeps the devices its nodes, claims and partitions involve", () => {
    const mine = exampleNVMeDevice();
    const claimedHere = exampleNVMeDevice();
    claimedHere.metadata.name = "node-q-1";
    claimedHere.spec.nodeName = "node-q";
    claimedHere.status!.claimRef = { namespace: "team", name: "c", uid: "u" };
    claimedHere.status!.reservations = [];
    const reservedHere = exampleNVMeDevice();
    reservedHere.metadata.name = "node-r-1";
    reservedHere.spec.nodeName = "node-r";
    reservedHere.status!.reservations = [{ uid: "p", namespace: "team", name: "p", bytes: GiB }];
    const elsewhere = exampleNVMeDevice();
    elsewhere.metadata.name = "node-x-1";
    elsewhere.spec.nodeName = "node-x";
    const node = exampleRDMAStorageNode();
    node.metadata.namespace = "team";
    const all = [mine, claimedHere, reservedHere, elsewhere];
    expect(devicesInScope(all, "team", [node]).map((d) => d.metadata.name)).toEqual([
      "node-a-3f2c9e1b",
      "node-q-1",
      "node-r-1",
    ]);
    expect(devicesInScope(all, null, [node])).toHaveLength(4);
    expect(devicesInScope(all, "other", [node])).toEqual([]);
  });

  test("totals count claimed capacity, free bytes and phases", () => {
    const input = healthyInput();
    const spare = exampleNVMeDevice();
    spare.metadata.name = "node-a-spare";
    spare.spec.serial = "SPARE";
    spare.status = { phase: "Available", reservations: [], conditions: [] };
    const r = report({ ...input, devices: [...input.devices, spare] });
    expect(r.totals).toEqual({
      devices: 2,
      devicesByPhase: { Available: 1, Claimed: 1, Unavailable: 0 },
      allocatableBytes: 7600 * GiB,
      claimedBytes: 3800 * GiB,
      freeBytes: 3700 * GiB,
      partitions: 1,
      partitionsByPhase: { Pending: 0, Placed: 0, Provisioning: 0, Exported: 1, Deleting: 0, Failed: 0 },
      attachments: 1,
      snapshots: 1,
      unhealthy: 0,
    });
    expect(formatTotals(r.totals)).toBe(
      "TOTAL: 2 devices (1 Available, 1 Claimed), 3800.0GiB claimed, 3700.0GiB free; " +
        "1 partition (1 Exported); 1 attachment; 0 unhealthy",
    );
  });
});

describe("formatting", () => {
  test("sizes are GiB with one decimal; tiny sizes keep their own unit", () => {
    expect(formatSize(100 * GiB)).toBe("100.0GiB");
    expect(formatSize(1.25 * GiB)).toBe("1.3GiB");
    expect(formatSize(3800 * GiB)).toBe("3800.0GiB");
    expect(formatSize(0)).toBe("0.0GiB");
    expect(formatSize(4 * 1024 * 1024)).toBe("4MiB");
    expect(formatSize(null)).toBe("-");
  });

  test("ages read like kubectl's", () => {
    const at = (s: number) => new Date(NOW.getTime() - s * 1000).toISOString();
    expect(formatAge(at(5), NOW)).toBe("5s");
    expect(formatAge(at(119), NOW)).toBe("119s");
    expect(formatAge(at(200), NOW)).toBe("3m20s");
    expect(formatAge(at(3600), NOW)).toBe("60m");
    expect(formatAge(at(5 * 3600 + 60), NOW)).toBe("5h1m");
    expect(formatAge(at(30 * 3600), NOW)).toBe("30h");
    expect(formatAge(at(3 * 86400 + 7200), NOW)).toBe("3d2h");
    expect(formatAge(at(40 * 86400), NOW)).toBe("40d");
    expect(formatAge(at(-30), NOW)).toBe("0s");
    expect(formatAge(null, NOW)).toBe("-");
  });

  test("columns are aligned, separated by three spaces, without trailing blanks", () => {
    const t = formatTable(
      ["NAME", "SIZE", "PHASE"],
      [
        ["a", "100.0GiB", "Exported"],
        ["a-much-longer-name", "1.0GiB", "-"],
      ],
    );
    const lines = t.split("\n");
    expect(lines).toEqual([
      "NAME                 SIZE       PHASE",
      "a                    100.0GiB   Exported",
      "a-much-longer-name   1.0GiB     -",
    ]);
  });

  test("every table of the report is aligned column by column", () => {
    const text = renderTables(report(healthyInput()), { wide: true });
    for (const title of ["STORAGE NODES", "DEVICES", "CLAIMS", "PARTITIONS", "ATTACHMENTS", "SNAPSHOTS"]) {
      const [header, ...rows] = sectionLines(text, title);
      const starts = [...header!.matchAll(/\S+/g)].map((m) => m.index);
      expect(rows.length).toBeGreaterThan(0);
      for (const row of rows) {
        expect(row.endsWith(" ")).toBe(false);
        // Each column's value starts where its header starts, preceded by a blank.
        for (const s of starts.slice(1)) expect(row.slice(s! - 1, s)).toBe(" ");
      }
    }
  });

  test("the default tables show the user-facing columns", () => {
    const text = renderTables(report(healthyInput()));
    expect(sectionLines(text, "STORAGE NODES")).toEqual([
      "NAME                    NODE     READY   FRESH   HEARTBEAT   BACKENDS   DEVICES",
      "distort-system/node-a   node-a   True    yes     10s         spdk       1",
    ]);
    expect(sectionLines(text, "DEVICES")).toEqual([
      "NODE     SERIAL           MODEL                  ALLOCATABLE   RESERVED   FREE        PHASE     " +
        "CLAIM                    PARTITIONS   HEALTH",
      "node-a   S4EWNX0R123456   SAMSUNG MZQL23T8HCLS   3800.0GiB     100.0GiB   3700.0GiB   Claimed   " +
        "distort-system/drive-1   1            ok",
    ]);
    expect(sectionLines(text, "PARTITIONS")[1]).toBe(
      "distort-system/pvc-0f8fad5b   100.0GiB   node-a   S4EWNX0R123456   spdk      Exported   " +
        "rdma://192.168.100.10:4420   node-b        distort-system/pvc-0f8fad5b   60m",
    );
    expect(text.endsWith("0 unhealthy\n")).toBe(true);
  });

  test("control characters in object fields cannot break the table or reach the terminal", () => {
    const input = healthyInput();
    input.partitions[0]!.status!.conditions = [
      cond("Ready", "False", "BackendConflict", "line one\nline two \u001b[31mred\u001b[0m"),
    ];
    const text = renderTables(report(input));
    const rows = sectionLines(text, "UNHEALTHY");
    expect(rows).toHaveLength(2);
    expect(rows[1]).toContain("line one line two ?[31mred?[0m");
    expect(text).not.toContain("\u001b");
  });

  test("long messages are cut in tables but kept whole in wide tables and JSON", () => {
    const input = healthyInput();
    const long = "x".repeat(200);
    input.partitions[0]!.status!.conditions = [cond("Ready", "False", "BackendConflict", long)];
    const r = report(input);
    expect(sectionLines(renderTables(r), "UNHEALTHY")[1]).toEndWith(`${"x".repeat(77)}...`);
    expect(sectionLines(renderTables(r, { wide: true }), "UNHEALTHY")[1]).toEndWith(long);
    expect((JSON.parse(renderJson(r)) as { unhealthy: { message: string }[] }).unhealthy[0]!.message).toBe(
      long,
    );
  });
});

describe("JSON", () => {
  test("one document with stable top-level and row keys, raw bytes and timestamps", () => {
    const input = healthyInput();
    const bare: NVMePartition = {
      ...exampleNVMePartition(),
      metadata: { name: "pvc-bare", namespace: "distort-system", uid: "u-bare" },
      status: undefined,
    };
    const r = report({ ...input, partitions: [...input.partitions, bare] }, "distort-system");
    const doc = JSON.parse(renderJson(r)) as Record<string, unknown>;
    expect(Object.keys(doc)).toEqual([
      "kind",
      "generatedAt",
      "namespace",
      "healthy",
      "totals",
      "storageNodes",
      "devices",
      "claims",
      "partitions",
      "attachments",
      "snapshots",
      "unhealthy",
    ]);
    expect(doc.kind).toBe("DistortStatus");
    expect(doc.generatedAt).toBe(NOW.toISOString());
    expect(doc.namespace).toBe("distort-system");
    const parts = doc.partitions as Record<string, unknown>[];
    // A partition nothing has acted on has the same keys, with nulls.
    expect(Object.keys(parts[0]!)).toEqual(Object.keys(parts[1]!));
    expect(parts.map((p) => [p.name, p.sizeBytes, p.phase, p.portal])).toEqual([
      ["pvc-0f8fad5b", 100 * GiB, "Exported", "rdma://192.168.100.10:4420"],
      ["pvc-bare", 100 * GiB, "Pending", null],
    ]);
    const devices = doc.devices as Record<string, unknown>[];
    expect(devices[0]).toMatchObject({
      serial: "S4EWNX0R123456",
      allocatableBytes: 3800 * GiB,
      reservedBytes: 100 * GiB,
      freeBytes: 3700 * GiB,
      phase: "Claimed",
      claim: "distort-system/drive-1",
      partitions: 1,
      problems: [],
    });
    expect((doc.storageNodes as Record<string, unknown>[])[0]).toMatchObject({
      name: "node-a",
      ready: "True",
      heartbeatFresh: true,
      lastHeartbeatTime: "2026-02-01T10:00:00Z",
      backends: ["spdk"],
      devices: 1,
    });
    expect(renderJson(r).endsWith("}\n")).toBe(true);
  });
});
