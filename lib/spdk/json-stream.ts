// Incremental framing of SPDK's reply stream: a byte stream of compact JSON objects, each followed
// by a newline, cut into chunks anywhere. Yields each complete object and refuses, as early as
// possible, any byte sequence SPDK would not send, so a desynchronised stream is never trusted.

/** The stream can no longer be trusted; the connection it came from must be dropped. */
export class StreamFramingError extends Error {
  override readonly name = "StreamFramingError";
}

const OPEN_OBJECT = 0x7b; // {
const CLOSE_OBJECT = 0x7d; // }
const OPEN_ARRAY = 0x5b; // [
const CLOSE_ARRAY = 0x5d; // ]
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const NEWLINE = 0x0a;

function isSpace(b: number): boolean {
  return b === 0x20 || b === 0x09 || b === NEWLINE || b === 0x0d;
}

/**
 * Splits a stream of concatenated top-level JSON objects into parsed values. Scanning works on
 * bytes: braces, quotes and backslashes never occur inside a multi-byte UTF-8 sequence, so a chunk
 * boundary inside a character is harmless. Each byte is scanned once, however the stream is cut.
 *
 * Refused (StreamFramingError): a top-level value that is not an object (SPDK's replies always
 * are; v25.05.1 answers an id-less request with a fragment starting mid-object), a newline inside
 * an unfinished object (SPDK writes compact JSON and ends each reply with one newline, so a newline
 * inside means a cut-off fragment had the next reply glued onto it), invalid JSON or UTF-8, and
 * one value larger than `maxValueBytes`. After an error the instance must be discarded.
 * Not reentrant: call push() from one place (the socket's data handler).
 */
export class JsonObjectStream {
  readonly #maxValueBytes: number;
  readonly #decoder = new TextDecoder("utf-8", { fatal: true });
  #buf = new Uint8Array(4096);
  #len = 0; // bytes held
  #scan = 0; // next byte to look at
  #start = -1; // offset of the unfinished object, -1 between objects
  #depth = 0;
  #inString = false;
  #escaped = false;

  constructor(opts: { maxValueBytes: number }) {
    this.#maxValueBytes = opts.maxValueBytes;
  }

  /** Bytes of an unfinished object held back until more data arrives. */
  get pendingBytes(): number {
    return this.#start < 0 ? 0 : this.#len - this.#start;
  }

  /**
   * Feeds one chunk; calls `onValue` for every object it completes, in stream order. Throws
   * StreamFramingError at the first byte that breaks framing; objects completed before that byte
   * have already been delivered.
   */
  push(chunk: Uint8Array, onValue: (value: unknown) => void): void {
    this.#append(chunk);
    const buf = this.#buf;
    for (let i = this.#scan; i < this.#len; i++) {
      const b = buf[i] as number;
      if (this.#depth === 0) {
        if (isSpace(b)) continue;
        if (b !== OPEN_OBJECT) throw this.#error(`expected "{" between replies, got ${describeByte(b)}`);
        this.#start = i;
        this.#depth = 1;
        continue;
      }
      if (b === NEWLINE)
        throw this.#error("newline inside an unfinished reply (a cut-off reply was followed by another)");
      if (this.#inString) {
        if (this.#escaped) this.#escaped = false;
        else if (b === BACKSLASH) this.#escaped = true;
        else if (b === QUOTE) this.#inString = false;
        continue;
      }
      if (b === QUOTE) this.#inString = true;
      else if (b === OPEN_OBJECT || b === OPEN_ARRAY) this.#depth++;
      else if (b === CLOSE_OBJECT || b === CLOSE_ARRAY) {
        this.#depth--;
        if (this.#depth === 0) {
          const value = this.#parse(this.#start, i + 1);
          this.#start = -1;
          onValue(value);
        }
      }
    }
    this.#scan = this.#len;
    this.#compact();
  }

  #parse(from: number, to: number): unknown {
    let text: string;
    try {
      text = this.#decoder.decode(this.#buf.subarray(from, to));
    } catch {
      throw this.#error("reply is not valid UTF-8");
    }
    try {
      return JSON.parse(text);
    } catch (err) {
      throw this.#error(`reply is not valid JSON (${(err as Error).message}): ${preview(text)}`);
    }
  }

  #append(chunk: Uint8Array): void {
    const need = this.#len + chunk.length;
    if (need > this.#buf.length) {
      let size = this.#buf.length * 2;
      while (size < need) size *= 2;
      const grown = new Uint8Array(size);
      grown.set(this.#buf.subarray(0, this.#len));
      this.#buf = grown;
    }
    this.#buf.set(chunk, this.#len);
    this.#len = need;
  }

  /** Drops consumed bytes so the buffer holds at most one unfinished object. */
  #compact(): void {
    if (this.#start < 0) {
      this.#len = 0;
      this.#scan = 0;
      return;
    }
    if (this.#len - this.#start > this.#maxValueBytes) {
      throw this.#error(`a reply exceeds ${this.#maxValueBytes} bytes`);
    }
    if (this.#start > 0) {
      this.#buf.copyWithin(0, this.#start, this.#len);
      this.#len -= this.#start;
      this.#scan -= this.#start;
      this.#start = 0;
    }
  }

  #error(why: string): StreamFramingError {
    return new StreamFramingError(why);
  }
}

function describeByte(b: number): string {
  return b >= 0x20 && b < 0x7f ? `"${String.fromCharCode(b)}"` : `byte 0x${b.toString(16).padStart(2, "0")}`;
}

function preview(text: string): string {
  return text.length <= 120 ? text : `${text.slice(0, 120)}…`;
}
