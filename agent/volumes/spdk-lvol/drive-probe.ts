// What a drive under SPDK holds and promises, read through bdev_nvme_send_cmd before its first
// lvstore: Identify Namespace (size, block size, DLFEAT: whether deallocated blocks read as zeros)
// and the bytes of its first and last MiB, probed for signatures with blkid on a sparse image.
import { closeSync, ftruncateSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { join } from "node:path";
import * as v from "valibot";
import { StorageError } from "../../../lib/errors.ts";
import type { Exec } from "../../../lib/exec.ts";
import { blkidArgv, type DeviceContent, interpretBlkid } from "../../../lib/host/blkid.ts";
import type { SpdkRpc } from "../../../lib/spdk/client.ts";

const MiB = 1024 * 1024;
/** Bytes per Read command: well under any drive's MDTS and SPDK's 32 KiB request limit is on requests, not replies. */
export const READ_CHUNK = 128 * 1024;

/** Identify Namespace facts the agent acts on. */
export interface NamespaceIdentity {
  numBlocks: number;
  blockSize: number;
  /** DLFEAT byte: bits 2:0 = 001b means deallocated blocks read as zeros. */
  dlfeat: number;
}

/** True when the namespace promises that deallocated (unmapped) blocks read as zeros. */
export function deallocateReadsZeros(id: NamespaceIdentity): boolean {
  return (id.dlfeat & 0x7) === 0x1;
}

/** Controller and NSID of an NVMe namespace bdev, which SPDK names "<controller>n<nsid>". */
export function namespaceOf(bdevName: string): { ctrlr: string; nsid: number } {
  const m = /^(.+)n([1-9][0-9]*)$/.exec(bdevName);
  if (!m) throw new StorageError("precondition", `${bdevName} is not an NVMe namespace bdev`);
  return { ctrlr: m[1] as string, nsid: Number(m[2]) };
}

const ReplySchema = v.object({ cpl: v.string(), data: v.optional(v.string()) });

/** The 64-byte submission entry of an admin or I/O command (CID and data pointers are SPDK's). */
export function submissionEntry(opc: number, nsid: number, cdw10 = 0, cdw11 = 0, cdw12 = 0): Buffer {
  const sqe = Buffer.alloc(64);
  sqe[0] = opc;
  sqe.writeUInt32LE(nsid, 4);
  sqe.writeUInt32LE(cdw10 >>> 0, 40);
  sqe.writeUInt32LE(cdw11 >>> 0, 44);
  sqe.writeUInt32LE(cdw12 >>> 0, 48);
  return sqe;
}

function b64url(b: Buffer): string {
  return b.toString("base64").replaceAll("+", "-").replaceAll("/", "_");
}

async function send(
  rpc: SpdkRpc,
  ctrlr: string,
  type: "admin" | "io",
  sqe: Buffer,
  dataLen: number,
  what: string,
): Promise<Buffer> {
  const raw = await rpc.call("bdev_nvme_send_cmd", {
    name: ctrlr,
    cmd_type: type,
    data_direction: "c2h",
    cmdbuf: b64url(sqe),
    data_len: dataLen,
    timeout_ms: 10_000,
  });
  const r = v.safeParse(ReplySchema, raw);
  if (!r.success) throw new StorageError("internal", `bdev_nvme_send_cmd (${what}): unexpected reply`);
  const cpl = Buffer.from(r.output.cpl, "base64url");
  const status = cpl.length >= 16 ? cpl.readUInt16LE(14) >> 1 : -1;
  if (status !== 0) {
    throw new StorageError(
      "internal",
      `${what} on ${ctrlr} failed: NVMe status 0x${(status >>> 0).toString(16)}`,
    );
  }
  const data = Buffer.from(r.output.data ?? "", "base64url");
  if (data.length !== dataLen)
    throw new StorageError("internal", `${what} on ${ctrlr}: ${data.length} bytes, expected ${dataLen}`);
  return data;
}

/** Identify Namespace (CNS 0) of `bdevName`'s namespace. */
export async function identifyNamespace(rpc: SpdkRpc, bdevName: string): Promise<NamespaceIdentity> {
  const { ctrlr, nsid } = namespaceOf(bdevName);
  const d = await send(rpc, ctrlr, "admin", submissionEntry(0x06, nsid, 0), 4096, "Identify Namespace");
  const flbas = (d[26] as number) & 0x0f;
  const lbads = ((d.readUInt32LE(128 + 4 * flbas) >>> 16) & 0xff) as number;
  return { numBlocks: Number(d.readBigUInt64LE(0)), blockSize: 2 ** lbads, dlfeat: d[33] as number };
}

/** Reads `length` bytes at `offset` (both multiples of the block size) of `bdevName`'s namespace. */
export async function readNamespace(
  rpc: SpdkRpc,
  bdevName: string,
  id: NamespaceIdentity,
  offset: number,
  length: number,
): Promise<Buffer> {
  const { ctrlr, nsid } = namespaceOf(bdevName);
  const reads: Promise<Buffer>[] = [];
  for (let at = offset; at < offset + length; at += READ_CHUNK) {
    const n = Math.min(READ_CHUNK, offset + length - at);
    const slba = at / id.blockSize;
    const blocks = n / id.blockSize;
    // Pipelined: SPDK answers in completion order and the client matches by id.
    reads.push(
      send(
        rpc,
        ctrlr,
        "io",
        submissionEntry(0x02, nsid, slba % 2 ** 32, Math.floor(slba / 2 ** 32), blocks - 1),
        n,
        "Read",
      ),
    );
  }
  return Buffer.concat(await Promise.all(reads));
}

/** Classifies what a drive holds from the bytes of some of its regions. */
export interface ContentProbe {
  probe(sizeBytes: number, regions: readonly { offset: number; data: Buffer }[]): Promise<DeviceContent>;
}

/**
 * A ContentProbe running `blkid -p` on a sparse image of the drive's size holding only the given
 * regions (the rest reads as zeros): the first and last MiB carry every signature blkid knows of
 * partition tables (GPT's backup at the end), LVM, MD RAID, ZFS (labels at both ends), Ceph
 * BlueStore and the usual filesystems. The image lives in a fresh directory under `tmpDir`.
 */
export function blkidImageProbe(exec: Exec, tmpDir: string): ContentProbe {
  return {
    async probe(sizeBytes, regions) {
      const dir = mkdtempSync(join(tmpDir, "distort-drive-probe-"));
      const img = join(dir, "drive.img");
      try {
        const fd = openSync(img, "w", 0o600);
        try {
          ftruncateSync(fd, sizeBytes);
          for (const r of regions) writeSync(fd, r.data, 0, r.data.length, r.offset);
        } finally {
          closeSync(fd);
        }
        return interpretBlkid(await exec.run(blkidArgv(img), { timeoutMs: 30_000 }));
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  };
}

/** The first and last MiB of a namespace (one region when it is at most 2 MiB). */
export async function edgeRegions(
  rpc: SpdkRpc,
  bdevName: string,
  id: NamespaceIdentity,
): Promise<{ offset: number; data: Buffer }[]> {
  const size = id.numBlocks * id.blockSize;
  if (size <= 2 * MiB) return [{ offset: 0, data: await readNamespace(rpc, bdevName, id, 0, size) }];
  return [
    { offset: 0, data: await readNamespace(rpc, bdevName, id, 0, MiB) },
    { offset: size - MiB, data: await readNamespace(rpc, bdevName, id, size - MiB, MiB) },
  ];
}
