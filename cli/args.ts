// Command-line parsing shared by the subcommands: node:util's parseArgs in strict mode, its
// errors turned into UsageError sentences, and the flags every cluster command takes.
import { type ParseArgsConfig, parseArgs } from "node:util";
import { UsageError } from "./exit-codes.ts";

type Options = NonNullable<ParseArgsConfig["options"]>;

/** Flags every command that talks to the cluster accepts. */
export const KUBE_OPTIONS = {
  kubeconfig: { type: "string" },
  namespace: { type: "string", short: "n" },
  output: { type: "string", short: "o" },
  help: { type: "boolean", short: "h" },
} as const satisfies Options;

/**
 * Parses `argv` against `options`; positionals allowed. Throws UsageError for an unknown option,
 * a missing value or a value given to a boolean, in words that name the option.
 */
export function parseCommand<O extends Options>(argv: readonly string[], options: O) {
  const args = argv[0] === "--" ? argv.slice(1) : [...argv];
  try {
    return parseArgs({ args, options, allowPositionals: true, strict: true });
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    const unknown = /^Unknown option '([^']+)'/.exec(message);
    if (unknown) throw new UsageError(`unknown option ${unknown[1]}`);
    const missing = /^Option '([^']+)' argument missing/.exec(message);
    if (missing) {
      const flag = (missing[1] ?? "").split(",").at(-1)?.trim().split(" ")[0];
      throw new UsageError(`${flag} needs a value`);
    }
    throw new UsageError(message.split("\n")[0] ?? message);
  }
}

/** `-n` value validated as a DNS label, or `fallback` when absent. */
export function namespaceOf(value: string | undefined, fallback: string): string {
  if (value === undefined) return fallback;
  if (!/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(value)) {
    throw new UsageError(`--namespace ${JSON.stringify(value)} is not a namespace name`);
  }
  return value;
}

/** Exactly `count` positionals named `names`, or a UsageError saying which is missing or extra. */
export function positionals(values: readonly string[], names: readonly string[]): string[] {
  if (values.length < names.length) throw new UsageError(`missing ${names[values.length]}`);
  if (values.length > names.length)
    throw new UsageError(`unexpected argument ${JSON.stringify(values[names.length])}`);
  return [...values];
}
