// The Containerfiles agree with the code and the chart: each compiles its binary's main.ts into
// the path its ENTRYPOINT runs, the agent image installs nvmf_tgt and setup.sh where the chart's
// defaults point, and the CSI image carries the node tools csi/config.ts probes for.
import { describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { parse } from "yaml";

const ROOT = join(import.meta.dir, "..");
const IMAGES = join(ROOT, "images");
const values = parse(readFileSync(join(import.meta.dir, "distort", "values.yaml"), "utf8"));
const file = (name: string) => readFileSync(join(IMAGES, `${name}.Containerfile`), "utf8");

// Debian package that provides each command the CSI node side runs.
const PACKAGE_OF: Record<string, string> = {
  nvme: "nvme-cli",
  blkid: "util-linux",
  "mkfs.ext4": "e2fsprogs",
  "mkfs.xfs": "xfsprogs",
  mount: "mount",
  umount: "mount",
};

describe("images", () => {
  test("one Containerfile per binary, and nothing else", () => {
    const names = readdirSync(IMAGES)
      .filter((f) => f.endsWith(".Containerfile"))
      .map((f) => f.replace(".Containerfile", ""))
      .sort();
    expect(names).toEqual(["agent", "csi", "dpu", "manager"]);
    expect(
      Object.keys(values.images)
        .filter((k) => k !== "tag" && k !== "pullPolicy" && k !== "pullSecrets")
        .sort(),
    ).toEqual(names);
  });

  for (const name of ["agent", "csi", "dpu", "manager"]) {
    test(`${name}: compiles ${name}/main.ts into the binary its ENTRYPOINT runs`, () => {
      const text = file(name);
      const compiled = /bun build --compile[^\n]*\\\n\s*--target=\S+ (\S+) --outfile (\S+)/.exec(text);
      expect(compiled?.[1]).toBe(`${name}/main.ts`);
      const out = compiled?.[2] as string;
      expect(text).toContain(`COPY --from=build ${out} /usr/local/bin/distort-${name}`);
      expect(text).toContain(`ENTRYPOINT ["/usr/local/bin/distort-${name}"]`);
      expect(text).toContain(`COPY ${name}/ ${name}/`);
      // dpu/ is being written alongside the chart; the others exist.
      if (name !== "dpu") expect(existsSync(join(ROOT, name, "main.ts"))).toBe(true);
    });
  }

  test("agent: nvmf_tgt and setup.sh land where the chart's defaults point; SPDK is the transcripts' release", () => {
    const text = file("agent");
    expect(values.agent.spdk.nvmfTgt).toBe("/usr/local/bin/nvmf_tgt");
    expect(text).toContain("COPY --from=spdk /opt/spdk/bin/nvmf_tgt /usr/local/bin/nvmf_tgt");
    expect(values.agent.spdk.setupScript).toBe("/usr/local/share/spdk/scripts/setup.sh");
    expect(text).toContain("cp -r scripts /opt/spdk/share/scripts");
    expect(text).toContain("COPY --from=spdk /opt/spdk/share/ /usr/local/share/spdk/");
    const pinned = /ARG SPDK_VERSION=(v[\d.]+)/.exec(text)?.[1];
    expect(existsSync(join(ROOT, "testdata", `spdk-${pinned}.jsonl`))).toBe(true);
  });

  test("csi: the node tools distort-csi requires are installed", () => {
    const text = file("csi");
    const config = readFileSync(join(ROOT, "csi", "config.ts"), "utf8");
    const tools = /nodeTools:[^}]*default: "([^"]+)"/s.exec(config)?.[1]?.split(",") ?? [];
    expect(tools.length).toBeGreaterThan(0);
    const installed =
      /apt-get install[^\n]*--no-install-recommends ([^\n]+)/.exec(text)?.[1]?.split(/\s+/) ?? [];
    for (const t of tools)
      expect({ tool: t, pkg: installed.includes(PACKAGE_OF[t] ?? "?") }).toEqual({ tool: t, pkg: true });
  });

  test("the build context sends sources, not tests or local state", () => {
    const ignore = readFileSync(join(IMAGES, ".dockerignore"), "utf8");
    expect(ignore).toMatch(/^\*\*$/m);
    for (const dir of ["api", "gen", "lib", "manager", "agent", "csi", "dpu"])
      expect(ignore).toContain(`!${dir}/**`);
    expect(ignore).toContain("**/*.test.ts");
  });
});
