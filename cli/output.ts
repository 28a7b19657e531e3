// Data output for `-o json|yaml`: one document, keys as the command built them, trailing newline.
import { stringify } from "yaml";
import { UsageError } from "./exit-codes.ts";

export type DataFormat = "json" | "yaml";
export type OutputFormat = "text" | DataFormat;

/** Parses an -o value for a command whose text form is `text`; throws UsageError on others. */
export function parseOutput(value: string | undefined, extra: readonly string[] = []): OutputFormat | string {
  if (value === undefined) return "text";
  if (value === "json" || value === "yaml" || extra.includes(value)) return value;
  const allowed = ["json", "yaml", ...extra].map((f) => `-o ${f}`).join(", ");
  throw new UsageError(`unknown output format ${JSON.stringify(value)} (use ${allowed})`);
}

/** `data` as JSON (two-space indent) or YAML. Pure. */
export function renderData(data: unknown, format: DataFormat): string {
  if (format === "json") return `${JSON.stringify(data, null, 2)}\n`;
  return stringify(data, { lineWidth: 0 });
}
