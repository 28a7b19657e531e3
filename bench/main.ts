// `bun run bench [name...]`: runs every bench/*.bench.ts (or those whose file name contains one of
// the names) as its own process, collects the results they write, prints one table, and records
// them with machine facts in bench/results/latest.json and the table in docs/performance.md.
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { cpus, tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { ETCD_VERSION, KUBE_VERSION } from "../lab/cluster/tools.ts";
import {
  type BenchOutcome,
  type BenchResult,
  RESULT_FILE_ENV,
  renderMarkdown,
  renderText,
  replaceBetweenMarkers,
  tableRows,
} from "./report.ts";

const ROOT = join(import.meta.dir, "..");
const LATEST = join(import.meta.dir, "results", "latest.json");
const DOC = join(ROOT, "docs", "performance.md");
const TABLE_START = "<!-- bench:table:start -->";
const TABLE_END = "<!-- bench:table:end -->";
// A bench that hangs must not hang the whole run; the slowest one (placement) takes minutes.
const TIMEOUT_MS = Number(process.env.BENCH_TIMEOUT_MS ?? 45 * 60_000);

/** Facts about where the numbers came from. */
interface Machine {
  cpu: string;
  cores: number;
  memoryGiB: number;
  bun: string;
  kernel: string;
  go: string;
  kube: string;
  etcd: string;
  commit: string;
  date: string;
}

/** One bench's stored entry: its outcome plus when and on which commit it ran. */
interface StoredOutcome extends BenchOutcome {
  file: string;
  ranAt: string;
  commit: string;
  seconds: number;
}

interface Latest {
  machine: Machine;
  results: StoredOutcome[];
}

async function output(argv: string[]): Promise<string> {
  try {
    const p = Bun.spawn(argv, { cwd: ROOT, stdout: "pipe", stderr: "ignore" });
    const text = await new Response(p.stdout).text();
    return (await p.exited) === 0 ? text.trim() : "unknown";
  } catch {
    return "unknown";
  }
}

async function machine(): Promise<Machine> {
  const commit = await output(["git", "rev-parse", "HEAD"]);
  const dirty = (await output(["git", "status", "--porcelain"])) !== "";
  const go = await output(["go", "env", "GOVERSION"]);
  return {
    cpu: cpus()[0]?.model ?? "unknown",
    cores: cpus().length,
    memoryGiB: Math.round((totalmem() / 2 ** 30) * 10) / 10,
    bun: Bun.version,
    kernel: await output(["uname", "-r"]),
    go,
    kube: KUBE_VERSION,
    etcd: ETCD_VERSION,
    commit: commit === "unknown" ? commit : `${commit}${dirty ? " (with uncommitted changes)" : ""}`,
    date: new Date().toISOString(),
  };
}

/** Runs one bench file; never throws: a crash becomes a failed outcome. */
async function runBench(file: string, m: Machine): Promise<StoredOutcome> {
  const bench = file.replace(/\.bench\.ts$/, "");
  const dir = mkdtempSync(join(tmpdir(), "distort-bench-"));
  const resultFile = join(dir, "result.json");
  const t0 = performance.now();
  let failed: string | undefined;
  let result: BenchResult | undefined;
  try {
    const p = Bun.spawn([process.execPath, join(import.meta.dir, file)], {
      cwd: ROOT,
      env: { ...process.env, [RESULT_FILE_ENV]: resultFile },
      stdout: "inherit",
      stderr: "inherit",
    });
    const timer = setTimeout(() => p.kill("SIGKILL"), TIMEOUT_MS);
    const code = await p.exited;
    clearTimeout(timer);
    if (existsSync(resultFile)) result = JSON.parse(readFileSync(resultFile, "utf8")) as BenchResult;
    if (p.signalCode) failed = `killed by ${p.signalCode}${p.signalCode === "SIGKILL" ? " (timeout?)" : ""}`;
    else if (code !== 0) failed = `exited with code ${code}`;
    else if (!result) failed = "wrote no result";
  } catch (err) {
    failed = `could not run: ${err instanceof Error ? err.message : String(err)}`;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return {
    bench: result?.bench ?? bench,
    file,
    ...(result ? { result } : {}),
    ...(failed !== undefined ? { failed } : {}),
    ranAt: m.date,
    commit: m.commit,
    seconds: Math.round((performance.now() - t0) / 100) / 10,
  };
}

function loadLatest(): Latest | undefined {
  try {
    return JSON.parse(readFileSync(LATEST, "utf8")) as Latest;
  } catch {
    return undefined;
  }
}

function docTable(latest: Latest, ran: ReadonlySet<string>): string {
  const m = latest.machine;
  const older = latest.results.filter((r) => !ran.has(r.file));
  const lines = [
    `Last run ${m.date.slice(0, 16).replace("T", " ")} UTC on ${m.cpu} (${m.cores} cores, ${m.memoryGiB} GiB), Linux ${m.kernel}, Bun ${m.bun}, ${m.go}, Kubernetes ${m.kube}, etcd ${m.etcd}; commit ${m.commit}.`,
    ...(older.length > 0
      ? [
          "",
          `Not rerun that time (older results kept): ${older.map((r) => `${r.bench} (${r.ranAt.slice(0, 10)}, ${r.commit.slice(0, 12)})`).join(", ")}.`,
        ]
      : []),
    "",
    renderMarkdown(tableRows(latest.results)),
  ];
  return lines.join("\n");
}

/** Rewrites the table in docs/performance.md from `latest`; a document without markers is left alone. */
function updateDoc(latest: Latest, ran: ReadonlySet<string>): void {
  if (!existsSync(DOC)) return;
  try {
    writeFileSync(
      DOC,
      replaceBetweenMarkers(readFileSync(DOC, "utf8"), TABLE_START, TABLE_END, docTable(latest, ran)),
    );
  } catch (err) {
    process.stderr.write(`docs/performance.md not updated: ${(err as Error).message}\n`);
  }
}

async function main(): Promise<number> {
  // --render: only rewrite the documentation table from bench/results/latest.json.
  if (process.argv[2] === "--render") {
    const latest = loadLatest();
    if (!latest) {
      process.stderr.write(`no results in ${LATEST}\n`);
      return 2;
    }
    updateDoc(
      latest,
      new Set(latest.results.filter((r) => r.ranAt === latest.machine.date).map((r) => r.file)),
    );
    return 0;
  }
  const only = process.argv.slice(2);
  const files = readdirSync(import.meta.dir)
    .filter((f) => f.endsWith(".bench.ts") && (only.length === 0 || only.some((o) => f.includes(o))))
    .sort();
  if (files.length === 0) {
    process.stderr.write(`no bench matches ${only.join(", ")}\n`);
    return 2;
  }
  const m = await machine();
  const outcomes: StoredOutcome[] = [];
  for (const f of files) {
    process.stdout.write(`\n## ${f}\n`);
    const o = await runBench(f, m);
    process.stdout.write(`## ${f}: ${o.failed ? `FAILED (${o.failed})` : "done"} in ${o.seconds} s\n`);
    outcomes.push(o);
  }

  // Benches not run this time keep their last stored result, so a partial run updates only its rows.
  const ran = new Set(files);
  const previous = loadLatest()?.results.filter((r) => !ran.has(r.file)) ?? [];
  const latest: Latest = {
    machine: m,
    results: [...previous, ...outcomes].sort((a, b) => a.file.localeCompare(b.file)),
  };
  mkdirSync(join(import.meta.dir, "results"), { recursive: true });
  writeFileSync(LATEST, `${JSON.stringify(latest, null, 2)}\n`);
  updateDoc(latest, ran);

  process.stdout.write(`\n${renderText(tableRows(outcomes))}\n`);
  for (const o of outcomes) {
    for (const n of o.result?.notes ?? []) process.stdout.write(`  ${o.bench}: note: ${n}\n`);
    for (const p of o.result?.profile ?? []) process.stdout.write(`  ${o.bench}: profile: ${p}\n`);
  }
  process.stdout.write(`\nresults: ${LATEST}\n`);
  return outcomes.some((o) => o.failed !== undefined) ? 1 : 0;
}

if (import.meta.main) process.exit(await main());
