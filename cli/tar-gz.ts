// A minimal writer of gzip-compressed ustar archives (regular files only), so the compiled plugin
// needs no tar binary on the operator's machine. POSIX ustar: 512-byte headers, octal fields,
// names over 100 bytes split into prefix and name at a "/".
import { gzipSync } from "node:zlib";

/** One file of the archive: a relative path with "/" separators, and its content. */
export interface ArchiveFile {
  readonly path: string;
  readonly data: string | Uint8Array;
}

const BLOCK = 512;

function octal(n: number, width: number): string {
  return `${n.toString(8).padStart(width - 1, "0")}\0`;
}

function splitName(path: string): { name: string; prefix: string } {
  const bytes = Buffer.byteLength(path);
  if (bytes <= 100) return { name: path, prefix: "" };
  for (let i = path.indexOf("/"); i !== -1; i = path.indexOf("/", i + 1)) {
    const prefix = path.slice(0, i);
    const name = path.slice(i + 1);
    if (Buffer.byteLength(prefix) <= 155 && Buffer.byteLength(name) <= 100) return { name, prefix };
  }
  throw new Error(`path too long for a ustar archive: ${path}`);
}

function header(path: string, size: number, mtime: number): Buffer {
  const h = Buffer.alloc(BLOCK, 0);
  const { name, prefix } = splitName(path);
  h.write(name, 0, 100, "utf8");
  h.write(octal(0o644, 8), 100, "ascii");
  h.write(octal(0, 8), 108, "ascii");
  h.write(octal(0, 8), 116, "ascii");
  h.write(octal(size, 12), 124, "ascii");
  h.write(octal(mtime, 12), 136, "ascii");
  h.write("        ", 148, "ascii");
  h.write("0", 156, "ascii");
  h.write("ustar\0", 257, "ascii");
  h.write("00", 263, "ascii");
  h.write(prefix, 345, 155, "utf8");
  let sum = 0;
  for (const b of h) sum += b;
  h.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148, "ascii");
  return h;
}

/** The gzip-compressed ustar archive of `files` (mode 0644, owner 0, mtime `mtime` seconds). Pure. */
export function tarGz(files: readonly ArchiveFile[], mtime: number): Uint8Array {
  const parts: Buffer[] = [];
  for (const f of files) {
    const data = typeof f.data === "string" ? Buffer.from(f.data, "utf8") : Buffer.from(f.data);
    parts.push(header(f.path, data.length, mtime), data);
    const pad = (BLOCK - (data.length % BLOCK)) % BLOCK;
    if (pad) parts.push(Buffer.alloc(pad, 0));
  }
  parts.push(Buffer.alloc(BLOCK * 2, 0));
  return gzipSync(Buffer.concat(parts));
}
