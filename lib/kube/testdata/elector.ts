// A leader-election candidate as its own process, for the leader election integration test:
// prints one JSON line per transition with a wall-clock timestamp, and "tick" lines while leading.
import { realClock } from "../../clock.ts";
import { silentLogger } from "../../log.ts";
import { connect } from "../connection.ts";
import { LeaderElector } from "../leader.ts";

const [kubeconfig, namespace, identity] = process.argv.slice(2) as [string, string, string];
const say = (ev: string) => process.stdout.write(`${JSON.stringify({ ev, id: identity, t: Date.now() })}\n`);
const elector = new LeaderElector(connect(kubeconfig), {
  namespace,
  name: "test-lease",
  identity,
  leaseDurationMs: 3000,
  renewDeadlineMs: 2000,
  retryPeriodMs: 500,
  clock: realClock,
  logger: silentLogger,
  async onStartedLeading(signal) {
    say("start");
    while (!signal.aborted) {
      say("tick");
      await Bun.sleep(100);
    }
  },
  onStoppedLeading: () => say("stop"),
});
process.on("SIGTERM", async () => {
  await elector.stop();
  say("exit");
  process.exit(0);
});
say("ready");
elector.start();
