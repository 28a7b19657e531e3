// What the lab's images are made of, and the content keys and tag that name them: pure data and
// hashing, no process or build. lab/cluster/images.ts runs the builds this plan describes.
import { createHash } from "node:crypto";

/** Every image the lab builds; each becomes `distort.lab/<name>:<tag>`. */
export const IMAGE_NAMES = [
  "manager",
  "agent",
  "agent-lab",
  "csi",
  "csi-lab",
  "dpu",
  "workload",
  "csi-provisioner",
  "csi-attacher",
  "csi-resizer",
  "csi-snapshotter",
  "snapshot-controller",
  "csi-snapshot-metadata",
] as const;
export type ImageName = (typeof IMAGE_NAMES)[number];

/** The repository every lab image is named under. */
export const LAB_REGISTRY = "distort.lab";

/** The executables `bun build --compile` makes for the images. */
export type BinaryName =
  | "distort-manager"
  | "distort-agent"
  | "distort-csi"
  | "distort-dpu"
  | "nvmf_tgt"
  | "distort-agent-kernel-lab"
  | "distort-csi-lab"
  | "distort-workload";

export interface BinarySpec {
  /** The entry point, relative to the repository root. */
  readonly entry: string;
  /**
   * Repository paths (directories or files) holding every source the bundle can import besides
   * node_modules; their content is the binary's key. image-plan.test.ts checks this against
   * bun's own list of bundle inputs.
   */
  readonly sources: readonly string[];
  /**
   * Worker scripts the binary starts (`new Worker`), compiled in as further entry points: a
   * standalone executable holds only what its command line names, and a Worker's file is loaded
   * by path, not imported.
   */
  readonly workers?: readonly string[];
}

/** The entry points of `spec` in `bun build --compile` order: the main one, then its workers. */
export function compileEntries(spec: BinarySpec): readonly string[] {
  return [spec.entry, ...(spec.workers ?? [])];
}

/** The Containerfiles' build stages compile exactly these (same entry, same flags). */
export const BINARIES: Readonly<Record<BinaryName, BinarySpec>> = {
  "distort-manager": { entry: "manager/main.ts", sources: ["api", "gen", "lib", "manager"] },
  "distort-agent": { entry: "agent/main.ts", sources: ["api", "gen", "lib", "agent"] },
  "distort-csi": { entry: "csi/main.ts", sources: ["api", "gen", "lib", "csi"] },
  "distort-dpu": { entry: "dpu/main.ts", sources: ["api", "gen", "lib", "dpu"] },
  nvmf_tgt: {
    entry: "lab/sim/spdk/nvmf-tgt.ts",
    sources: ["api", "gen", "lib", "lab/sim"],
    // The NBD stand-in's FUSE server (lab/sim/spdk/nbd.ts) reads /dev/fuse on this thread.
    workers: ["lab/sim/fuse/dev-reader-worker.ts"],
  },
  "distort-agent-kernel-lab": {
    entry: "lab/kernel-agent.ts",
    sources: ["api", "gen", "lib", "agent", "lab/kernel-agent.ts", "lab/sim"],
  },
  "distort-csi-lab": {
    entry: "lab/csi-node.ts",
    sources: ["api", "gen", "lib", "csi", "lab/csi-node.ts", "lab/sim"],
  },
  "distort-workload": { entry: "lab/workload.ts", sources: ["lab/workload.ts"] },
};

/** Files every bundle depends on besides its sources: dependency versions and compiler settings. */
export const BUNDLE_COMMON_FILES = [
  "package.json",
  "package-lock.json",
  "bunfig.toml",
  "tsconfig.json",
] as const;

/** The flags of the Containerfiles' `bun build` lines (the target is added per architecture). */
export const BUN_COMPILE_FLAGS = ["build", "--compile", "--minify", "--sourcemap"] as const;

/** A named build context of a buildah build. */
export type ContextSource =
  /** A directory holding `out/<binary>` (the Containerfile's build or lab-build stage output). */
  | { kind: "binary"; binary: BinaryName }
  /** A directory holding `bin/busybox`, a static busybox. */
  | { kind: "busybox" }
  /** The lab's Debian base image, in place of a stage that starts from a registry image. */
  | { kind: "base" };

export interface ImageSpec {
  readonly name: ImageName;
  /** Relative to the repository root. */
  readonly containerfile: string;
  readonly target: string;
  /** Named build contexts (`--build-context <name>=<dir or image>`), replacing the stages of that name. */
  readonly contexts: Readonly<Record<string, ContextSource>>;
  /** Sidecars: the build context is the directory holding this Go binary from lab/cluster/tools.ts. */
  readonly sidecar?:
    | "provisioner"
    | "attacher"
    | "resizer"
    | "snapshotter"
    | "snapshotController"
    | "snapshotMetadata";
}

const bin = (binary: BinaryName): ContextSource => ({ kind: "binary", binary });
const BASE: ContextSource = { kind: "base" };

/** How each image is built from images/. */
export const IMAGES: Readonly<Record<ImageName, ImageSpec>> = {
  manager: {
    name: "manager",
    containerfile: "images/manager.Containerfile",
    target: "manager",
    contexts: { runtime: BASE, build: bin("distort-manager") },
  },
  agent: {
    name: "agent",
    containerfile: "images/agent.Containerfile",
    target: "agent-base",
    contexts: { runtime: BASE, build: bin("distort-agent") },
  },
  "agent-lab": {
    name: "agent-lab",
    containerfile: "images/agent.Containerfile",
    target: "agent-lab",
    contexts: {
      runtime: BASE,
      build: bin("distort-agent"),
      "lab-build": bin("nvmf_tgt"),
      "lab-kernel": bin("distort-agent-kernel-lab"),
    },
  },
  csi: {
    name: "csi",
    containerfile: "images/csi.Containerfile",
    target: "csi",
    contexts: { runtime: BASE, build: bin("distort-csi") },
  },
  "csi-lab": {
    name: "csi-lab",
    containerfile: "images/csi.Containerfile",
    target: "csi-lab",
    contexts: { runtime: BASE, build: bin("distort-csi"), "lab-build": bin("distort-csi-lab") },
  },
  dpu: {
    name: "dpu",
    containerfile: "images/dpu.Containerfile",
    target: "dpu",
    contexts: { runtime: BASE, build: bin("distort-dpu") },
  },
  workload: {
    name: "workload",
    containerfile: "images/lab/workload.Containerfile",
    target: "workload",
    contexts: { libc: BASE, build: bin("distort-workload"), busybox: { kind: "busybox" } },
  },
  "csi-provisioner": sidecar("csi-provisioner", "provisioner"),
  "csi-attacher": sidecar("csi-attacher", "attacher"),
  "csi-resizer": sidecar("csi-resizer", "resizer"),
  "csi-snapshotter": sidecar("csi-snapshotter", "snapshotter"),
  "snapshot-controller": sidecar("snapshot-controller", "snapshotController"),
  "csi-snapshot-metadata": sidecar("csi-snapshot-metadata", "snapshotMetadata"),
};

function sidecar(name: ImageName, key: NonNullable<ImageSpec["sidecar"]>): ImageSpec {
  return {
    name,
    containerfile: "images/lab/sidecar.Containerfile",
    target: name,
    contexts: {},
    sidecar: key,
  };
}

/** The Debian packages of the lab's base root filesystem: the union of what the runtime stages install
 * (less SPDK's libraries: the lab runs the emulator), glibc coming with minbase. */
export const BASE_PACKAGES = [
  "ca-certificates",
  "e2fsprogs",
  "iproute2",
  "kmod",
  "mount",
  "nvme-cli",
  "parted",
  "pciutils",
  "udev",
  "util-linux",
  "xfsprogs",
] as const;
export const BASE_SUITE = "bookworm";
/** dpkg path filters: no manuals, docs (copyright files kept) or translations in the base. */
export const BASE_DPKG_OPTIONS = [
  "path-exclude=/usr/share/man/*",
  "path-exclude=/usr/share/doc/*",
  "path-include=/usr/share/doc/*/copyright",
  "path-exclude=/usr/share/locale/*",
] as const;

/** Bumped when images.ts changes how it builds, so every key changes with it. */
export const RECIPE_VERSION = "1";

/** Hex sha256 of the parts, each length-prefixed so no two part lists collide. Pure. */
export function hashParts(parts: readonly (string | Uint8Array)[]): string {
  const h = createHash("sha256");
  for (const p of parts) {
    const bytes = typeof p === "string" ? Buffer.from(p, "utf8") : p;
    h.update(`${bytes.length}:`);
    h.update(bytes);
  }
  return h.digest("hex");
}

/** The base's key: suite, package set (order-free) and dpkg options. Pure. */
export function baseKey(
  packages: readonly string[] = BASE_PACKAGES,
  suite = BASE_SUITE,
  dpkgOptions: readonly string[] = BASE_DPKG_OPTIONS,
): string {
  return hashParts([
    "base",
    RECIPE_VERSION,
    suite,
    [...new Set(packages)].sort().join(","),
    dpkgOptions.join("\n"),
  ]).slice(0, 16);
}

/** A file and the sha256 of its content. */
export interface FileDigest {
  readonly path: string;
  readonly sha256: string;
}

/** True for the files a bundle never includes: tests (nothing but tests imports them). */
export function isTestFile(path: string): boolean {
  return /\.test\.ts$/.test(path);
}

/** True when `path` is one of `sources` or lies under one of them. Pure. */
export function underSources(path: string, sources: readonly string[]): boolean {
  return sources.some((s) => path === s || path.startsWith(`${s}/`));
}

/**
 * A binary's key: bun's version, the target, the flags, the entry and the content of its source
 * files and of the common files. `files` may list more than the binary's sources; those outside
 * them and tests are ignored, and the order does not matter. Pure.
 */
export function binaryKey(
  name: BinaryName,
  files: readonly FileDigest[],
  bunVersion: string,
  arch: string,
): string {
  const spec = BINARIES[name];
  const common = new Set<string>(BUNDLE_COMMON_FILES);
  const picked = files
    .filter((f) => common.has(f.path) || (underSources(f.path, spec.sources) && !isTestFile(f.path)))
    .map((f) => `${f.path}\0${f.sha256}`)
    .sort();
  return hashParts([
    "binary",
    RECIPE_VERSION,
    name,
    bunVersion,
    arch,
    BUN_COMPILE_FLAGS.join(" "),
    ...compileEntries(spec),
    ...picked,
  ]).slice(0, 24);
}

/** The inputs of one image's key besides its spec. */
export interface ImageKeyInputs {
  /** Content of the Containerfile. */
  readonly containerfile: string;
  /** The base's key, for images that take the base. */
  readonly baseKey: string;
  /** Keys of the binaries its contexts hold, by binary name. */
  readonly binaryKeys: Readonly<Partial<Record<BinaryName, string>>>;
  /** sha256 of the busybox the lab copies in. */
  readonly busybox: string;
  /** Identity of the sidecar binary (its versioned path, size and mtime). */
  readonly sidecar: string;
  /** buildah's version: a different builder may assemble the image differently. */
  readonly builder: string;
}

/** An image's key: everything that goes into its archive. Pure. */
export function imageKey(spec: ImageSpec, inputs: ImageKeyInputs): string {
  const contexts = Object.entries(spec.contexts)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([ctx, src]) => {
      if (src.kind === "busybox") return `${ctx}=busybox:${inputs.busybox}`;
      if (src.kind === "base") return `${ctx}=base:${inputs.baseKey}`;
      const key = inputs.binaryKeys[src.binary];
      if (key === undefined) throw new Error(`no key for binary ${src.binary} of image ${spec.name}`);
      return `${ctx}=${src.binary}:${key}`;
    });
  return hashParts([
    "image",
    RECIPE_VERSION,
    spec.name,
    spec.target,
    hashParts([inputs.containerfile]),
    spec.sidecar ? `sidecar=${inputs.sidecar}` : "-",
    inputs.builder,
    ...contexts,
  ]).slice(0, 24);
}

/**
 * The lab's image tag: the short commit, plus `-dirty-<first 12 of contentHash>` when the tree has
 * uncommitted changes, so two different dirty trees never share a tag. Throws on a commit that is
 * not hex. Pure.
 */
export function imageTag(shortCommit: string, dirty: boolean, contentHash: string): string {
  if (!/^[0-9a-f]{4,40}$/.test(shortCommit))
    throw new Error(`not a commit id: ${JSON.stringify(shortCommit)}`);
  if (!dirty) return shortCommit;
  if (!/^[0-9a-f]{12,}$/.test(contentHash))
    throw new Error(`not a content hash: ${JSON.stringify(contentHash)}`);
  return `${shortCommit}-dirty-${contentHash.slice(0, 12)}`;
}

/** The combined key of a set of images (for the dirty tag): order-free. Pure. */
export function combinedKey(keys: Readonly<Partial<Record<ImageName, string>>>): string {
  const parts = Object.entries(keys)
    .map(([n, k]) => `${n}=${k}`)
    .sort();
  return hashParts(["images", ...parts]);
}

/** `distort.lab/<name>:<tag>`; throws on a tag Docker references refuse. Pure. */
export function imageRef(name: ImageName, tag: string): string {
  if (!/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/.test(tag))
    throw new Error(`invalid image tag ${JSON.stringify(tag)}`);
  return `${LAB_REGISTRY}/${name}:${tag}`;
}

/**
 * The name an archive carries inside (its OCI ref annotation), tied to its content and not to a
 * commit, so a warm cache serves any tag; importArchive retags it to the lab's ref. Pure.
 */
export function archiveRef(name: ImageName, key: string): string {
  return `${LAB_REGISTRY}/${name}:content-${key}`;
}
