// Test support: an Exec that records every argv and answers from a script, so tests assert the
// exact commands the host adapters would run without running any of them.
import type { Exec, ExecOptions, ExecResult } from "../../lib/exec.ts";

/** One recorded command. */
export interface ExecCall {
  readonly argv: readonly string[];
  readonly opts: ExecOptions | undefined;
}

/** Answers a command; return undefined to fall through to the next rule (or the default). */
export type ExecRule = (argv: readonly string[]) => Partial<ExecResult> | undefined;

/**
 * Records calls in order. Rules are tried in order; the first answer wins; unmatched commands
 * exit 0 with empty output. A rule may throw to simulate a command that cannot start.
 */
export class ScriptedExec implements Exec {
  readonly calls: ExecCall[] = [];
  readonly #rules: ExecRule[] = [];

  constructor(...rules: ExecRule[]) {
    this.#rules.push(...rules);
  }

  /** Adds a rule that answers commands whose argv starts with `prefix`. */
  on(
    prefix: readonly string[],
    answer: Partial<ExecResult> | ((argv: readonly string[]) => Partial<ExecResult>),
  ) {
    this.#rules.push((argv) =>
      prefix.every((p, i) => argv[i] === p)
        ? typeof answer === "function"
          ? answer(argv)
          : answer
        : undefined,
    );
    return this;
  }

  async run(argv: readonly string[], opts?: ExecOptions): Promise<ExecResult> {
    this.calls.push({ argv: [...argv], opts });
    for (const rule of this.#rules) {
      const r = rule(argv);
      if (r !== undefined) return { code: r.code ?? 0, stdout: r.stdout ?? "", stderr: r.stderr ?? "" };
    }
    return { code: 0, stdout: "", stderr: "" };
  }

  /** The argv of every call whose first word is `cmd`. */
  argvOf(cmd: string): string[][] {
    return this.calls.filter((c) => c.argv[0] === cmd).map((c) => [...c.argv]);
  }
}
