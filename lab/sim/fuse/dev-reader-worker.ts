// Worker thread of a FUSE server: reads /dev/fuse in a blocking loop (a blocking read on the main
// thread would stall its event loop) and posts every request, copied out, to the main thread,
// which answers it by writing /dev/fuse itself. Ends with an { end } message once the connection is gone.
import { readSync } from "node:fs";

/** What the main thread sends to start the loop. */
export interface ReaderStart {
  fd: number;
  bufferSize: number;
}

/** The last message: why reading stopped (an errno code such as ENODEV after unmount). */
export interface ReaderEnd {
  end: string;
}

// Retry: interrupted by a signal, a request the kernel withdrew while it was being read, no data on a
// non-blocking descriptor.
const RETRY = new Set(["EINTR", "ENOENT", "EAGAIN"]);

function run({ fd, bufferSize }: ReaderStart): void {
  const buf = new Uint8Array(bufferSize);
  for (;;) {
    let n: number;
    try {
      n = readSync(fd, buf, 0, bufferSize, null);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== undefined && RETRY.has(code)) continue;
      postMessage({ end: code ?? String(err) } satisfies ReaderEnd);
      return;
    }
    if (n === 0) {
      postMessage({ end: "EOF" } satisfies ReaderEnd);
      return;
    }
    const copy = buf.slice(0, n);
    postMessage(copy.buffer, [copy.buffer]);
  }
}

declare const self: { onmessage: ((e: MessageEvent<ReaderStart>) => void) | null };
self.onmessage = (e) => run(e.data);
