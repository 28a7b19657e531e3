import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import {
  archiveRef,
  BINARIES,
  type BinaryName,
  BUNDLE_COMMON_FILES,
  baseKey,
  binaryKey,
  combinedKey,
  compileEntries,
  type FileDigest,
  IMAGE_NAMES,
  IMAGES,
  type ImageKeyInputs,
  imageKey,
  imageRef,
  imageTag,
  isTestFile,
  underSources,
} from "./image-plan.ts";

const REPO = join(import.meta.dir, "..", "..");

const FILES: FileDigest[] = [
  { path: "package-lock.json", sha256: "p1" },
  { path: "lib/log.ts", sha256: "l1" },
  { path: "csi/main.ts", sha256: "c1" },
  { path: "agent/main.ts", sha256: "a1" },
  { path: "lib/log.test.ts", sha256: "t1" },
  { path: "docs/lab.md", sha256: "d1" },
];

function change(files: FileDigest[], path: string, sha256: string): FileDigest[] {
  return files.map((f) => (f.path === path ? { path, sha256 } : f));
}

describe("imageTag", () => {
  test("a clean tree is tagged by its commit alone", () => {
    expect(imageTag("99d6bf86adca", false, "ff".repeat(32))).toBe("99d6bf86adca");
  });
  test("a dirty tree adds the first 12 characters of the content hash", () => {
    expect(imageTag("99d6bf86adca", true, `0123456789ab${"f".repeat(52)}`)).toBe(
      "99d6bf86adca-dirty-0123456789ab",
    );
  });
  test("refuses what is not a commit or a content hash", () => {
    expect(() => imageTag("HEAD", false, "")).toThrow(/commit/);
    expect(() => imageTag("99d6bf86adca", true, "short")).toThrow(/content hash/);
  });
});

describe("imageRef and archiveRef", () => {
  test("names images under distort.lab", () => {
    expect(imageRef("csi-lab", "99d6bf86adca-dirty-0123456789ab")).toBe(
      "distort.lab/csi-lab:99d6bf86adca-dirty-0123456789ab",
    );
    expect(archiveRef("agent", "abc")).toBe("distort.lab/agent:content-abc");
  });
  test("refuses a tag a reference cannot carry", () => {
    expect(() => imageRef("csi", "a/b")).toThrow(/invalid image tag/);
    expect(() => imageRef("csi", "")).toThrow(/invalid image tag/);
    expect(() => imageRef("csi", "x".repeat(129))).toThrow(/invalid image tag/);
  });
});

describe("baseKey", () => {
  test("ignores package order and duplicates, follows the set and the suite", () => {
    expect(baseKey(["b", "a"], "bookworm")).toBe(baseKey(["a", "b", "a"], "bookworm"));
    expect(baseKey(["a", "b"], "bookworm")).not.toBe(baseKey(["a", "b", "c"], "bookworm"));
    expect(baseKey(["a", "b"], "bookworm")).not.toBe(baseKey(["a", "b"], "trixie"));
  });
});

describe("binaryKey", () => {
  const key = (files: FileDigest[], name: BinaryName = "distort-csi", bun = "1.4.5") =>
    binaryKey(name, files, bun, "x64");

  test("follows its sources, the lock file and bun's version", () => {
    expect(key(change(FILES, "csi/main.ts", "c2"))).not.toBe(key(FILES));
    expect(key(change(FILES, "lib/log.ts", "l2"))).not.toBe(key(FILES));
    expect(key(change(FILES, "package-lock.json", "p2"))).not.toBe(key(FILES));
    expect(key(FILES, "distort-csi", "1.4.6")).not.toBe(key(FILES));
  });
  test("ignores tests, other components, unrelated files and order", () => {
    expect(key(change(FILES, "lib/log.test.ts", "t2"))).toBe(key(FILES));
    expect(key(change(FILES, "agent/main.ts", "a2"))).toBe(key(FILES));
    expect(key(change(FILES, "docs/lab.md", "d2"))).toBe(key(FILES));
    expect(key([...FILES].reverse())).toBe(key(FILES));
  });
  test("a new source file changes the key", () => {
    expect(key([...FILES, { path: "csi/new.ts", sha256: "n" }])).not.toBe(key(FILES));
  });
  test("two binaries over the same files have different keys", () => {
    expect(key(FILES, "distort-csi")).not.toBe(key(FILES, "distort-csi-lab"));
  });
});

describe("imageKey", () => {
  const inputs: ImageKeyInputs = {
    containerfile: "FROM x",
    baseKey: "base1",
    binaryKeys: {
      "distort-agent": "a",
      nvmf_tgt: "n",
      "distort-agent-kernel-lab": "k",
      "distort-csi": "c",
      "distort-csi-lab": "cl",
      "distort-manager": "m",
      "distort-dpu": "d",
      "distort-workload": "w",
    },
    busybox: "bb",
    sidecar: "/cache/sidecars/csi-attacher/v4.13.0/csi-attacher:1:2",
    builder: "buildah version 1.28.2",
  };
  const with_ = (patch: Partial<ImageKeyInputs>) => ({ ...inputs, ...patch });

  test("follows the Containerfile, the base, the builder and the binaries it holds", () => {
    const k = imageKey(IMAGES["agent-lab"], inputs);
    expect(imageKey(IMAGES["agent-lab"], with_({ containerfile: "FROM y" }))).not.toBe(k);
    expect(imageKey(IMAGES["agent-lab"], with_({ baseKey: "base2" }))).not.toBe(k);
    expect(imageKey(IMAGES["agent-lab"], with_({ builder: "buildah version 1.29" }))).not.toBe(k);
    expect(
      imageKey(IMAGES["agent-lab"], with_({ binaryKeys: { ...inputs.binaryKeys, nvmf_tgt: "n2" } })),
    ).not.toBe(k);
  });
  test("ignores binaries it does not hold", () => {
    const k = imageKey(IMAGES.agent, inputs);
    expect(imageKey(IMAGES.agent, with_({ binaryKeys: { ...inputs.binaryKeys, nvmf_tgt: "n2" } }))).toBe(k);
    expect(imageKey(IMAGES.agent, with_({ busybox: "bb2" }))).toBe(k);
  });
  test("a sidecar image follows its binary and not the base", () => {
    const k = imageKey(IMAGES["csi-attacher"], inputs);
    expect(Object.keys(IMAGES["csi-attacher"].contexts)).toEqual([]);
    expect(imageKey(IMAGES["csi-attacher"], with_({ sidecar: "other" }))).not.toBe(k);
    expect(imageKey(IMAGES["csi-attacher"], with_({ baseKey: "base2" }))).toBe(k);
  });
  test("two targets of one Containerfile have different keys", () => {
    expect(imageKey(IMAGES.csi, inputs)).not.toBe(imageKey(IMAGES["csi-lab"], inputs));
  });
  test("throws when a binary's key is missing", () => {
    expect(() => imageKey(IMAGES.csi, with_({ binaryKeys: {} }))).toThrow(/no key for binary distort-csi/);
  });
});

test("combinedKey does not depend on order", () => {
  expect(combinedKey({ csi: "1", agent: "2" })).toBe(combinedKey({ agent: "2", csi: "1" }));
  expect(combinedKey({ csi: "1", agent: "2" })).not.toBe(combinedKey({ csi: "1", agent: "3" }));
});

describe("the plan matches the repository", () => {
  test("every image's Containerfile has its target stage and every named context is a stage there", () => {
    for (const name of IMAGE_NAMES) {
      const spec = IMAGES[name];
      const text = readFileSync(join(REPO, spec.containerfile), "utf8");
      const stages = [...text.matchAll(/^FROM\s+\S+\s+AS\s+(\S+)\s*$/gim)].map((m) => m[1]);
      expect(stages).toContain(spec.target);
      for (const ctx of Object.keys(spec.contexts)) expect(stages).toContain(ctx);
    }
  });

  test("each Containerfile compiles a binary from the entry point the plan hashes", () => {
    for (const name of IMAGE_NAMES) {
      const spec = IMAGES[name];
      const text = readFileSync(join(REPO, spec.containerfile), "utf8");
      for (const src of Object.values(spec.contexts)) {
        if (src.kind !== "binary") continue;
        expect(text).toContain(
          `${compileEntries(BINARIES[src.binary]).join(" ")} --outfile /out/${src.binary}`,
        );
      }
    }
  });

  // The keys are only as good as the source lists: every file bun bundles into a binary (outside
  // node_modules) must lie in that binary's sources, or a change to it would not rebuild the image.
  // Packages stay external: the check is about the repository's own files, and bare specifiers
  // here only ever name node_modules (no tsconfig paths, no package.json imports or workspaces),
  // so the repository files reached are the same while the ~1000 package files go unparsed.
  test("every binary's sources cover what bun bundles into it", async () => {
    // The premise of packages: "external" above; should an alias appear, this check must bundle packages.
    const tsconfig = JSON.parse(readFileSync(join(REPO, "tsconfig.json"), "utf8"));
    const pkg = JSON.parse(readFileSync(join(REPO, "package.json"), "utf8"));
    expect([tsconfig.compilerOptions?.paths, pkg.imports, pkg.workspaces]).toEqual([
      undefined,
      undefined,
      undefined,
    ]);
    for (const [name, spec] of Object.entries(BINARIES)) {
      const result = await Bun.build({
        entrypoints: compileEntries(spec).map((e) => join(REPO, e)),
        target: "bun",
        metafile: true,
        packages: "external",
      });
      expect(result.success).toBe(true);
      const inputs = Object.keys(result.metafile?.inputs ?? {})
        .map((p) => (p.startsWith("/") ? p : join(process.cwd(), p)))
        .filter((p) => !p.includes("/node_modules/"))
        .map((p) => p.slice(REPO.length + 1));
      expect(inputs.length).toBeGreaterThan(0);
      const common = new Set<string>(BUNDLE_COMMON_FILES);
      const uncovered = inputs.filter(
        (p) => (!common.has(p) && !underSources(p, spec.sources)) || isTestFile(p),
      );
      expect({ name, uncovered }).toEqual({ name, uncovered: [] });
    }
  }, 30_000);
});
