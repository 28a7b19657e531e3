// `bun lab/sim/fuse/serve-memory-files.ts MOUNTPOINT NAME:BYTES...`: mounts block files served from
// memory and serves them until killed or stdin closes; prints "ready" once they can be opened. The
// kill -9 test and the bench run their server in such a child process.
import { mountBlockFiles } from "./block-files.ts";
import { MemoryBlockHandler } from "./memory-block-handler.ts";

const [mountpoint, ...files] = process.argv.slice(2);
if (mountpoint === undefined || files.length === 0) {
  process.stderr.write("usage: serve-memory-files.ts MOUNTPOINT NAME:BYTES...\n");
  process.exit(2);
}
const server = await mountBlockFiles({ mountpoint });
for (const f of files) {
  const [name, bytes] = f.split(":");
  server.add(name as string, new MemoryBlockHandler(Number(bytes)));
}
process.stdout.write("ready\n");
for await (const _ of process.stdin) {
  // serve until stdin closes
}
await server.close();
process.exit(0);
