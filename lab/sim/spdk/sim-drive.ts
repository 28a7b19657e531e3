// Simulated PCIe NVMe drives: what a drive looks like (address, identity, size, namespaces) and
// its backing sparse file in the data directory, split into namespace extents whose identity
// (UUID) is stable across emulator restarts like a real drive's NGUID.
import { createHash } from "node:crypto";
import { closeSync, existsSync, fstatSync, ftruncateSync, mkdirSync, openSync } from "node:fs";
import { join } from "node:path";
import * as v from "valibot";
import { normalizePciAddress } from "../../../lib/pci-address.ts";

/** A drive the emulator can attach with bdev_nvme_attach_controller trtype PCIe. */
export interface SimDrive {
  /** PCI address (traddr), e.g. "0000:3b:00.0"; the short form "3b:00.0" is accepted. */
  readonly pciAddress: string;
  readonly serial: string;
  readonly model: string;
  /** Capacity of the whole drive in bytes, shared equally by its namespaces. */
  readonly sizeBytes: number;
  readonly numaNode?: number;
  /** Active namespace IDs; default [1]. */
  readonly namespaces?: readonly number[];
  /** LBA size; default 4096. */
  readonly blockSize?: 512 | 4096;
  /** Firmware revision; default "SIM1.0". */
  readonly firmware?: string;
  /**
   * Identify Namespace DLFEAT (byte 33): bits 2:0 say what deallocated blocks read as (001b:
   * zeros, 000b: not reported), bit 3 that Write Zeroes may deallocate. Default 0x09, which is
   * what the emulator does: a deallocated range reads as zeros.
   */
  readonly dlfeat?: number;
}

/** valibot schema of SimDrive, for the CLI's drives file. */
export const SimDriveSchema = v.object({
  pciAddress: v.string(),
  serial: v.pipe(v.string(), v.minLength(1), v.maxLength(20)),
  model: v.pipe(v.string(), v.minLength(1), v.maxLength(40)),
  sizeBytes: v.pipe(v.number(), v.integer(), v.minValue(1)),
  numaNode: v.optional(v.pipe(v.number(), v.integer())),
  namespaces: v.optional(v.array(v.pipe(v.number(), v.integer(), v.minValue(1)))),
  blockSize: v.optional(v.picklist([512, 4096])),
  firmware: v.optional(v.pipe(v.string(), v.maxLength(8))),
  dlfeat: v.optional(v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(255))),
});

/** One namespace of a prepared drive: an extent of the backing file. */
export interface DriveNamespace {
  readonly nsid: number;
  readonly offset: number;
  readonly sizeBytes: number;
  readonly uuid: string;
}

/** A drive with its backing file in place. */
export interface PreparedDrive {
  readonly drive: SimDrive;
  /** Normalised PCI address "dddd:bb:dd.f". */
  readonly pciAddress: string;
  readonly path: string;
  readonly blockSize: number;
  readonly namespaces: readonly DriveNamespace[];
}

/** A UUID derived from the drive serial and NSID (name-based, version 5 layout). */
function namespaceUuid(serial: string, nsid: number): string {
  const h = createHash("sha1").update(`distort-sim-drive:${serial}:${nsid}`).digest();
  h[6] = ((h[6] as number) & 0x0f) | 0x50;
  h[8] = ((h[8] as number) & 0x3f) | 0x80;
  const x = h.subarray(0, 16).toString("hex");
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20, 32)}`;
}

/**
 * Creates (or reuses) the sparse backing file of each drive under `dataDir/drives` and lays out
 * its namespaces. Idempotent: an existing file keeps its bytes; its length is set to sizeBytes.
 * Throws on a bad PCI address or two drives with the same address.
 */
export function prepareDrives(dataDir: string, drives: readonly SimDrive[]): PreparedDrive[] {
  const dir = join(dataDir, "drives");
  mkdirSync(dir, { recursive: true });
  const seen = new Set<string>();
  return drives.map((drive) => {
    const pci = normalizePciAddress(drive.pciAddress);
    if (!pci) throw new Error(`drive ${drive.serial}: bad PCI address ${drive.pciAddress}`);
    if (seen.has(pci)) throw new Error(`two drives at ${pci}`);
    seen.add(pci);
    const path = join(dir, `${pci.replaceAll(":", "_")}.img`);
    const fd = openSync(path, existsSync(path) ? "r+" : "w+");
    try {
      if (fstatSync(fd).size !== drive.sizeBytes) ftruncateSync(fd, drive.sizeBytes);
    } finally {
      closeSync(fd);
    }
    const blockSize = drive.blockSize ?? 4096;
    const nsids = [...(drive.namespaces ?? [1])].sort((a, b) => a - b);
    const per = Math.floor(drive.sizeBytes / nsids.length / blockSize) * blockSize;
    const namespaces = nsids.map((nsid, i) => ({
      nsid,
      offset: i * per,
      sizeBytes: per,
      uuid: namespaceUuid(drive.serial, nsid),
    }));
    return { drive, pciAddress: pci, path, blockSize, namespaces };
  });
}
