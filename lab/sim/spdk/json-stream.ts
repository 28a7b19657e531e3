// Incremental JSON scanner for the RPC receive buffer: finds where the next complete JSON value
// ends (or that it is incomplete or malformed), counts its values the way SPDK's parser does, and
// keeps the raw text of top-level members so the `id` can be echoed exactly as it was written.

/** A parsed JSON value. Objects are plain records; key order is insertion order. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/** One member of the top-level object, with its value's raw bytes (for verbatim id echo). */
export interface TopMember {
  readonly key: string;
  readonly value: JsonValue;
  /** The value exactly as written on the wire. */
  readonly raw: string;
}

/** Result of scanning one value at the front of a buffer. */
export type ScanResult =
  | { readonly kind: "empty" } // only whitespace so far
  | { readonly kind: "incomplete" }
  | { readonly kind: "invalid" }
  | {
      readonly kind: "value";
      readonly value: JsonValue;
      /** Offset just past the value. */
      readonly end: number;
      /** spdk_json_val entries: object/array begin and end, names, and scalars each count one. */
      readonly values: number;
      /** Members of a top-level object in wire order, duplicates included; undefined otherwise. */
      readonly members: readonly TopMember[] | undefined;
      /** True when some object anywhere in the value repeats a key. */
      readonly duplicateKeys: boolean;
    };

const INCOMPLETE = Symbol("incomplete");
const INVALID = Symbol("invalid");

const NUMBER_RE = /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?$/;
const utf8 = new TextDecoder("utf-8", { fatal: true });

function isSpace(b: number | undefined): boolean {
  return b === 0x20 || b === 0x09 || b === 0x0a || b === 0x0d;
}

class Scanner {
  pos: number;
  values = 0;
  duplicateKeys = false;

  constructor(
    readonly buf: Uint8Array,
    start: number,
  ) {
    this.pos = start;
  }

  private peek(): number {
    if (this.pos >= this.buf.length) throw INCOMPLETE;
    return this.buf[this.pos] as number;
  }

  skipSpace(): void {
    while (this.pos < this.buf.length && isSpace(this.buf[this.pos])) this.pos++;
  }

  value(topLevel: boolean): JsonValue {
    this.skipSpace();
    const c = this.peek();
    if (c === 0x7b) return this.object();
    if (c === 0x5b) return this.array();
    if (c === 0x22) {
      this.values++;
      return this.string();
    }
    this.values++;
    if (c === 0x74) return this.literal("true", true);
    if (c === 0x66) return this.literal("false", false);
    if (c === 0x6e) return this.literal("null", null);
    if (c === 0x2d || (c >= 0x30 && c <= 0x39)) return this.number(topLevel);
    throw INVALID;
  }

  private literal<T extends JsonValue>(word: string, v: T): T {
    for (let i = 0; i < word.length; i++) {
      const b = this.buf[this.pos + i];
      if (b === undefined) throw INCOMPLETE;
      if (b !== word.charCodeAt(i)) throw INVALID;
    }
    this.pos += word.length;
    return v;
  }

  private number(topLevel: boolean): number {
    const start = this.pos;
    while (this.pos < this.buf.length) {
      const b = this.buf[this.pos] as number;
      const numeric =
        (b >= 0x30 && b <= 0x39) || b === 0x2d || b === 0x2b || b === 0x2e || b === 0x65 || b === 0x45;
      if (!numeric) break;
      this.pos++;
    }
    // A number that runs into the end of the buffer could still grow, except at the top level,
    // where SPDK takes it as complete (a bare `42` is answered at once).
    if (this.pos >= this.buf.length && !topLevel) throw INCOMPLETE;
    const text = Buffer.from(this.buf.subarray(start, this.pos)).toString("latin1");
    if (!NUMBER_RE.test(text)) throw INVALID;
    return Number(text);
  }

  string(): string {
    const start = this.pos; // at the opening quote
    let i = start + 1;
    for (;;) {
      const b = this.buf[i];
      if (b === undefined) throw INCOMPLETE;
      if (b === 0x22) break;
      if (b < 0x20) throw INVALID;
      if (b === 0x5c) {
        if (this.buf[i + 1] === undefined) throw INCOMPLETE;
        i += 2;
        continue;
      }
      i++;
    }
    this.pos = i + 1;
    let text: string;
    try {
      text = utf8.decode(this.buf.subarray(start, this.pos));
      return JSON.parse(text) as string;
    } catch {
      throw INVALID;
    }
  }

  private object(): { [key: string]: JsonValue } {
    this.pos++; // {
    this.values += 2;
    const out: { [key: string]: JsonValue } = {};
    this.skipSpace();
    if (this.peek() === 0x7d) {
      this.pos++;
      return out;
    }
    for (;;) {
      this.skipSpace();
      if (this.peek() !== 0x22) throw INVALID;
      this.values++;
      const key = this.string();
      this.skipSpace();
      if (this.peek() !== 0x3a) throw INVALID;
      this.pos++;
      const v = this.value(false);
      if (Object.hasOwn(out, key)) this.duplicateKeys = true;
      // defineProperty so that a "__proto__" key stays an ordinary member.
      Object.defineProperty(out, key, { value: v, enumerable: true, writable: true, configurable: true });
      this.skipSpace();
      const c = this.peek();
      this.pos++;
      if (c === 0x2c) continue;
      if (c === 0x7d) return out;
      throw INVALID;
    }
  }

  private array(): JsonValue[] {
    this.pos++; // [
    this.values += 2;
    const out: JsonValue[] = [];
    this.skipSpace();
    if (this.peek() === 0x5d) {
      this.pos++;
      return out;
    }
    for (;;) {
      out.push(this.value(false));
      this.skipSpace();
      const c = this.peek();
      this.pos++;
      if (c === 0x2c) continue;
      if (c === 0x5d) return out;
      throw INVALID;
    }
  }

  /** Like object(), but records every member with its raw text. */
  topObject(): { value: { [key: string]: JsonValue }; members: TopMember[] } {
    this.pos++;
    this.values += 2;
    const value: { [key: string]: JsonValue } = {};
    const members: TopMember[] = [];
    this.skipSpace();
    if (this.peek() === 0x7d) {
      this.pos++;
      return { value, members };
    }
    for (;;) {
      this.skipSpace();
      if (this.peek() !== 0x22) throw INVALID;
      this.values++;
      const key = this.string();
      this.skipSpace();
      if (this.peek() !== 0x3a) throw INVALID;
      this.pos++;
      this.skipSpace();
      const rawStart = this.pos;
      const v = this.value(false);
      const raw = utf8.decode(this.buf.subarray(rawStart, this.pos));
      if (Object.hasOwn(value, key)) this.duplicateKeys = true;
      Object.defineProperty(value, key, { value: v, enumerable: true, writable: true, configurable: true });
      members.push({ key, value: v, raw });
      this.skipSpace();
      const c = this.peek();
      this.pos++;
      if (c === 0x2c) continue;
      if (c === 0x7d) return { value, members };
      throw INVALID;
    }
  }
}

/**
 * Scans the JSON value that starts at `start` (after optional whitespace). Never throws: returns
 * "empty" for whitespace only, "incomplete" when more bytes could complete the value, "invalid"
 * when no continuation could make it JSON. Strings must be valid UTF-8 without raw control bytes;
 * comments and trailing commas are invalid, as in SPDK's RPC parser.
 */
export function scanJsonValue(buf: Uint8Array, start = 0): ScanResult {
  const s = new Scanner(buf, start);
  s.skipSpace();
  if (s.pos >= buf.length) return { kind: "empty" };
  try {
    if (buf[s.pos] === 0x7b) {
      const { value, members } = s.topObject();
      return { kind: "value", value, end: s.pos, values: s.values, members, duplicateKeys: s.duplicateKeys };
    }
    const value = s.value(true);
    return {
      kind: "value",
      value,
      end: s.pos,
      values: s.values,
      members: undefined,
      duplicateKeys: s.duplicateKeys,
    };
  } catch (e) {
    if (e === INCOMPLETE) return { kind: "incomplete" };
    if (e === INVALID) return { kind: "invalid" };
    throw e;
  }
}

/**
 * A reply key with this prefix is written without it (rpc-server.ts), so a result can repeat a
 * key the way some SPDK replies do (bdev_raid_get_bdevs prints "uuid" twice); JSON.stringify
 * alone cannot write a duplicate key.
 */
export const DUPLICATE_KEY_PREFIX = "\u0000dup:";
