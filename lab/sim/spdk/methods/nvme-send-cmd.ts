// bdev_nvme_send_cmd (module/bdev/nvme/nvme_rpc.c): a raw NVMe command to an attached controller,
// base64url in and out. The emulator answers what the agent sends: admin Identify Namespace (CNS 0,
// with the drive's DLFEAT) and I/O Read of a local drive's namespace; anything else completes with
// Invalid Command Opcode, as a drive would.
import * as v from "valibot";
import type { App } from "../app.ts";
import { type MethodSpec, RUNTIME } from "../method-table.ts";
import type { NvmeCtrlr } from "../nvme-controllers.ts";
import { str, u32 } from "../params.ts";
import { Errno, RpcCode, RpcError } from "../rpc-error.ts";

const OPC_IDENTIFY = 0x06;
const OPC_READ = 0x02;
/** Generic command status codes (SCT 0). */
const SC = { success: 0x00, invalidOpcode: 0x01, invalidField: 0x02, invalidNamespace: 0x0b } as const;
/** What the emulator reports for a drive that sets no DLFEAT: deallocated blocks read as zeros. */
export const DEFAULT_DLFEAT = 0x09;

const SendCmdSchema = v.strictObject({
  name: str,
  cmd_type: v.picklist(["admin", "io"]),
  data_direction: v.picklist(["c2h", "h2c"]),
  cmdbuf: str,
  timeout_ms: v.optional(u32),
  data_len: v.optional(u32),
  metadata_len: v.optional(u32),
  data: v.optional(str),
  metadata: v.optional(str),
});

/** spdk_base64_urlsafe_encode: the URL-safe alphabet, with padding. */
export function base64url(b: Buffer): string {
  return b.toString("base64").replaceAll("+", "-").replaceAll("/", "_");
}

function completion(sc: number): Buffer {
  const cpl = Buffer.alloc(16);
  cpl.writeUInt16LE(sc << 1, 14);
  return cpl;
}

/** Identify Namespace data (4096 bytes) of one namespace, LBA format 0 only. */
export function identifyNamespaceData(numBlocks: number, blockSize: number, dlfeat: number): Buffer {
  const d = Buffer.alloc(4096);
  d.writeBigUInt64LE(BigInt(numBlocks), 0); // NSZE
  d.writeBigUInt64LE(BigInt(numBlocks), 8); // NCAP
  d.writeBigUInt64LE(BigInt(numBlocks), 16); // NUSE
  d[25] = 0; // NLBAF: one format
  d[26] = 0; // FLBAS: format 0
  d[33] = dlfeat;
  d.writeUInt32LE(Math.log2(blockSize) << 16, 128); // LBAF0: LBADS
  return d;
}

async function execute(
  ctrlr: NvmeCtrlr,
  type: "admin" | "io",
  cmd: Buffer,
  dataLen: number,
): Promise<{ sc: number; data: Buffer }> {
  const opc = cmd[0] as number;
  const nsid = cmd.readUInt32LE(4);
  const cdw10 = cmd.readUInt32LE(40);
  const none = Buffer.alloc(dataLen);
  const ns = ctrlr.namespaces.find((n) => n.nsid === nsid);
  if (type === "admin" && opc === OPC_IDENTIFY) {
    if ((cdw10 & 0xff) !== 0) return { sc: SC.invalidField, data: none };
    if (!ns) return { sc: SC.invalidNamespace, data: none };
    const id = identifyNamespaceData(
      ns.numBlocks,
      ns.blockSize,
      ctrlr.drive ? (ctrlr.drive.dlfeat ?? DEFAULT_DLFEAT) : 0,
    );
    const data = Buffer.alloc(dataLen);
    id.copy(data, 0, 0, Math.min(dataLen, id.length));
    return { sc: SC.success, data };
  }
  if (type === "io" && opc === OPC_READ) {
    const bdev = ctrlr.bdevs.get(nsid);
    if (!ns || !bdev) return { sc: SC.invalidNamespace, data: none };
    const slba = Number(cmd.readBigUInt64LE(40));
    const blocks = (cmd.readUInt32LE(48) & 0xffff) + 1;
    const length = blocks * ns.blockSize;
    if (length !== dataLen || slba + blocks > ns.numBlocks) return { sc: SC.invalidField, data: none };
    return { sc: SC.success, data: await bdev.init.io.read(slba * ns.blockSize, length) };
  }
  return { sc: SC.invalidOpcode, data: none };
}

/** The bdev_nvme_send_cmd method of `app`. */
export function nvmeSendCmdMethods(app: App): MethodSpec[] {
  return [
    {
      name: "bdev_nvme_send_cmd",
      states: RUNTIME,
      handler: async (req) => {
        const p = v.safeParse(SendCmdSchema, req.params);
        if (!p.success) throw new RpcError(RpcCode.invalidParams, "Invalid argument");
        const cmd = Buffer.from(p.output.cmdbuf, "base64url");
        if (cmd.length !== 64) throw new RpcError(RpcCode.invalidParams, "Invalid argument");
        const ctrlr = app.nvme.get(p.output.name);
        if (!ctrlr) throw new RpcError(RpcCode.invalidParams, "Invalid argument");
        if (p.output.data_direction === "h2c") throw RpcError.errno(Errno.EINVAL);
        const { sc, data } = await execute(ctrlr, p.output.cmd_type, cmd, p.output.data_len ?? 0);
        return {
          cpl: base64url(completion(sc)),
          ...(p.output.data_len ? { data: base64url(data) } : {}),
        };
      },
    },
  ];
}
