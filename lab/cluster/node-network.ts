// The real-cluster lab's network: host bridge dlab0 (198.18.0.1/24), one network namespace per
// node with a veth to the bridge, node IPs, Pod CIDR routes on the host and between nodes. Every
// thing made is recorded in <dir>/network.json first, so teardown removes exactly that, even
// from another process after a crash.
import { existsSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

export const BRIDGE = "dlab0";
export const BRIDGE_ADDRESS = "198.18.0.1";
export const SERVICE_CIDR = "198.19.255.0/24";
/** The kubernetes Service's ClusterIP: the first address of SERVICE_CIDR. */
export const KUBERNETES_SERVICE_IP = "198.19.255.1";
/** Every node and Pod address lives in this block; no route leads anywhere else. */
export const LAB_BLOCK = "198.18.0.0/15";

/**
 * The lab's two storage networks: every node has an address on each (the node IP on the first),
 * so every volume has two paths, as on a storage node with two ports. Both are on the one bridge.
 */
export const STORAGE_NETWORKS = ["198.18.0.0/24", "198.18.1.0/24"] as const;

/**
 * Node i (1-based) addresses: node IP 198.18.0.(10+i), second-path address 198.18.1.(10+i), Pod
 * CIDR 198.19.i.0/24.
 */
export function nodeAddressing(index: number): {
  ip: string;
  pathIp: string;
  podCidr: string;
  hostLink: string;
} {
  if (!Number.isInteger(index) || index < 1 || index > 200)
    throw new Error(`node index out of range: ${index}`);
  return {
    ip: `198.18.0.${10 + index}`,
    pathIp: `198.18.1.${10 + index}`,
    podCidr: `198.19.${index}.0/24`,
    hostLink: `dlv${index}`,
  };
}

/** The network namespace of node `node`. */
export const netnsName = (node: string) => `dlab-${node}`;

interface NodeRecord {
  index: number;
  netns: string;
}

interface NetworkState {
  /** The bridge was made by this lab (so teardown deletes it). */
  bridge: boolean;
  /** Whether /run/netns was a mount point / existed before this lab's first `ip netns add`. */
  runNetns?: { wasMount: boolean; existed: boolean };
  nodes: Record<string, NodeRecord>;
}

const statePath = (dir: string) => join(dir, "network.json");

function readState(dir: string): NetworkState {
  if (!existsSync(statePath(dir))) return { bridge: false, nodes: {} };
  return JSON.parse(readFileSync(statePath(dir), "utf8")) as NetworkState;
}

function writeState(dir: string, s: NetworkState): void {
  writeFileSync(statePath(dir), `${JSON.stringify(s, null, 2)}\n`);
}

function ip(args: string[], okIf?: RegExp): string {
  const p = Bun.spawnSync(["ip", ...args], { stdout: "pipe", stderr: "pipe" });
  const err = p.stderr.toString();
  if (p.exitCode !== 0 && !okIf?.test(err)) throw new Error(`ip ${args.join(" ")} failed: ${err.trim()}`);
  return p.stdout.toString();
}

function linkExists(name: string, netns?: string): boolean {
  const p = Bun.spawnSync(["ip", ...(netns ? ["-n", netns] : []), "link", "show", name], { stderr: "pipe" });
  return p.exitCode === 0;
}

function netnsExists(name: string): boolean {
  return ip(["netns", "list"])
    .split("\n")
    .some((l) => l.split(" ")[0] === name);
}

function isMountPoint(path: string): boolean {
  return readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .some((l) => l.split(" ")[4] === path);
}

/**
 * Creates the bridge with its address (the API server's), up, unless this lab already made it.
 * Throws if a bridge of that name exists that this lab directory did not make: another lab runs,
 * or a crashed one needs `teardownNetwork` with its own directory.
 */
export function ensureBridge(dir: string): void {
  const s = readState(dir);
  if (s.bridge && linkExists(BRIDGE)) return;
  if (linkExists(BRIDGE)) throw new Error(`${BRIDGE} exists but was not made by the lab in ${dir}`);
  s.bridge = true;
  writeState(dir, s);
  ip(["link", "add", BRIDGE, "type", "bridge"]);
  ip(["addr", "add", `${BRIDGE_ADDRESS}/24`, "dev", BRIDGE]);
  ip(["link", "set", BRIDGE, "up"]);
}

/**
 * Gives node `name` (1-based `index`) its network namespace dlab-<name>, a veth (host dlv<i> on
 * the bridge, eth0 inside with the node IP), IP forwarding inside, routes to every other node's
 * Pod CIDR and the Service CIDR, and the host's route to its Pod CIDR; other nodes get a route to
 * it. Idempotent: a namespace already recorded is kept and its routes re-applied.
 */
export function addNodeNetwork(
  dir: string,
  name: string,
  index: number,
): { netns: string; ip: string; podCidr: string } {
  ensureBridge(dir);
  const s = readState(dir);
  const netns = netnsName(name);
  const { ip: nodeIp, pathIp, podCidr, hostLink } = nodeAddressing(index);
  for (const [other, rec] of Object.entries(s.nodes)) {
    if (other !== name && rec.index === index)
      throw new Error(`node index ${index} already used by ${other}`);
  }
  const recorded = s.nodes[name] !== undefined;
  if (!recorded && netnsExists(netns))
    throw new Error(`netns ${netns} exists but was not made by the lab in ${dir}`);
  if (s.runNetns === undefined) {
    s.runNetns = { wasMount: isMountPoint("/run/netns"), existed: existsSync("/run/netns") };
  }
  s.nodes[name] = { index, netns };
  writeState(dir, s);
  if (!netnsExists(netns)) ip(["netns", "add", netns]);
  if (!linkExists(hostLink))
    ip(["link", "add", hostLink, "type", "veth", "peer", "name", "eth0", "netns", netns]);
  ip(["link", "set", hostLink, "master", BRIDGE, "up"]);
  ip(["-n", netns, "addr", "replace", `${nodeIp}/24`, "dev", "eth0"]);
  ip(["-n", netns, "addr", "replace", `${pathIp}/24`, "dev", "eth0"]);
  ip(["-n", netns, "link", "set", "eth0", "up"]);
  ip(["-n", netns, "link", "set", "lo", "up"]);
  const fwd = Bun.spawnSync(
    ["nsenter", `--net=/run/netns/${netns}`, "--", "sysctl", "-qw", "net.ipv4.ip_forward=1"],
    {
      stderr: "pipe",
    },
  );
  if (fwd.exitCode !== 0) throw new Error(`ip_forward in ${netns}: ${fwd.stderr.toString()}`);
  ip(["route", "replace", podCidr, "via", nodeIp, "dev", BRIDGE]);
  ip(["-n", netns, "route", "replace", SERVICE_CIDR, "via", BRIDGE_ADDRESS, "dev", "eth0"]);
  for (const [other, rec] of Object.entries(s.nodes)) {
    if (other === name) continue;
    const o = nodeAddressing(rec.index);
    ip(["-n", netns, "route", "replace", o.podCidr, "via", o.ip, "dev", "eth0"]);
    if (netnsExists(rec.netns))
      ip(["-n", rec.netns, "route", "replace", podCidr, "via", nodeIp, "dev", "eth0"]);
  }
  return { netns, ip: nodeIp, podCidr };
}

/** Deletes node `name`'s namespace (its veth goes with it) and every route to its Pod CIDR. Idempotent. */
export function removeNodeNetwork(dir: string, name: string): void {
  const s = readState(dir);
  const rec = s.nodes[name];
  if (!rec) return;
  const { podCidr, hostLink } = nodeAddressing(rec.index);
  for (const [other, o] of Object.entries(s.nodes)) {
    if (other !== name && netnsExists(o.netns))
      ip(["-n", o.netns, "route", "del", podCidr], /No such process|Cannot find/);
  }
  if (linkExists(BRIDGE)) ip(["route", "del", podCidr], /No such process/);
  if (netnsExists(rec.netns)) ip(["netns", "del", rec.netns]);
  if (linkExists(hostLink)) ip(["link", "del", hostLink], /Cannot find/);
  delete s.nodes[name];
  writeState(dir, s);
}

/**
 * Removes everything addNodeNetwork and ensureBridge made for this lab directory: namespaces,
 * routes, the bridge, and the /run/netns mount (and directory) `ip netns add` made when they were
 * not there before and no other namespace remains in it. Idempotent; a missing state is a no-op.
 */
export function teardownNetwork(dir: string): void {
  if (!existsSync(statePath(dir))) return;
  for (const name of Object.keys(readState(dir).nodes)) removeNodeNetwork(dir, name);
  const s = readState(dir);
  if (s.bridge && linkExists(BRIDGE)) ip(["link", "del", BRIDGE], /Cannot find/);
  s.bridge = false;
  if (s.runNetns && ip(["netns", "list"]).trim() === "") {
    if (!s.runNetns.wasMount && isMountPoint("/run/netns")) {
      const p = Bun.spawnSync(["umount", "/run/netns"], { stderr: "pipe" });
      if (p.exitCode !== 0) throw new Error(`umount /run/netns: ${p.stderr.toString()}`);
    }
    if (!s.runNetns.existed && existsSync("/run/netns") && !isMountPoint("/run/netns"))
      rmdirSync("/run/netns");
    s.runNetns = undefined;
  }
  writeState(dir, s);
}
