// `bun run gen`: regenerates every generated artefact in place — gen/ from proto/ (buf +
// protoc-gen-es) and helm/distort/crds/ from the valibot schemas in api/. Drift tests compare a
// fresh generation against the committed files.
import { join } from "node:path";
import { genCrds } from "./gen-crds.ts";
import { genProto } from "./gen-proto.ts";
import { genValuesSchema } from "./gen-values-schema.ts";

const root = join(import.meta.dir, "..");
await genProto(join(root, "gen"));
await genCrds(join(root, "helm", "distort", "crds"));
await genValuesSchema(join(root, "helm", "distort", "values.schema.json"));
process.stdout.write("generated gen/, helm/distort/crds/ and helm/distort/values.schema.json\n");
