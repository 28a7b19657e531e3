// The gate every controller passes before it may be advertised, whichever source reported it:
// exact serial, normalized PCI address, namespace 1 present and large enough for a positive
// capacity. A controller that fails becomes an InventoryProblem and degrades its source.

import { normalizePciAddress } from "../../lib/pci-address.ts";
import { allocatableBytes } from "./capacity.ts";
import type { InventoryProblem, SourceController, SourceName } from "./inventory.ts";

/** What a source read about one controller, before any checks. Strings are as read (padding included). */
export interface ControllerReport {
  readonly source: SourceName;
  readonly controller: string;
  readonly serial: string | undefined;
  readonly pciAddress: string | undefined;
  readonly model: string | undefined;
  readonly numaNode: number | undefined;
  /** undefined when the controller has no namespace ID 1. */
  readonly namespace1Bytes: number | undefined;
  readonly blockDevice?: string;
  readonly bdev?: string;
}

/** Same bound as NVMeDevice spec.serial and spec.model. */
const MAX_FIELD = 256;
// C0 and C1 controls, DEL, and U+FFFD (what a non-UTF-8 byte decodes to: the exact serial is lost).
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
const UNPRINTABLE = /[\u0000-\u001f\u007f-\u009f\ufffd]/;

/**
 * NVMe identify strings are space-padded to a fixed width (the kernel prints the padding, SPDK
 * trims it); removing spaces at both ends is what makes the two sources agree. Inner spaces stay.
 */
export function trimIdentifyString(raw: string): string {
  return raw.replace(/^[ \n\0]+|[ \n\0]+$/g, "");
}

/** The exact serial, or why it is unusable. Pure. */
export function checkSerial(
  raw: string | undefined,
): { serial: string } | { reason: string; message: string } {
  if (raw === undefined) return { reason: "SerialMissing", message: "serial number not reported" };
  const serial = trimIdentifyString(raw);
  if (serial.length === 0) return { reason: "SerialMissing", message: "serial number is empty" };
  if (serial.length > MAX_FIELD || UNPRINTABLE.test(serial)) {
    return { reason: "SerialInvalid", message: `serial number ${JSON.stringify(serial)} is not exact text` };
  }
  return { serial };
}

/** Model for display: trimmed, control characters replaced, bounded. Never a reason to reject. */
function cleanModel(raw: string | undefined): string {
  return trimIdentifyString(raw ?? "")
    .replace(new RegExp(UNPRINTABLE.source, "g"), "?")
    .slice(0, MAX_FIELD);
}

function cleanNuma(n: number | undefined): number {
  return n !== undefined && Number.isInteger(n) && n >= -1 && n <= 4095 ? n : -1;
}

/** A validated controller, or the problem that keeps it out. Pure. */
export function validateController(r: ControllerReport): SourceController | InventoryProblem {
  const s = checkSerial(r.serial);
  const pci = r.pciAddress === undefined ? undefined : normalizePciAddress(r.pciAddress);
  const problem = (reason: string, message: string): InventoryProblem => ({
    source: r.source,
    controller: r.controller,
    reason,
    message,
    ...("serial" in s ? { serial: s.serial } : {}),
    ...(pci === undefined ? {} : { pciAddress: pci }),
  });
  if (r.controller.trim().length === 0) return problem("ControllerNameMissing", "controller has no name");
  if ("reason" in s) return problem(s.reason, s.message);
  if (pci === undefined) {
    return problem("PciAddressInvalid", `PCI address ${JSON.stringify(r.pciAddress ?? "")} is not d:b:d.f`);
  }
  if (r.namespace1Bytes === undefined) {
    return problem("Namespace1Missing", `controller ${r.controller} (serial ${s.serial}) has no namespace 1`);
  }
  if (!Number.isSafeInteger(r.namespace1Bytes) || r.namespace1Bytes <= 0) {
    return problem("CapacityInvalid", `namespace 1 size ${r.namespace1Bytes} is not a positive byte count`);
  }
  const alloc = allocatableBytes(r.namespace1Bytes);
  if (alloc <= 0) {
    return problem(
      "CapacityInvalid",
      `namespace 1 (${r.namespace1Bytes} bytes) leaves nothing after the reserve and 4 MiB rounding`,
    );
  }
  return {
    source: r.source,
    controller: r.controller,
    serial: s.serial,
    pciAddress: pci,
    model: cleanModel(r.model),
    numaNode: cleanNuma(r.numaNode),
    namespace1Bytes: r.namespace1Bytes,
    allocatableBytes: alloc,
    ...(r.blockDevice === undefined ? {} : { blockDevice: r.blockDevice }),
    ...(r.bdev === undefined ? {} : { bdev: r.bdev }),
  };
}

/** Narrowing helper for validateController's result. */
export function isProblem(x: SourceController | InventoryProblem): x is InventoryProblem {
  return "reason" in x;
}

/**
 * Two controllers of one source with the same serial cannot be told apart by claims or partitions
 * (the serial is the identity), so neither is advertised: both become DuplicateSerial problems
 * until an operator excludes one by PCI address. Pure; keeps the input order otherwise.
 */
export function rejectDuplicateSerials(controllers: readonly SourceController[]): {
  controllers: SourceController[];
  problems: InventoryProblem[];
} {
  const count = new Map<string, number>();
  for (const c of controllers) count.set(c.serial, (count.get(c.serial) ?? 0) + 1);
  const kept: SourceController[] = [];
  const problems: InventoryProblem[] = [];
  for (const c of controllers) {
    if ((count.get(c.serial) ?? 0) > 1) {
      problems.push({
        source: c.source,
        controller: c.controller,
        reason: "DuplicateSerial",
        message: `serial ${c.serial} at ${c.pciAddress} is reported by more than one controller`,
        serial: c.serial,
        pciAddress: c.pciAddress,
      });
    } else {
      kept.push(c);
    }
  }
  return { controllers: kept, problems };
}
