// Shared logic lives in lib/: a class or function exported under the same name by two binaries'
// folders (or by a binary and the lab) is a primitive written twice, unless the allow-list below
// says why the two are different logic that only share a name.
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { sourceFiles } from "./source-files.ts";

const root = join(import.meta.dir, "..");
const FOLDERS = ["manager", "agent", "csi", "dpu", "lab"] as const;

/**
 * Names two folders may both export, each with the reason the two are different logic. Keep it
 * short: same logic belongs in lib/ and is imported by both.
 */
const ALLOWED: Readonly<Record<string, string>> = {
  createIdentityService:
    "different services: csi's is the CSI Identity (plugin capabilities, Probe on the API server), dpu's the DPF nvidia.storage.plugins.v1 Identity (plugin manifest, SNAP readiness)",
  errnoOf:
    "different errors: the agent's reads the string code (ENOENT...) of a node:fs error from configfs; the SPDK emulator's gives the numeric errno of its own ErrnoError, EIO for anything else",
  mkfsArgv:
    "different mkfs policies: the CSI node formats an NVMe-oF namespace with no reserved blocks (-m0); the DPU formats an NBD device, skipping discards that take minutes over NBD (-E nodiscard, -K)",
  parseMountinfo:
    "different contracts: the CSI node validates every field (major:minor, root, options) and refuses a malformed line, because it decides on binds and ro flags; the DPU keeps mount point, type and source and skips lines not of mountinfo's shape",
};

// `export [default] [abstract] [async] class|function[*] Name`, and `export const Name = (...) =>`
// or `= async x =>` for functions written as arrows.
const EXPORT =
  /^export\s+(?:default\s+)?(?:declare\s+)?(?:abstract\s+)?(?:async\s+)?(?:(?:class|function\*?)\s+([A-Za-z_$][\w$]*)|const\s+([A-Za-z_$][\w$]*)\s*(?::[^=]*)?=\s*(?:async\s*)?(?:\([^)]*\)|[A-Za-z_$][\w$]*)\s*(?::[^=]*)?=>)/gm;

/** Exported class and function names of one source text. Pure. */
function exportedNames(src: string): string[] {
  return [...src.matchAll(EXPORT)].map((m) => (m[1] ?? m[2]) as string);
}

/** name -> folder -> files exporting it. */
function exportsByName(): Map<string, Map<string, string[]>> {
  const out = new Map<string, Map<string, string[]>>();
  for (const folder of FOLDERS) {
    for (const f of sourceFiles(join(root, folder))) {
      if (f.endsWith(".test.ts") || f.includes("/testdata/")) continue;
      for (const name of exportedNames(readFileSync(f, "utf8"))) {
        const byFolder = out.get(name) ?? new Map<string, string[]>();
        byFolder.set(folder, [...(byFolder.get(folder) ?? []), relative(root, f)]);
        out.set(name, byFolder);
      }
    }
  }
  return out;
}

test("the export scanner sees classes, functions and arrow functions, and nothing else", () => {
  const src = [
    "export class A {}",
    "export abstract class B {}",
    "export async function c() {}",
    "export function* d() {}",
    "export const e = (x: number): number => x;",
    "export const f = async () => {};",
    "export const g = x => x;",
    "export const H = 3;",
    "export type I = string;",
    "export interface J {}",
    "  export function notTopLevel() {}",
  ].join("\n");
  expect(exportedNames(src)).toEqual(["A", "B", "c", "d", "e", "f", "g"]);
});

test("no class or function name is exported by two binaries, or by a binary and the lab, unless allowed", () => {
  const offenders: string[] = [];
  const used = new Set<string>();
  for (const [name, byFolder] of exportsByName()) {
    const folders = [...byFolder.keys()];
    if (folders.length < 2 || folders.every((f) => f === "lab")) continue;
    if (ALLOWED[name] !== undefined) {
      used.add(name);
      continue;
    }
    offenders.push(`${name}: ${folders.map((f) => byFolder.get(f)?.join(", ")).join(" | ")}`);
  }
  expect(offenders).toEqual([]);
  // An entry whose collision is gone must leave the list, so it stays short and true.
  expect(Object.keys(ALLOWED).filter((n) => !used.has(n))).toEqual([]);
});
