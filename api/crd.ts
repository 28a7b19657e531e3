// valibot -> structural OpenAPI v3 converter and CRD assembly for the kinds in api/kinds.ts.
// Deliberately narrow: it converts what the apiserver can enforce and throws on everything else, so a
// constraint can never exist in TS only by accident (a TS-only check must carry a cel() twin).
import * as v from "valibot";
import YAML from "yaml";
import type { CelRule } from "./common.ts";
import { type KindDef, kinds } from "./kinds.ts";

/** The subset of apiextensions.k8s.io/v1 JSONSchemaProps the generator emits. */
export interface JSONSchemaProps {
  description?: string;
  type?: "object" | "array" | "string" | "integer" | "number" | "boolean";
  format?: string;
  enum?: readonly (string | number | boolean)[];
  default?: unknown;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: boolean;
  exclusiveMaximum?: boolean;
  minLength?: number;
  maxLength?: number;
  pattern?: string;
  minItems?: number;
  maxItems?: number;
  maxProperties?: number;
  items?: JSONSchemaProps;
  properties?: Record<string, JSONSchemaProps>;
  required?: string[];
  additionalProperties?: JSONSchemaProps;
  "x-kubernetes-preserve-unknown-fields"?: boolean;
  "x-kubernetes-int-or-string"?: boolean;
  "x-kubernetes-list-type"?: "atomic" | "set" | "map";
  "x-kubernetes-list-map-keys"?: string[];
  "x-kubernetes-map-type"?: "atomic" | "granular";
  "x-kubernetes-validations"?: CelRule[];
}

/** Raised for any valibot construct with no structural OpenAPI equivalent; names the schema path. */
export class SchemaConversionError extends Error {
  override readonly name = "SchemaConversionError";
  constructor(
    readonly path: string,
    detail: string,
  ) {
    super(`${path}: ${detail}`);
  }
}

// valibot's public types describe schemas for parsing; the generator walks their runtime shape instead.
interface Walkable {
  readonly kind: "schema" | "validation" | "transformation" | "metadata";
  readonly type: string;
  readonly pipe?: readonly Walkable[];
  readonly [key: string]: unknown;
}

// Validation actions the switch below maps to an OpenAPI keyword.
const MAPPED = new Set([
  "min_length",
  "max_length",
  "length",
  "non_empty",
  "regex",
  "integer",
  "min_value",
  "max_value",
  "gt_value",
  "lt_value",
  "iso_timestamp",
  "max_entries",
]);

// Keys openapi() may set: the ones with no valibot action. Anything else would shadow a real constraint.
const OPENAPI_KEYS = new Set([
  "format",
  "x-kubernetes-list-type",
  "x-kubernetes-list-map-keys",
  "x-kubernetes-map-type",
  "x-kubernetes-preserve-unknown-fields",
  "x-kubernetes-int-or-string",
]);

// Canonical key order keeps the YAML readable and the drift diff stable.
const KEY_ORDER: readonly string[] = [
  "description",
  "type",
  "format",
  "enum",
  "default",
  "minimum",
  "exclusiveMinimum",
  "maximum",
  "exclusiveMaximum",
  "minLength",
  "maxLength",
  "pattern",
  "minItems",
  "maxItems",
  "maxProperties",
  "items",
  "properties",
  "required",
  "additionalProperties",
];

function sortKeys(node: JSONSchemaProps): JSONSchemaProps {
  const rank = (k: string) => {
    const i = KEY_ORDER.indexOf(k);
    return i === -1 ? KEY_ORDER.length : i;
  };
  const keys = Object.keys(node).sort((a, b) => rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0));
  const out: Record<string, unknown> = {};
  for (const k of keys) out[k] = (node as Record<string, unknown>)[k];
  return out as JSONSchemaProps;
}

/** Splits a (possibly nested) pipe into its base schema and the actions applied to it, in order. */
function unpipe(schema: Walkable, path: string): { base: Walkable; items: Walkable[] } {
  if (!schema.pipe) return { base: schema, items: [] };
  const [first, ...rest] = schema.pipe;
  if (first === undefined) throw new SchemaConversionError(path, "empty pipe");
  const inner = unpipe(first, path);
  for (const item of rest) {
    if (item.kind === "schema") {
      throw new SchemaConversionError(
        path,
        `schema "${item.type}" inside a pipe changes the type; not representable`,
      );
    }
  }
  return { base: inner.base, items: [...inner.items, ...rest] };
}

// Go's RE2 (which the apiserver uses for `pattern`) lacks lookaround and backreferences.
function toPattern(re: unknown, path: string): string {
  if (!(re instanceof RegExp)) throw new SchemaConversionError(path, "regex requirement is not a RegExp");
  if (re.flags.replace("u", "") !== "") {
    throw new SchemaConversionError(path, `regex flags "${re.flags}" have no OpenAPI equivalent`);
  }
  if (/\(\?[=!<]|\\[1-9]|\\k</.test(re.source)) {
    throw new SchemaConversionError(path, `regex ${re.source} uses lookaround or backreferences (not RE2)`);
  }
  // JS escapes "/" in RegExp.source; RE2 accepts "\\/" too, but the plain form matches upstream patterns.
  return re.source.replace(/(?<!\\)((?:\\\\)*)\\\//g, "$1/");
}

function applyItems(out: JSONSchemaProps, items: readonly Walkable[], path: string): void {
  const isString = out.type === "string";
  const isArray = out.type === "array";
  const isNumber = out.type === "number" || out.type === "integer";
  const need = (ok: boolean, item: Walkable) => {
    if (!ok) throw new SchemaConversionError(path, `action "${item.type}" not supported on type ${out.type}`);
  };
  const lengths = (item: Walkable, min: number | undefined, max: number | undefined) => {
    need(isString || isArray, item);
    if (min !== undefined && min > 0) out[isString ? "minLength" : "minItems"] = min;
    if (max !== undefined) out[isString ? "maxLength" : "maxItems"] = max;
  };
  for (let i = 0; i < items.length; i++) {
    const item = items[i]!;
    const req = item.requirement;
    if (item.kind === "transformation") {
      throw new SchemaConversionError(
        path,
        `transformation "${item.type}" cannot be stored by the apiserver`,
      );
    }
    if (item.kind !== "metadata" && item.kind !== "validation") {
      throw new SchemaConversionError(path, `pipe item "${item.type}" (${item.kind}) not supported`);
    }
    if (item.kind === "metadata") {
      if (item.type === "description") {
        out.description = item.description as string;
      } else if (item.type === "metadata") {
        for (const [key, value] of Object.entries(item.metadata as Record<string, unknown>)) {
          if (key === "cel") {
            const rules = out["x-kubernetes-validations"] ?? [];
            rules.push({ ...(value as CelRule) });
            out["x-kubernetes-validations"] = rules;
          } else if (key === "openapi") {
            for (const [k, val] of Object.entries(value as Record<string, unknown>)) {
              if (!OPENAPI_KEYS.has(k)) throw new SchemaConversionError(path, `openapi() may not set "${k}"`);
              (out as Record<string, unknown>)[k] = val;
            }
          } else {
            throw new SchemaConversionError(path, `unknown metadata key "${key}"`);
          }
        }
      } else {
        throw new SchemaConversionError(path, `metadata action "${item.type}" not supported`);
      }
      continue;
    }
    switch (item.type) {
      case "min_length":
        lengths(item, req as number, undefined);
        break;
      case "max_length":
        lengths(item, undefined, req as number);
        break;
      case "length":
        lengths(item, req as number, req as number);
        break;
      case "non_empty":
        lengths(item, 1, undefined);
        break;
      case "regex":
        need(isString, item);
        out.pattern = toPattern(req, path);
        break;
      case "integer":
        need(isNumber, item);
        out.type = "integer";
        break;
      case "min_value":
      case "gt_value":
        need(isNumber && typeof req === "number", item);
        out.minimum = req as number;
        if (item.type === "gt_value") out.exclusiveMinimum = true;
        break;
      case "max_value":
      case "lt_value":
        need(isNumber && typeof req === "number", item);
        out.maximum = req as number;
        if (item.type === "lt_value") out.exclusiveMaximum = true;
        break;
      case "iso_timestamp":
        need(isString, item);
        out.format = "date-time";
        break;
      case "max_entries":
        need(out.type === "object" && out.additionalProperties !== undefined, item);
        out.maxProperties = req as number;
        break;
      default: {
        // No OpenAPI keyword: accepted only as part of a run of such checks that ends in their
        // apiserver twin, so every TS-only check is visibly paired with the rule enforcing it.
        let j = i + 1;
        while (items[j]?.kind === "validation" && !MAPPED.has(items[j]!.type)) j++;
        const next = items[j];
        const twin =
          next?.kind === "metadata" && next.type === "metadata" && "cel" in (next.metadata as object);
        if (!twin) {
          throw new SchemaConversionError(
            path,
            `validation "${item.type}" has no OpenAPI equivalent; follow it with cel(...) so the apiserver enforces it too`,
          );
        }
      }
    }
  }
}

function resolveDefault(schema: Walkable, path: string): unknown {
  const d = schema.default;
  const value = typeof d === "function" ? (d as () => unknown)() : d;
  if (value === undefined) return undefined;
  const json = JSON.stringify(value);
  if (json === undefined) throw new SchemaConversionError(path, "default is not JSON");
  return JSON.parse(json) as unknown;
}

function convertObject(base: Walkable, path: string): JSONSchemaProps {
  const entries = base.entries as Record<string, Walkable>;
  const properties: Record<string, JSONSchemaProps> = {};
  const required: string[] = [];
  for (const [key, entry] of Object.entries(entries)) {
    const p = `${path}.${key}`;
    const { base: eb, items } = unpipe(entry, p);
    if (eb.type === "optional" || eb.type === "exact_optional") {
      const prop = convert(eb.wrapped as Walkable, p);
      const dflt = resolveDefault(eb, p);
      if (dflt !== undefined) {
        // The apiserver would reject the CRD (or store an invalid object) with a default its own schema refuses.
        if (!v.safeParse(eb.wrapped as unknown as v.GenericSchema, dflt).success) {
          throw new SchemaConversionError(p, `default ${JSON.stringify(dflt)} does not satisfy the schema`);
        }
        prop.default = dflt;
      }
      applyItems(prop, items, p);
      properties[key] = sortKeys(prop);
    } else {
      properties[key] = convert(entry, p);
      required.push(key);
    }
  }
  const out: JSONSchemaProps = { type: "object", properties };
  if (required.length > 0) out.required = required;
  return out;
}

/**
 * Converts one valibot schema to a structural OpenAPI v3 schema. Pure and deterministic.
 * @throws SchemaConversionError on any construct the apiserver could not enforce the same way
 * (unions, nullable, transforms, tuples, non-string records, TS-only checks without a cel() twin, ...).
 */
export function toOpenApi(schema: v.GenericSchema, path = "$"): JSONSchemaProps {
  return convert(schema as unknown as Walkable, path);
}

function convert(schema: Walkable, path: string): JSONSchemaProps {
  if (schema.kind !== "schema") throw new SchemaConversionError(path, `not a schema (${schema.kind})`);
  const { base, items } = unpipe(schema, path);
  let out: JSONSchemaProps;
  switch (base.type) {
    case "string":
      out = { type: "string" };
      break;
    case "number":
      out = { type: "number" };
      break;
    case "boolean":
      out = { type: "boolean" };
      break;
    case "picklist": {
      const options = base.options as readonly unknown[];
      if (!options.every((o) => typeof o === "string")) {
        throw new SchemaConversionError(path, "picklist options must all be strings");
      }
      out = { type: "string", enum: [...(options as string[])] };
      break;
    }
    case "literal":
      if (typeof base.literal !== "string")
        throw new SchemaConversionError(path, "only string literals supported");
      out = { type: "string", enum: [base.literal] };
      break;
    case "object":
    case "strict_object":
      out = convertObject(base, path);
      break;
    case "loose_object":
      out = { ...convertObject(base, path), "x-kubernetes-preserve-unknown-fields": true };
      break;
    case "array":
      out = { type: "array", items: convert(base.item as Walkable, `${path}[]`) };
      break;
    case "record": {
      const key = base.key as Walkable;
      if (key.type !== "string" || key.pipe) {
        throw new SchemaConversionError(
          path,
          "record keys must be plain v.string() (map keys are not validated)",
        );
      }
      out = { type: "object", additionalProperties: convert(base.value as Walkable, `${path}{}`) };
      break;
    }
    case "optional":
    case "exact_optional":
      throw new SchemaConversionError(path, "optional is only meaningful as an object entry");
    case "nullable":
    case "nullish":
    case "undefinedable":
      throw new SchemaConversionError(path, `${base.type} is not allowed: structural schemas have no null`);
    default:
      throw new SchemaConversionError(
        path,
        `valibot schema "${base.type}" has no structural OpenAPI equivalent`,
      );
  }
  applyItems(out, items, path);
  return sortKeys(out);
}

const K8S_API_VERSION_DOC =
  "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values.";
const K8S_KIND_DOC =
  "Kind is a string value representing the REST resource this object represents. In CamelCase. Cannot be updated.";

/** Checks the registry's whole-object schema is built from its spec/status schemas, so TS and CRD agree. */
function checkShape(def: KindDef): void {
  const entries = (def.schema as unknown as Walkable).entries as Record<string, Walkable> | undefined;
  const keys = entries ? Object.keys(entries).join(",") : "";
  if (keys !== "apiVersion,kind,metadata,spec,status") {
    throw new SchemaConversionError(
      def.kind,
      `schema entries must be apiVersion,kind,metadata,spec,status (got ${keys})`,
    );
  }
  const status = entries!.status!;
  if (
    entries!.spec !== (def.specSchema as unknown) ||
    status.type !== "optional" ||
    status.wrapped !== def.statusSchema
  ) {
    throw new SchemaConversionError(
      def.kind,
      "schema.spec/status must be specSchema and v.optional(statusSchema)",
    );
  }
}

/** The CustomResourceDefinition object for one kind (apiextensions.k8s.io/v1). */
export function buildCrd(def: KindDef): Record<string, unknown> {
  checkShape(def);
  const root: JSONSchemaProps = {
    description: def.description,
    type: "object",
    properties: {
      apiVersion: { description: K8S_API_VERSION_DOC, type: "string" },
      kind: { description: K8S_KIND_DOC, type: "string" },
      metadata: { type: "object" },
      spec: toOpenApi(def.specSchema, "spec"),
      status: toOpenApi(def.statusSchema, "status"),
    },
    required: ["spec"],
  };
  const version: Record<string, unknown> = {
    name: def.version,
    served: true,
    storage: true,
    schema: { openAPIV3Schema: sortKeys(root) },
    subresources: { status: {} },
    additionalPrinterColumns: def.printerColumns.map((c) => ({ ...c })),
  };
  if (def.selectableFields.length > 0) {
    version.selectableFields = def.selectableFields.map((jsonPath) => ({ jsonPath }));
  }
  return {
    apiVersion: "apiextensions.k8s.io/v1",
    kind: "CustomResourceDefinition",
    metadata: { name: `${def.plural}.${def.group}` },
    spec: {
      group: def.group,
      names: {
        kind: def.kind,
        listKind: def.listKind,
        plural: def.plural,
        singular: def.singular,
        shortNames: [...def.shortNames],
        categories: [...def.categories],
      },
      scope: def.scope,
      versions: [version],
    },
  };
}

export const GENERATED_HEADER =
  "# Generated by `bun run gen` (scripts/gen-crds.ts) from api/*.ts. DO NOT EDIT.\n";

/** helm/distort/crds file name, kubebuilder style: <group>_<plural>.yaml. */
export function crdFileName(def: KindDef): string {
  return `${def.group}_${def.plural}.yaml`;
}

/** One CRD as YAML. YAML 1.1 quoting so Go's YAML decoder never reads "True" or "on" as a boolean. */
export function renderCrd(def: KindDef): string {
  const body = YAML.stringify(buildCrd(def), {
    version: "1.1",
    lineWidth: 0,
    indentSeq: false,
    aliasDuplicateObjects: false,
  });
  return GENERATED_HEADER + body;
}

/** Every CRD keyed by file name; deterministic, so the drift test can compare bytes. */
export function renderCrds(): Map<string, string> {
  const out = new Map<string, string>();
  for (const def of Object.values(kinds) as KindDef[]) out.set(crdFileName(def), renderCrd(def));
  return out;
}
