// keyring_* methods: file-backed keys that DH-HMAC-CHAP and TLS PSK settings refer to by name.
import * as v from "valibot";
import type { App } from "../app.ts";
import { type MethodSpec, RUNTIME } from "../method-table.ts";
import { DECODE_FAILED_PARAMS, decode, noParams, str } from "../params.ts";

/** The keyring methods of `app`. */
export function keyringMethods(app: App): MethodSpec[] {
  return [
    {
      name: "keyring_file_add_key",
      states: RUNTIME,
      handler: (req) => {
        const p = decode(req, v.looseObject({ name: str, path: str }), DECODE_FAILED_PARAMS);
        app.keyring.addFile(p.name, p.path);
        return true;
      },
    },
    {
      name: "keyring_file_remove_key",
      states: RUNTIME,
      handler: (req) => {
        const p = decode(req, v.strictObject({ name: str }), DECODE_FAILED_PARAMS);
        app.keyring.remove(p.name);
        return true;
      },
    },
    {
      name: "keyring_get_keys",
      states: RUNTIME,
      handler: (req) => {
        noParams(req, "keyring_get_keys requires no parameters");
        // A removed key has lost the keyring's own reference and, as SPDK skips the module's
        // dump_info for it, shows no path.
        return app.keyring.listAll().map((k) => ({
          name: k.name,
          module: "keyring_file",
          removed: k.removed === true,
          probed: false,
          refcnt: k.removed ? k.refs : 1 + k.refs,
          ...(k.removed ? {} : { path: k.path }),
        }));
      },
    },
  ];
}
