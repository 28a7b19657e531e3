// The hand-written OCI archive is a valid image layout: GNU tar lists it, every blob's name is its
// sha256, index -> manifest -> config/layer link up, and the layer holds exactly the entries given.
import { afterAll, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  buildOciArchive,
  busyboxImageSpec,
  entriesFromDirectory,
  type ImageSpec,
  pauseImageSpec,
  tarArchive,
  writeOciArchive,
} from "./oci-image.ts";

const tmp = mkdtempSync(join(tmpdir(), "oci-image-test-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const spec: ImageSpec = {
  ref: "distort.lab/demo:t1",
  entries: [
    { type: "dir", path: "bin" },
    { type: "file", path: "bin/hello", mode: 0o755, data: Buffer.from("#!/bin/sh\necho hi\n") },
    { type: "symlink", path: "bin/hi", target: "hello" },
    { type: "file", path: `${"d".repeat(90)}/${"f".repeat(60)}`, data: Buffer.from("long name") },
  ],
  entrypoint: ["/bin/hello"],
};

function untar(bytes: Uint8Array, into: string): void {
  const p = Bun.spawnSync(["tar", "-xf", "-", "-C", into], { stdin: bytes });
  expect(p.exitCode).toBe(0);
}

test("tar entries come back with GNU tar, long paths included", () => {
  const listing = Bun.spawnSync(["tar", "-tvf", "-"], { stdin: tarArchive(spec.entries) }).stdout.toString();
  expect(listing).toContain("bin/hello");
  expect(listing).toContain("bin/hi -> hello");
  expect(listing).toContain(`${"d".repeat(90)}/${"f".repeat(60)}`);
  expect(listing).toMatch(/^-rwxr-xr-x root\/root\s+18 /m);
});

test("the archive is a linked, content-addressed OCI layout naming the ref", () => {
  const { bytes, manifestDigest } = buildOciArchive(spec);
  const dir = mkdtempSync(join(tmp, "layout-"));
  untar(bytes, dir);
  const blob = (digest: string) => {
    const data = readFileSync(join(dir, "blobs", "sha256", digest.replace("sha256:", "")));
    expect(`sha256:${createHash("sha256").update(data).digest("hex")}`).toBe(digest);
    return data;
  };
  expect(JSON.parse(readFileSync(join(dir, "oci-layout"), "utf8"))).toEqual({ imageLayoutVersion: "1.0.0" });
  const index = JSON.parse(readFileSync(join(dir, "index.json"), "utf8"));
  expect(index.manifests).toHaveLength(1);
  expect(index.manifests[0].digest).toBe(manifestDigest);
  expect(index.manifests[0].annotations["io.containerd.image.name"]).toBe(spec.ref);
  const manifest = JSON.parse(blob(manifestDigest).toString());
  const config = JSON.parse(blob(manifest.config.digest).toString());
  expect(config.config.Entrypoint).toEqual(["/bin/hello"]);
  const layer = blob(manifest.layers[0].digest);
  expect(config.rootfs.diff_ids).toEqual([manifest.layers[0].digest]);
  const root = mkdtempSync(join(tmp, "root-"));
  untar(layer, root);
  expect(readFileSync(join(root, "bin", "hi"), "utf8")).toBe("#!/bin/sh\necho hi\n");
});

test("same spec, same bytes: the cache path is stable and a second write reuses it", () => {
  const a = writeOciArchive(spec, tmp);
  const b = writeOciArchive(spec, tmp);
  expect(a.path).toBe(b.path);
  expect(a.path).toMatch(/images\/[0-9a-f]{32}\/demo\.tar$/);
  const other = writeOciArchive({ ...spec, entrypoint: ["/bin/hi"] }, tmp);
  expect(other.path).not.toBe(a.path);
});

test("a directory becomes sorted entries with modes and symlinks kept", () => {
  const src = mkdtempSync(join(tmp, "src-"));
  mkdirSync(join(src, "etc"));
  writeFileSync(join(src, "etc", "motd"), "hello", { mode: 0o600 });
  symlinkSync("motd", join(src, "etc", "issue"));
  const entries = entriesFromDirectory(src, "opt");
  expect(entries.map((e) => `${e.type} ${e.path}`)).toEqual([
    "dir opt/etc",
    "symlink opt/etc/issue",
    "file opt/etc/motd",
  ]);
  const motd = entries[2]!;
  expect(motd.type === "file" && motd.mode === 0o600 && Buffer.from(motd.data).toString() === "hello").toBe(
    true,
  );
});

test("the workload image has no entrypoint, sh as its command, and busybox's applets", () => {
  const { bytes, manifestDigest } = buildOciArchive(busyboxImageSpec("distort.lab/workload:t1"));
  const dir = mkdtempSync(join(tmp, "workload-"));
  untar(bytes, dir);
  const blob = (d: string) => readFileSync(join(dir, "blobs", "sha256", d.replace("sha256:", "")), "utf8");
  const config = JSON.parse(blob(JSON.parse(blob(manifestDigest)).config.digest));
  expect(config.config.Entrypoint).toBeUndefined();
  expect(config.config.Cmd).toEqual(["/bin/sh"]);
  const spec = busyboxImageSpec("distort.lab/workload:t1");
  for (const applet of ["bin/sleep", "bin/wget", "bin/nc", "bin/httpd", "bin/timeout"]) {
    expect(spec.entries.some((e) => e.path === applet && e.type === "symlink")).toBe(true);
  }
});

test("the pause image runs busybox's shell as PID 1 with a TERM trap", () => {
  const pause = pauseImageSpec("distort.lab/pause:t1");
  expect(pause.entrypoint[0]).toBe("/bin/sh");
  expect(pause.entrypoint.join(" ")).toContain("trap 'exit 0' TERM");
  expect(pause.entries.map((e) => e.path)).toContain("bin/busybox");
});
