// Writes minimal OCI image archives by hand (one uncompressed tar layer, a config, a manifest,
// index.json and oci-layout, all addressed by sha256) and imports them into a node's containerd.
// Used for the lab's pause image and a busybox workload image; deterministic bytes, so cacheable.
import { createHash } from "node:crypto";
import {
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  writeFileSync,
} from "node:fs";
import { dirname, join, relative } from "node:path";
import { cacheRoot } from "./tools.ts";

/** One entry of a layer: paths are relative to the image root ("bin/sh"), without a leading slash. */
export type LayerEntry =
  | { type: "dir"; path: string; mode?: number }
  | { type: "file"; path: string; mode?: number; data: Uint8Array }
  | { type: "symlink"; path: string; target: string };

/** What an image holds: one layer of entries and the runtime config. */
export interface ImageSpec {
  /** The full reference containerd records, e.g. "distort.lab/pause:abc123". */
  ref: string;
  entries: LayerEntry[];
  /** May be empty: then `cmd` (or a Pod's command) is what runs. */
  entrypoint: string[];
  cmd?: string[];
  env?: string[];
  workingDir?: string;
}

/** An archive on disk and the image it names. */
export interface OciArchive {
  path: string;
  ref: string;
  /** sha256:<hex> of the manifest: what containerd shows as the image's digest. */
  manifestDigest: string;
}

const BLOCK = 512;

function octal(n: number, width: number): string {
  return `${n.toString(8).padStart(width - 1, "0")}\0`;
}

function splitName(path: string): { name: string; prefix: string } {
  if (Buffer.byteLength(path) <= 100) return { name: path, prefix: "" };
  const cut = path.lastIndexOf("/", path.length - 2);
  const prefix = path.slice(0, cut);
  const name = path.slice(cut + 1);
  if (cut <= 0 || Buffer.byteLength(prefix) > 155 || Buffer.byteLength(name) > 100) {
    throw new Error(`tar path too long for ustar: ${path}`);
  }
  return { name, prefix };
}

function header(e: { path: string; mode: number; size: number; flag: string; link?: string }): Buffer {
  const h = Buffer.alloc(BLOCK, 0);
  const { name, prefix } = splitName(e.path);
  h.write(name, 0, 100, "utf8");
  h.write(octal(e.mode, 8), 100, 8, "ascii");
  h.write(octal(0, 8), 108, 8, "ascii");
  h.write(octal(0, 8), 116, 8, "ascii");
  h.write(octal(e.size, 12), 124, 12, "ascii");
  h.write(octal(0, 12), 136, 12, "ascii");
  h.write("        ", 148, 8, "ascii");
  h.write(e.flag, 156, 1, "ascii");
  if (e.link) h.write(e.link, 157, 100, "utf8");
  h.write("ustar\0", 257, 6, "ascii");
  h.write("00", 263, 2, "ascii");
  h.write("root", 265, 32, "ascii");
  h.write("root", 297, 32, "ascii");
  h.write(prefix, 345, 155, "utf8");
  let sum = 0;
  for (const b of h) sum += b;
  h.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148, 8, "ascii");
  return h;
}

/**
 * A ustar archive of the entries in the order given, owned by root, mtime 0: the same entries
 * always give the same bytes. Parent directories are not implied; list them.
 */
export function tarArchive(entries: LayerEntry[]): Buffer {
  const parts: Buffer[] = [];
  for (const e of entries) {
    if (e.path.startsWith("/") || e.path === "") throw new Error(`tar path must be relative: '${e.path}'`);
    if (e.type === "dir") {
      const path = e.path.endsWith("/") ? e.path : `${e.path}/`;
      parts.push(header({ path, mode: e.mode ?? 0o755, size: 0, flag: "5" }));
    } else if (e.type === "symlink") {
      parts.push(header({ path: e.path, mode: 0o777, size: 0, flag: "2", link: e.target }));
    } else {
      parts.push(header({ path: e.path, mode: e.mode ?? 0o644, size: e.data.length, flag: "0" }));
      parts.push(Buffer.from(e.data));
      const pad = (BLOCK - (e.data.length % BLOCK)) % BLOCK;
      if (pad) parts.push(Buffer.alloc(pad, 0));
    }
  }
  parts.push(Buffer.alloc(BLOCK * 2, 0));
  return Buffer.concat(parts);
}

/** Every file, directory and symlink under dir as layer entries (prefixed with `under`), sorted. */
export function entriesFromDirectory(dir: string, under = ""): LayerEntry[] {
  const out: LayerEntry[] = [];
  const walk = (abs: string) => {
    for (const name of readdirSync(abs).sort()) {
      const p = join(abs, name);
      const rel = join(under, relative(dir, p));
      const st = lstatSync(p);
      if (st.isSymbolicLink()) out.push({ type: "symlink", path: rel, target: readlinkSync(p) });
      else if (st.isDirectory()) {
        out.push({ type: "dir", path: rel, mode: st.mode & 0o7777 });
        walk(p);
      } else if (st.isFile())
        out.push({ type: "file", path: rel, mode: st.mode & 0o7777, data: readFileSync(p) });
    }
  };
  walk(dir);
  return out;
}

const sha256 = (b: Uint8Array | string) => createHash("sha256").update(b).digest("hex");

/** The archive's bytes: oci-layout, index.json naming `spec.ref`, and three blobs. */
export function buildOciArchive(spec: ImageSpec): { bytes: Buffer; manifestDigest: string } {
  const layer = tarArchive(spec.entries);
  const layerHex = sha256(layer);
  const config = JSON.stringify({
    architecture: "amd64",
    os: "linux",
    config: {
      ...(spec.entrypoint.length ? { Entrypoint: spec.entrypoint } : {}),
      ...(spec.cmd ? { Cmd: spec.cmd } : {}),
      Env: spec.env ?? ["PATH=/bin:/usr/bin:/sbin:/usr/sbin"],
      ...(spec.workingDir ? { WorkingDir: spec.workingDir } : {}),
    },
    rootfs: { type: "layers", diff_ids: [`sha256:${layerHex}`] },
    history: [{ created_by: "distort lab/cluster/oci-image.ts" }],
  });
  const configHex = sha256(config);
  const manifest = JSON.stringify({
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: {
      mediaType: "application/vnd.oci.image.config.v1+json",
      digest: `sha256:${configHex}`,
      size: Buffer.byteLength(config),
    },
    layers: [
      {
        mediaType: "application/vnd.oci.image.layer.v1.tar",
        digest: `sha256:${layerHex}`,
        size: layer.length,
      },
    ],
  });
  const manifestHex = sha256(manifest);
  const index = JSON.stringify({
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.index.v1+json",
    manifests: [
      {
        mediaType: "application/vnd.oci.image.manifest.v1+json",
        digest: `sha256:${manifestHex}`,
        size: Buffer.byteLength(manifest),
        platform: { architecture: "amd64", os: "linux" },
        annotations: { "io.containerd.image.name": spec.ref, "org.opencontainers.image.ref.name": spec.ref },
      },
    ],
  });
  const blob = (hex: string, data: Uint8Array): LayerEntry => ({
    type: "file",
    path: `blobs/sha256/${hex}`,
    data,
  });
  const bytes = tarArchive([
    { type: "file", path: "oci-layout", data: Buffer.from('{"imageLayoutVersion":"1.0.0"}') },
    { type: "file", path: "index.json", data: Buffer.from(index) },
    { type: "dir", path: "blobs" },
    { type: "dir", path: "blobs/sha256" },
    blob(configHex, Buffer.from(config)),
    blob(layerHex, layer),
    blob(manifestHex, Buffer.from(manifest)),
  ]);
  return { bytes, manifestDigest: `sha256:${manifestHex}` };
}

/**
 * Writes the archive to `<cache>/images/<content-hash>/<name>.tar` (content hash of the archive
 * bytes, name the last path part of the ref without its tag) unless it is already there, and
 * returns where it is. Writes through a temporary file, so a reader never sees half an archive.
 */
export function writeOciArchive(spec: ImageSpec, root = cacheRoot()): OciArchive {
  const { bytes, manifestDigest } = buildOciArchive(spec);
  const name = (spec.ref.split("/").pop() ?? spec.ref).split(":")[0] ?? "image";
  const path = join(root, "images", sha256(bytes).slice(0, 32), `${name}.tar`);
  if (!existsSync(path)) {
    mkdirSync(dirname(path), { recursive: true });
    const tmp = `${path}.${process.pid}.tmp`;
    writeFileSync(tmp, bytes);
    renameSync(tmp, path);
  }
  return { path, ref: spec.ref, manifestDigest };
}

/** Debian busybox-static. */
export const BUSYBOX_PATH = "/usr/bin/busybox";

/** The busybox-static binary and the root directories a container runtime expects to find. */
function busyboxBase(busybox: string): LayerEntry[] {
  return [
    ...["bin", "dev", "etc", "proc", "sys", "tmp", "var", "var/run"].map(
      (path): LayerEntry => ({ type: "dir", path, mode: path === "tmp" ? 0o1777 : 0o755 }),
    ),
    { type: "file", path: "bin/busybox", mode: 0o755, data: readFileSync(busybox) },
    { type: "symlink", path: "bin/sh", target: "busybox" },
  ];
}

/**
 * The sandbox (pause) image: busybox's shell as PID 1, sleeping until a TERM or INT makes it exit
 * 0 (a bare `sleep` as PID 1 would ignore TERM: the kernel drops signals PID 1 does not handle).
 * The shell also reaps whatever gets reparented to it.
 */
export function pauseImageSpec(ref: string, busybox = BUSYBOX_PATH): ImageSpec {
  return {
    ref,
    entries: [...busyboxBase(busybox), { type: "symlink", path: "bin/sleep", target: "busybox" }],
    entrypoint: ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 2147483647 & wait $!; done"],
  };
}

/**
 * A workload image: busybox-static with a link for every applet it lists; like the busybox image
 * of Docker Hub, no entrypoint and `sh` as the command, so a Pod's args alone name what runs.
 */
export function busyboxImageSpec(ref: string, busybox = BUSYBOX_PATH): ImageSpec {
  const list = Bun.spawnSync([busybox, "--list"]);
  if (list.exitCode !== 0) throw new Error(`${busybox} --list failed: ${list.stderr.toString()}`);
  const applets = list.stdout
    .toString()
    .split("\n")
    .map((a) => a.trim())
    .filter((a) => a && a !== "busybox" && a !== "sh" && !a.includes("/"))
    .sort();
  return {
    ref,
    entries: [
      ...busyboxBase(busybox),
      ...applets.map((a): LayerEntry => ({ type: "symlink", path: `bin/${a}`, target: "busybox" })),
    ],
    entrypoint: [],
    cmd: ["/bin/sh"],
  };
}

/**
 * Imports an OCI archive into a node's containerd (namespace k8s.io, where the CRI looks) with
 * the node's host-visible socket, unpacking it for the default snapshotter. Throws with ctr's
 * output when the import fails.
 */
export async function importImage(node: { containerdSocket: string }, archivePath: string): Promise<void> {
  const p = Bun.spawn(
    ["ctr", "--address", node.containerdSocket, "-n", "k8s.io", "images", "import", archivePath],
    {
      stdout: "pipe",
      stderr: "pipe",
    },
  );
  const [code, out, err] = await Promise.all([
    p.exited,
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
  ]);
  if (code !== 0) throw new Error(`ctr images import ${archivePath} failed (${code}): ${err || out}`);
}
