// bdev_nvme_send_cmd on the emulator: Identify Namespace carries the drive's size, block size and
// DLFEAT; an I/O Read returns the drive's bytes; replies are base64url with padding, as SPDK's
// encoder writes them; unknown controllers and malformed command buffers are refused like SPDK.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { closeSync, mkdirSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { base64url } from "./methods/nvme-send-cmd.ts";
import { call, rpc } from "./raw-rpc-client.ts";

const MIB = 1024 * 1024;
let root: string;
let emu: SpdkEmulator;
let s: string;

function sqe(opc: number, nsid: number, cdw10 = 0, cdw11 = 0, cdw12 = 0): string {
  const b = Buffer.alloc(64);
  b[0] = opc;
  b.writeUInt32LE(nsid, 4);
  b.writeUInt32LE(cdw10, 40);
  b.writeUInt32LE(cdw11, 44);
  b.writeUInt32LE(cdw12, 48);
  return base64url(b);
}

const status = (cpl: string) => Buffer.from(cpl, "base64url").readUInt16LE(14) >> 1;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-send-cmd-"));
  const dataDir = join(root, "data");
  mkdirSync(join(dataDir, "drives"), { recursive: true });
  // Bytes at 1 MiB + 4 KiB on the drive that the Read below must return.
  const fd = openSync(join(dataDir, "drives", "0000_3b_00.0.img"), "w");
  writeSync(fd, Buffer.alloc(8192, 0x5a), 0, 8192, MIB + 4096);
  closeSync(fd);
  emu = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "spdk.sock"),
    dataDir,
    drives: [
      { pciAddress: "0000:3b:00.0", serial: "SEND0001", model: "Sim NVMe", sizeBytes: 64 * MIB },
      {
        pciAddress: "0000:3c:00.0",
        serial: "SEND0002",
        model: "Sim NVMe",
        sizeBytes: 64 * MIB,
        dlfeat: 0,
        blockSize: 512,
      },
    ],
  });
  s = emu.socketPath;
  await call(s, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: "3b:00.0" });
  await call(s, "bdev_nvme_attach_controller", { name: "Nvme1", trtype: "PCIe", traddr: "3c:00.0" });
});

afterAll(async () => {
  await emu.close();
  rmSync(root, { recursive: true, force: true });
});

test("Identify Namespace: size, LBA format and DLFEAT of each drive", async () => {
  for (const [name, blockSize, dlfeat] of [
    ["Nvme0", 4096, 0x09],
    ["Nvme1", 512, 0x00],
  ] as const) {
    const r = (await call(s, "bdev_nvme_send_cmd", {
      name,
      cmd_type: "admin",
      data_direction: "c2h",
      cmdbuf: sqe(0x06, 1, 0),
      data_len: 4096,
    })) as { cpl: string; data: string };
    expect(status(r.cpl)).toBe(0);
    expect(r.cpl.endsWith("==")).toBe(true); // 16 bytes: padded like spdk_base64_urlsafe_encode
    const d = Buffer.from(r.data, "base64url");
    expect(d.length).toBe(4096);
    expect(Number(d.readBigUInt64LE(0))).toBe((64 * MIB) / blockSize);
    expect(2 ** ((d.readUInt32LE(128) >>> 16) & 0xff)).toBe(blockSize);
    expect(d[33]).toBe(dlfeat);
  }
});

test("Read returns the drive's bytes; a wrong length or namespace completes with an error status", async () => {
  const read = (cmdbuf: string, data_len: number) =>
    call(s, "bdev_nvme_send_cmd", {
      name: "Nvme0",
      cmd_type: "io",
      data_direction: "c2h",
      cmdbuf,
      data_len,
    }) as Promise<{
      cpl: string;
      data: string;
    }>;
  const ok = await read(sqe(0x02, 1, MIB / 4096, 0, 3), 4 * 4096);
  expect(status(ok.cpl)).toBe(0);
  const bytes = Buffer.from(ok.data, "base64url");
  expect(bytes.subarray(0, 4096).equals(Buffer.alloc(4096))).toBe(true);
  expect(bytes.subarray(4096, 12288).equals(Buffer.alloc(8192, 0x5a))).toBe(true);
  expect(status((await read(sqe(0x02, 1, 0, 0, 3), 4096)).cpl)).toBe(0x02);
  expect(status((await read(sqe(0x02, 9, 0, 0, 0), 4096)).cpl)).toBe(0x0b);
  expect(status((await read(sqe(0x7f, 1, 0, 0, 0), 4096)).cpl)).toBe(0x01);
});

test("an unknown controller or a short command buffer is -32602 Invalid argument", async () => {
  for (const params of [
    { name: "NoSuch", cmd_type: "admin", data_direction: "c2h", cmdbuf: sqe(0x06, 1), data_len: 4096 },
    {
      name: "Nvme0",
      cmd_type: "admin",
      data_direction: "c2h",
      cmdbuf: base64url(Buffer.alloc(16)),
      data_len: 4096,
    },
    { name: "Nvme0", cmd_type: "vendor", data_direction: "c2h", cmdbuf: sqe(0x06, 1), data_len: 4096 },
  ]) {
    const r = await rpc(s, "bdev_nvme_send_cmd", params);
    expect(r.error).toEqual({ code: -32602, message: "Invalid argument" });
  }
});
