// Compiles the kubectl plugin into one self-contained executable (bun build --compile):
// .cache/dist/kubectl-distort by default, or the path given. Copy it anywhere on PATH and kubectl
// finds it as `kubectl distort`. The binary is a build output: .cache/ is never committed.
import { mkdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";

const root = join(import.meta.dir, "..");
const out = resolve(process.argv[2] ?? join(root, ".cache", "dist", "kubectl-distort"));
mkdirSync(dirname(out), { recursive: true });
// --target defaults to the machine building it; pass e.g. BUN_TARGET=bun-linux-arm64 to cross-compile.
const target = process.env.BUN_TARGET;
const argv = [
  process.execPath,
  "build",
  "--compile",
  "--minify",
  ...(target ? [`--target=${target}`] : []),
  join(root, "cli", "kubectl-distort.ts"),
  "--outfile",
  out,
];
const p = Bun.spawn(argv, { cwd: root, stdout: "inherit", stderr: "inherit" });
const code = await p.exited;
if (code !== 0) process.exit(code);
process.stdout.write(`${out}\n`);
