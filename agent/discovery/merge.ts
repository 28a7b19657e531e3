// Assembles one discovery result from the two sources: operator filters first, then duplicate
// serials rejected within and across sources, then one device per serial (SPDK wins when both
// sources report it, since SPDK then owns the controller), with per-source health.
import { type DeviceFilter, filterVerdict, partialFilterVerdict } from "./device-filter.ts";
import {
  type DiscoveredDevice,
  type DiscoveryResult,
  failedHealth,
  healthFromProblems,
  type InventoryProblem,
  type SkippedController,
  type SourceController,
  type SourceHealth,
  type SourceScan,
} from "./inventory.ts";
import { rejectDuplicateSerials } from "./validate-controller.ts";

interface Stage {
  readonly scan: SourceScan;
  controllers: SourceController[];
  problems: InventoryProblem[];
  skipped: SkippedController[];
}

function filtered(scan: SourceScan, filter: DeviceFilter): Stage {
  const skipped = [...scan.skipped];
  const kept: SourceController[] = [];
  for (const c of scan.controllers) {
    const verdict = filterVerdict(filter, c);
    if (verdict)
      skipped.push({ source: c.source, controller: c.controller, reason: verdict, serial: c.serial });
    else kept.push(c);
  }
  // A broken drive the operator excluded is left out, not a fault: that is how a node with one
  // unreadable drive gets back to a complete inventory.
  const problems: InventoryProblem[] = [];
  for (const p of scan.problems) {
    const verdict = partialFilterVerdict(filter, p);
    if (verdict) {
      skipped.push({
        source: p.source,
        controller: p.controller,
        reason: verdict,
        ...(p.serial === undefined ? {} : { serial: p.serial }),
      });
    } else {
      problems.push(p);
    }
  }
  const dedup = rejectDuplicateSerials(kept);
  return { scan, controllers: dedup.controllers, problems: [...problems, ...dedup.problems], skipped };
}

function health(stage: Stage): SourceHealth {
  const { scan } = stage;
  if (scan.failure) return failedHealth(scan.failure.reason, scan.failure.message);
  if (scan.notConfigured) {
    return { state: "ok", reason: "NotConfigured", message: `no ${scan.source} inventory on this node` };
  }
  return healthFromProblems(stage.problems, scan.found, stage.controllers.length);
}

function device(k: SourceController | undefined, s: SourceController | undefined): DiscoveredDevice {
  const facts = (s ?? k) as SourceController;
  return {
    serial: facts.serial,
    pciAddress: facts.pciAddress,
    model: facts.model,
    numaNode: facts.numaNode,
    namespace1Bytes: facts.namespace1Bytes,
    allocatableBytes: facts.allocatableBytes,
    activeBackend: s ? "spdk" : "kernel",
    ...(k
      ? { kernel: { controller: k.controller, ...(k.blockDevice ? { blockDevice: k.blockDevice } : {}) } }
      : {}),
    ...(s ? { spdk: { controller: s.controller, ...(s.bdev ? { bdev: s.bdev } : {}) } } : {}),
  };
}

/**
 * The discovery result of one pass. A failed source contributes health only; a degraded one still
 * contributes every controller that passed. `complete` holds only when both sources are ok. Pure.
 */
export function assembleInventory(
  kernel: SourceScan,
  spdk: SourceScan,
  filter: DeviceFilter = {},
): DiscoveryResult {
  const k = filtered(kernel, filter);
  const s = filtered(spdk, filter);

  // The same serial from both sources is one drive only at one PCI address (seen mid-rebind);
  // at two addresses it is two drives that cannot be told apart.
  const kBySerial = new Map(k.controllers.map((c) => [c.serial, c]));
  const sBySerial = new Map(s.controllers.map((c) => [c.serial, c]));
  for (const [serial, sc] of sBySerial) {
    const kc = kBySerial.get(serial);
    if (!kc || kc.pciAddress === sc.pciAddress) continue;
    const message = `serial ${serial} is at ${kc.pciAddress} (kernel ${kc.controller}) and ${sc.pciAddress} (SPDK ${sc.controller})`;
    k.problems.push({ source: "kernel", controller: kc.controller, reason: "DuplicateSerial", message });
    s.problems.push({ source: "spdk", controller: sc.controller, reason: "DuplicateSerial", message });
    kBySerial.delete(serial);
    sBySerial.delete(serial);
  }
  k.controllers = k.controllers.filter((c) => kBySerial.has(c.serial));
  s.controllers = s.controllers.filter((c) => sBySerial.has(c.serial));

  const serials = new Set([...kBySerial.keys(), ...sBySerial.keys()]);
  const devices = [...serials]
    .map((serial) => device(kBySerial.get(serial), sBySerial.get(serial)))
    .sort((a, b) => a.pciAddress.localeCompare(b.pciAddress) || a.serial.localeCompare(b.serial));

  const kh = health(k);
  const sh = health(s);
  return {
    devices,
    kernel: kh,
    spdk: sh,
    ...(spdk.version === undefined ? {} : { spdkVersion: spdk.version }),
    complete: kh.state === "ok" && sh.state === "ok",
    problems: [...k.problems, ...s.problems],
    skipped: [...k.skipped, ...s.skipped],
  };
}
