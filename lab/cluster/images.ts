// Builds the lab's images from images/*.Containerfile with no daemon and no registry: a Debian base
// from mmdebstrap, the binaries from `bun build --compile`, buildah (vfs, chroot) to assemble and
// write OCI archives, all cached by content; and imports an archive into a node's containerd.
// Run `bun lab/cluster/images.ts [name...]` to build (or find cached) images and print what it did;
// `--prune[=days]` removes cache entries unused for that long (default 7).
import { createHash } from "node:crypto";
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  utimesSync,
  writeFileSync,
} from "node:fs";
import { dirname, join } from "node:path";
import {
  archiveRef,
  BASE_DPKG_OPTIONS,
  BASE_PACKAGES,
  BASE_SUITE,
  BINARIES,
  type BinaryName,
  BUN_COMPILE_FLAGS,
  BUNDLE_COMMON_FILES,
  baseKey,
  binaryKey,
  combinedKey,
  compileEntries,
  type FileDigest,
  IMAGE_NAMES,
  IMAGES,
  type ImageName,
  type ImageSpec,
  imageKey,
  imageRef,
  imageTag,
  LAB_REGISTRY,
  underSources,
} from "./image-plan.ts";
import { cacheRoot, ensureSidecars, type SidecarPaths, sidecarPaths } from "./tools.ts";

/** One built image: what the lab imports and what Pods name. */
export interface LabImage {
  readonly name: ImageName;
  /** `distort.lab/<name>:<tag>`: the name Pods use once imported. */
  readonly ref: string;
  /** The OCI archive, `<cache>/images/<key>/<name>.tar`. */
  readonly archive: string;
  /** The name stored inside the archive (tied to its content); importArchive retags it to `ref`. */
  readonly archiveRef: string;
  /** Content key of the archive. */
  readonly key: string;
  /** False when the archive came from the cache. */
  readonly built: boolean;
  /** Archive size in bytes. */
  readonly bytes: number;
  /** The image manifest's digest (`sha256:...`): what containerd's image points at once imported. */
  readonly digest: string;
}

/** One timed step of a build (for the lab's start-up note and the script's output). */
export interface BuildStep {
  readonly what: string;
  readonly ms: number;
}

export interface BuiltImages {
  readonly tag: string;
  readonly images: Readonly<Partial<Record<ImageName, LabImage>>>;
  /** Steps that did work (mmdebstrap, each compile, each image build); empty on a warm cache. */
  readonly steps: readonly BuildStep[];
  /** Time spent in buildImages, hashing included. */
  readonly totalMs: number;
}

export interface BuildImagesOptions {
  /** The tag; by default from git: the short commit, `-dirty-<content hash>` for a dirty tree. */
  tag?: string;
  /** Progress lines for a person watching; silent by default. */
  progress?: (line: string) => void;
  /** Only these images (default: all of IMAGE_NAMES). */
  names?: readonly ImageName[];
  /** The tool cache root (default lab/cluster/tools.ts cacheRoot()). */
  cache?: string;
  /** The repository root (default: this checkout). */
  repo?: string;
}

const REPO = join(import.meta.dir, "..", "..");
const ARCH = "x64";
const BUSYBOX = "/bin/busybox";
const PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** The cache directories images.ts uses under the tool cache root; pure path arithmetic. */
export function imageCachePaths(root = cacheRoot()) {
  const images = join(root, "images");
  const buildah = join(root, "buildah");
  return {
    images,
    base: (key: string) => join(images, `base-${key}.tar`),
    binaryDir: (key: string) => join(images, "bin", key),
    busyboxDir: (sha: string) => join(images, "busybox", sha.slice(0, 16)),
    archive: (key: string, name: ImageName) => join(images, key, `${name}.tar`),
    lock: join(images, ".lock"),
    buildahRoot: join(buildah, "root"),
    buildahRunroot: join(buildah, "runroot"),
    buildahVarLib: join(buildah, "var-lib"),
    tmp: join(buildah, "tmp"),
  };
}

type CachePaths = ReturnType<typeof imageCachePaths>;

/** Runs a command to completion; throws with its output on a non-zero exit. */
async function run(
  argv: string[],
  opts: { cwd?: string; env?: Record<string, string>; what?: string } = {},
): Promise<string> {
  const proc = Bun.spawn(argv, {
    cwd: opts.cwd,
    env: { ...process.env, ...opts.env },
    stdout: "pipe",
    stderr: "pipe",
  });
  const [out, err, code] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
    proc.exited,
  ]);
  if (code !== 0) {
    const tail = `${out}\n${err}`.trim().split("\n").slice(-30).join("\n");
    throw new Error(`${opts.what ?? argv.slice(0, 3).join(" ")} failed (exit ${code}):\n${tail}`);
  }
  return out;
}

async function timed<T>(steps: BuildStep[], what: string, fn: () => Promise<T>): Promise<T> {
  const t0 = performance.now();
  const v = await fn();
  steps.push({ what, ms: Math.round(performance.now() - t0) });
  return v;
}

/** The repository's files that bundles can read (tracked and untracked-but-not-ignored), with content digests. */
async function sourceDigests(repo: string): Promise<FileDigest[]> {
  const listed = await run([
    "git",
    "-C",
    repo,
    "ls-files",
    "-z",
    "--cached",
    "--others",
    "--exclude-standard",
  ]);
  const wanted = new Set<string>(BUNDLE_COMMON_FILES);
  const sources = [...new Set(Object.values(BINARIES).flatMap((b) => b.sources))];
  const out: FileDigest[] = [];
  for (const path of new Set(listed.split("\0").filter((p) => p !== ""))) {
    if (!wanted.has(path) && !underSources(path, sources)) continue;
    const full = join(repo, path);
    // A tracked file deleted in the work tree is not there to bundle.
    if (!existsSync(full) || !statSync(full).isFile()) continue;
    out.push({ path, sha256: createHash("sha256").update(readFileSync(full)).digest("hex") });
  }
  return out;
}

/** The default tag from git: short commit, `-dirty-<combined image key>` when anything is uncommitted. */
async function gitTag(repo: string, contentHash: string): Promise<string> {
  const short = (await run(["git", "-C", repo, "rev-parse", "--short=12", "HEAD"])).trim();
  const status = await run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=normal"]);
  return imageTag(short, status.trim() !== "", contentHash);
}

function sidecarBinary(paths: SidecarPaths, spec: ImageSpec): string {
  if (!spec.sidecar) throw new Error(`${spec.name} is not a sidecar image`);
  return paths[spec.sidecar];
}

/** Identity of a sidecar binary without reading 60 MB: its versioned path, size and mtime. */
function sidecarIdentity(path: string): string {
  if (!existsSync(path)) return `missing:${path}`;
  const st = statSync(path);
  return `${path}:${st.size}:${Math.floor(st.mtimeMs)}`;
}

/**
 * Holds an exclusive lock on the image cache (a directory with the holder's PID) while `fn` runs,
 * so two labs building at once do not race on buildah names; a lock whose holder is dead is taken over.
 */
async function withLock<T>(lock: string, fn: () => Promise<T>, progress: (l: string) => void): Promise<T> {
  let said = false;
  mkdirSync(dirname(lock), { recursive: true });
  for (;;) {
    try {
      mkdirSync(lock);
      writeFileSync(join(lock, "pid"), String(process.pid));
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
      let holder = Number.NaN;
      try {
        holder = Number(readFileSync(join(lock, "pid"), "utf8"));
      } catch {
        // being created or removed right now
      }
      if (Number.isInteger(holder) && !alive(holder)) {
        rmSync(lock, { recursive: true, force: true });
        continue;
      }
      if (!said) progress(`waiting for the image cache lock held by PID ${holder}`);
      said = true;
      await Bun.sleep(500);
    }
  }
  try {
    return await fn();
  } finally {
    rmSync(lock, { recursive: true, force: true });
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * buildah with the lab's own storage (vfs, under the cache), in a private mount namespace whose
 * /var/lib is a directory of the cache: buildah (containers/image) keeps a blob-info cache at
 * /var/lib/containers/cache for root whatever --root says, and its build mounts die with it.
 */
function buildahArgv(paths: CachePaths, ...args: string[]): string[] {
  return [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "sh",
    "-c",
    'mount --bind "$0" /var/lib && exec buildah "$@"',
    paths.buildahVarLib,
    "--root",
    paths.buildahRoot,
    "--runroot",
    paths.buildahRunroot,
    "--storage-driver",
    "vfs",
    ...args,
  ];
}

function buildahEnv(paths: CachePaths): Record<string, string> {
  return { TMPDIR: paths.tmp, BUILDAH_ISOLATION: "chroot" };
}

async function buildahHas(paths: CachePaths, ref: string): Promise<boolean> {
  const proc = Bun.spawn(
    buildahArgv(paths, "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref),
    {
      env: { ...process.env, ...buildahEnv(paths) },
      stdout: "ignore",
      stderr: "ignore",
    },
  );
  return (await proc.exited) === 0;
}

/** Writes with a partial name and renames, so an interrupted build never leaves a cache entry. */
function partialOf(path: string): string {
  return join(dirname(path), `.${process.pid}.partial-${path.split("/").pop()}`);
}

async function ensureBaseTar(paths: CachePaths, key: string, steps: BuildStep[], say: (l: string) => void) {
  const tar = paths.base(key);
  if (existsSync(tar)) return tar;
  mkdirSync(dirname(tar), { recursive: true });
  const partial = partialOf(tar);
  say(`mmdebstrap: Debian ${BASE_SUITE} minbase with ${BASE_PACKAGES.join(" ")}`);
  await timed(steps, "mmdebstrap base", () =>
    run(
      [
        "mmdebstrap",
        "--variant=minbase",
        `--include=${BASE_PACKAGES.join(",")}`,
        ...BASE_DPKG_OPTIONS.map((o) => `--dpkgopt=${o}`),
        "--format=tar",
        BASE_SUITE,
        partial,
        // The machine's own apt sources: the mirror apt already uses here.
        ...debianSources(),
      ],
      { what: "mmdebstrap" },
    ),
  );
  renameSync(partial, tar);
  say(`base root filesystem: ${mib(statSync(tar).size)} at ${tar}`);
  return tar;
}

function debianSources(): string[] {
  for (const f of ["/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"]) {
    if (existsSync(f) && readFileSync(f, "utf8").trim() !== "") return [f];
  }
  return [];
}

/** The base as `distort.lab/base:<key>` in buildah's storage, imported from the cached tar if absent. */
async function ensureBaseImage(paths: CachePaths, key: string, steps: BuildStep[], say: (l: string) => void) {
  const ref = `${LAB_REGISTRY}/base:${key}`;
  if (await buildahHas(paths, ref)) return ref;
  const tar = await ensureBaseTar(paths, key, steps, say);
  const env = buildahEnv(paths);
  await timed(steps, "buildah import base", async () => {
    const ctr = (await run(buildahArgv(paths, "from", "--pull=never", "scratch"), { env })).trim();
    try {
      await run(buildahArgv(paths, "add", ctr, tar, "/"), { env, what: "buildah add base" });
      await run(buildahArgv(paths, "config", "--env", `PATH=${PATH_ENV}`, ctr), { env });
      await run(buildahArgv(paths, "commit", "-q", ctr, ref), { env, what: "buildah commit base" });
    } finally {
      await run(buildahArgv(paths, "rm", ctr), { env }).catch(() => {});
    }
  });
  say(`base image ${ref} in buildah storage`);
  return ref;
}

async function ensureBinary(
  repo: string,
  paths: CachePaths,
  name: BinaryName,
  key: string,
  steps: BuildStep[],
  say: (l: string) => void,
): Promise<string> {
  const dir = paths.binaryDir(key);
  if (existsSync(join(dir, "out", name))) return dir;
  const partial = partialOf(dir);
  rmSync(partial, { recursive: true, force: true });
  mkdirSync(join(partial, "out"), { recursive: true });
  const spec = BINARIES[name];
  await timed(steps, `bun compile ${name}`, () =>
    run(
      [
        process.execPath,
        ...BUN_COMPILE_FLAGS,
        `--target=bun-linux-${ARCH}`,
        ...compileEntries(spec),
        "--outfile",
        join(partial, "out", name),
      ],
      { cwd: repo, what: `bun build --compile ${compileEntries(spec).join(" ")}` },
    ),
  );
  rmSync(dir, { recursive: true, force: true });
  renameSync(partial, dir);
  say(`compiled ${name} (${mib(statSync(join(dir, "out", name)).size)})`);
  return dir;
}

function ensureBusybox(paths: CachePaths, sha: string): string {
  const dir = paths.busyboxDir(sha);
  if (existsSync(join(dir, "bin", "busybox"))) return dir;
  const partial = partialOf(dir);
  rmSync(partial, { recursive: true, force: true });
  mkdirSync(join(partial, "bin"), { recursive: true });
  writeFileSync(join(partial, "bin", "busybox"), readFileSync(BUSYBOX), { mode: 0o755 });
  rmSync(dir, { recursive: true, force: true });
  renameSync(partial, dir);
  return dir;
}

function mib(bytes: number): string {
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

/**
 * Builds every requested image whose archive is not cached, and returns them all by name.
 * Keys are content hashes (Containerfile, bundled sources, bun and buildah versions, base package
 * list, sidecar binaries), so a warm cache does no build at all and any tag reuses the archives.
 * Needs root (mmdebstrap, buildah chroot), busybox-static and, for sidecar images, the sidecar
 * binaries (lab/cluster/tools.ts ensureSidecars). Serialised across processes by a lock in the cache.
 * Throws if a build fails; what finished before stays cached.
 */
export async function buildImages(opts: BuildImagesOptions = {}): Promise<BuiltImages> {
  const t0 = performance.now();
  const say = opts.progress ?? (() => {});
  const repo = opts.repo ?? REPO;
  const paths = imageCachePaths(opts.cache ?? cacheRoot());
  const names = opts.names ?? IMAGE_NAMES;
  const steps: BuildStep[] = [];
  let sidecars = sidecarPaths(opts.cache ?? cacheRoot());
  const wantsSidecar = names.some(
    (n) => IMAGES[n].sidecar && !existsSync(sidecarBinary(sidecars, IMAGES[n])),
  );
  // A fresh machine builds the Go sidecars first (minutes; build-sidecars.sh); a warm one has them.
  if (wantsSidecar)
    sidecars = await timed(steps, "sidecar binaries", () => ensureSidecars(opts.cache ?? cacheRoot()));

  const [files, builder] = await Promise.all([
    sourceDigests(repo),
    run(["buildah", "--version"]).then((s) => s.trim()),
  ]);
  const binaryKeys = Object.fromEntries(
    (Object.keys(BINARIES) as BinaryName[]).map((b) => [b, binaryKey(b, files, Bun.version, ARCH)]),
  ) as Record<BinaryName, string>;
  const bKey = baseKey();
  const busyboxSha = existsSync(BUSYBOX)
    ? createHash("sha256").update(readFileSync(BUSYBOX)).digest("hex")
    : "missing";
  const keys: Partial<Record<ImageName, string>> = {};
  for (const name of IMAGE_NAMES) {
    const spec = IMAGES[name];
    keys[name] = imageKey(spec, {
      containerfile: readFileSync(join(repo, spec.containerfile), "utf8"),
      baseKey: bKey,
      binaryKeys,
      busybox: busyboxSha,
      sidecar: spec.sidecar ? sidecarIdentity(sidecarBinary(sidecars, spec)) : "",
      builder,
    });
  }
  const tag = opts.tag ?? (await gitTag(repo, combinedKey(keys)));
  const missing = names.filter((n) => !existsSync(paths.archive(keys[n] as string, n)));
  if (missing.length > 0) {
    await withLock(
      paths.lock,
      async () => {
        mkdirSync(paths.tmp, { recursive: true });
        mkdirSync(paths.buildahVarLib, { recursive: true });
        let baseRef: string | undefined;
        for (const name of missing) {
          const key = keys[name] as string;
          const archive = paths.archive(key, name);
          if (existsSync(archive)) continue; // another process built it while this one waited
          const spec = IMAGES[name];
          const needsBase = Object.values(spec.contexts).some((c) => c.kind === "base");
          if (needsBase && baseRef === undefined) baseRef = await ensureBaseImage(paths, bKey, steps, say);
          await buildOne(repo, paths, spec, key, archive, {
            baseRef,
            binaryDir: (b) => ensureBinary(repo, paths, b, binaryKeys[b], steps, say),
            busyboxDir: () => {
              if (busyboxSha === "missing") throw new Error(`${BUSYBOX} is missing: install busybox-static`);
              return ensureBusybox(paths, busyboxSha);
            },
            sidecarDir: () => {
              const bin = sidecarBinary(sidecars, spec);
              if (!existsSync(bin)) throw new Error(`${bin} is missing: run lab/cluster/build-sidecars.sh`);
              return dirname(bin);
            },
            steps,
            say,
          });
        }
      },
      say,
    );
  }
  const images: Partial<Record<ImageName, LabImage>> = {};
  for (const name of names) {
    const key = keys[name] as string;
    const archive = paths.archive(key, name);
    images[name] = {
      name,
      ref: imageRef(name, tag),
      archive,
      archiveRef: archiveRef(name, key),
      key,
      built: missing.includes(name),
      bytes: statSync(archive).size,
      digest: await manifestDigest(archive),
    };
    // The directory's mtime records the last use, which pruneImageCache goes by.
    const now = new Date();
    utimesSync(dirname(archive), now, now);
  }
  return { tag, images, steps, totalMs: Math.round(performance.now() - t0) };
}

/**
 * Removes what buildImages left in the cache and has not used for `olderThanDays`: archive
 * directories (their mtime is their last use), compiled binaries, busybox copies and base tars
 * of other keys. Only names of the forms buildImages writes are touched, so other files in the
 * images directory survive. Returns the removed paths. Safe while another lab runs: what it still
 * uses was touched recently, and a removed entry is rebuilt when next needed.
 */
export function pruneImageCache(opts: { cache?: string; olderThanDays?: number } = {}): string[] {
  const paths = imageCachePaths(opts.cache ?? cacheRoot());
  const cutoff = Date.now() - (opts.olderThanDays ?? 7) * 86_400_000;
  const current = paths.base(baseKey());
  const removed: string[] = [];
  const sweep = (dir: string, pattern: RegExp) => {
    if (!existsSync(dir)) return;
    for (const entry of readdirSync(dir)) {
      const p = join(dir, entry);
      if (!pattern.test(entry) || p === current || statSync(p).mtimeMs >= cutoff) continue;
      rmSync(p, { recursive: true, force: true });
      removed.push(p);
    }
  };
  sweep(paths.images, /^[0-9a-f]{24}$/);
  sweep(paths.images, /^base-[0-9a-f]{16}\.tar$/);
  sweep(join(paths.images, "bin"), /^[0-9a-f]{24}$/);
  sweep(join(paths.images, "busybox"), /^[0-9a-f]{16}$/);
  return removed;
}

interface BuildDeps {
  baseRef: string | undefined;
  binaryDir(b: BinaryName): Promise<string>;
  busyboxDir(): string;
  sidecarDir(): string;
  steps: BuildStep[];
  say: (l: string) => void;
}

/** One `buildah bud` of a Containerfile target and a push to an OCI archive. */
async function buildOne(
  repo: string,
  paths: CachePaths,
  spec: ImageSpec,
  key: string,
  archive: string,
  deps: BuildDeps,
): Promise<void> {
  const args: string[] = [];
  for (const [ctx, src] of Object.entries(spec.contexts)) {
    let value: string;
    if (src.kind === "busybox") value = deps.busyboxDir();
    else if (src.kind === "binary") value = await deps.binaryDir(src.binary);
    else if (deps.baseRef) value = `container-image://${deps.baseRef}`;
    else throw new Error(`${spec.name}: the base image is not ready`);
    args.push("--build-context", `${ctx}=${value}`);
  }
  const contextDir = spec.sidecar ? deps.sidecarDir() : repo;
  const ref = archiveRef(spec.name, key);
  const env = buildahEnv(paths);
  await timed(deps.steps, `buildah build ${spec.name}`, async () => {
    await run(
      buildahArgv(
        paths,
        "bud",
        "--isolation",
        "chroot",
        "--pull=never",
        "--layers=false",
        "-f",
        join(repo, spec.containerfile),
        "--target",
        spec.target,
        ...args,
        "-t",
        ref,
        contextDir,
      ),
      { env, what: `buildah bud ${spec.containerfile} --target ${spec.target}` },
    );
    mkdirSync(dirname(archive), { recursive: true });
    const partial = partialOf(archive);
    try {
      // zstd at level 1 writes several times faster than buildah's default gzip; containerd 1.6 reads it.
      const compress = ["--compression-format", "zstd", "--compression-level", "1"];
      await run(buildahArgv(paths, "push", "-q", ...compress, ref, `oci-archive:${partial}:${ref}`), {
        env,
        what: `buildah push ${ref}`,
      });
      writeFileSync(digestFile(archive), await readManifestDigest(partial));
      renameSync(partial, archive);
    } finally {
      rmSync(partial, { force: true });
      // The archive is the cache; buildah's copies (full vfs trees) only cost disk. buildah 1.28
      // leaves a working container behind for a stage without instructions: remove every
      // container (this storage is the lab's own, and the cache lock is held).
      await run(buildahArgv(paths, "rm", "--all"), { env }).catch(() => {});
      await run(buildahArgv(paths, "rmi", ref), { env }).catch(() => {});
    }
  });
  deps.say(`built ${spec.name} (${mib(statSync(archive).size)})`);
}

function digestFile(archive: string): string {
  return archive.replace(/\.tar$/, ".digest");
}

/** The manifest digest an OCI archive's index.json names (reads the whole tar: seconds). */
async function readManifestDigest(archive: string): Promise<string> {
  const index = JSON.parse(await run(["tar", "-xOf", archive, "index.json"], { what: `reading ${archive}` }));
  const digest = index?.manifests?.[0]?.digest;
  if (typeof digest !== "string" || !digest.startsWith("sha256:"))
    throw new Error(`${archive}: no manifest digest`);
  return digest;
}

/** The digest recorded beside the archive when it was built (read from the archive if absent). */
async function manifestDigest(archive: string): Promise<string> {
  const f = digestFile(archive);
  if (existsSync(f)) return readFileSync(f, "utf8").trim();
  const d = await readManifestDigest(archive);
  writeFileSync(f, d);
  return d;
}

/** `ctr --address <sock> -n <namespace>` argv prefix. */
function ctrArgv(address: string, namespace: string, ...args: string[]): string[] {
  return ["ctr", "--address", address, "-n", namespace, ...args];
}

/**
 * Imports an image's archive into the containerd at `ctrAddress` (namespace k8s.io, where the CRI
 * looks) and names it exactly `image.ref`; the content-tied name inside the archive is dropped
 * again. Unpacks into containerd's default snapshotter. Returns "present" without importing when
 * `image.ref` already points at the archive's manifest (a warm node). Idempotent: importing twice
 * leaves one image. Throws with ctr's output on failure, or if the ref ends up elsewhere.
 */
export async function importArchive(
  ctrAddress: string,
  image: Pick<LabImage, "ref" | "archive" | "archiveRef" | "digest">,
  opts: { namespace?: string } = {},
): Promise<"imported" | "present"> {
  const ns = opts.namespace ?? "k8s.io";
  if ((await imageDigest(ctrAddress, ns, image.ref)) === image.digest) return "present";
  const baseName = image.archiveRef.slice(0, image.archiveRef.lastIndexOf(":"));
  await run(ctrArgv(ctrAddress, ns, "images", "import", "--base-name", baseName, image.archive), {
    what: `ctr images import ${image.archive}`,
  });
  if (image.ref !== image.archiveRef) {
    await run(ctrArgv(ctrAddress, ns, "images", "tag", "--force", image.archiveRef, image.ref), {
      what: `ctr images tag ${image.ref}`,
    });
    await run(ctrArgv(ctrAddress, ns, "images", "rm", image.archiveRef), {
      what: `ctr images rm ${image.archiveRef}`,
    });
  }
  const now = await imageDigest(ctrAddress, ns, image.ref);
  if (now !== image.digest)
    throw new Error(`${image.ref} points at ${now ?? "nothing"} after import, not ${image.digest}`);
  return "imported";
}

/** The manifest digest containerd's image `ref` points at, or undefined when there is no such image. */
async function imageDigest(address: string, ns: string, ref: string): Promise<string | undefined> {
  const out = await run(ctrArgv(address, ns, "images", "ls", `name==${ref}`), { what: "ctr images ls" });
  // REF TYPE DIGEST SIZE PLATFORMS LABELS, one row per image after the header.
  for (const line of out.split("\n").slice(1)) {
    const [name, , digest] = line.trim().split(/\s+/);
    if (name === ref) return digest;
  }
  return undefined;
}

/**
 * Imports every image into one containerd, one after another (importArchive each); returns how
 * many were imported and how many were there already. For several nodes, call it per node concurrently.
 */
export async function importAll(
  ctrAddress: string,
  images: Iterable<LabImage | undefined>,
  opts: { namespace?: string } = {},
): Promise<{ imported: number; present: number }> {
  let imported = 0;
  let present = 0;
  for (const img of images) {
    if (!img) continue;
    if ((await importArchive(ctrAddress, img, opts)) === "present") present++;
    else imported++;
  }
  return { imported, present };
}

if (import.meta.main) {
  const prune = process.argv.slice(2).find((a) => /^--prune(=\d+)?$/.test(a));
  if (prune) {
    const days = prune.includes("=") ? Number(prune.split("=")[1]) : 7;
    for (const p of pruneImageCache({ olderThanDays: days })) process.stdout.write(`removed ${p}\n`);
    process.exit(0);
  }
  const names = process.argv.slice(2);
  const unknown = names.filter((n) => !(IMAGE_NAMES as readonly string[]).includes(n));
  if (unknown.length > 0) {
    process.stderr.write(`unknown image ${unknown.join(", ")}; images: ${IMAGE_NAMES.join(" ")}\n`);
    process.exit(2);
  }
  const progress = (l: string) => process.stderr.write(`[images] ${l}\n`);
  const result = await buildImages({
    progress,
    ...(names.length > 0 ? { names: names as ImageName[] } : {}),
  });
  for (const s of result.steps)
    process.stdout.write(`step  ${(s.ms / 1000).toFixed(1).padStart(6)} s  ${s.what}\n`);
  for (const img of Object.values(result.images)) {
    if (!img) continue;
    process.stdout.write(
      `${img.built ? "built " : "cached"}  ${mib(img.bytes).padStart(10)}  ${img.ref}  ${img.archive}\n`,
    );
  }
  process.stdout.write(
    `tag ${result.tag}; ${result.steps.length} build steps; ${(result.totalMs / 1000).toFixed(1)} s\n`,
  );
}
