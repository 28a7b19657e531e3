// NVMe/TCP TLS on the sim fabric, a stand-in for the TLS 1.3 handshake with an external PSK: before
// any NVMe frame the host presents the PSK identity (NVMe0R01 <hostnqn> <subnqn>), a nonce and a
// binder keyed with the TLS PSK it derived (HKDF from its configured PSK, lib/nvme/tls-psk.ts); the
// target finds the PSK for that identity among its hosts, checks the binder and answers with a
// Finished MAC the host checks in turn. Unlike TLS, nothing is encrypted afterwards and there is no
// (EC)DHE: it proves that both ends hold the same PSK for that identity, which is what admission
// on a secure listener depends on.
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { parseInterchangePsk, pskIdentity, retainedPsk, tlsPsk } from "../../../lib/nvme/tls-psk.ts";
import type { Message } from "./fabric-protocol.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";

/** The TLS PSK both ends key the exchange with, from the configured (interchange) PSK. */
export function handshakeKey(interchange: string, hostNqn: string, subNqn: string): Buffer {
  const identity = pskIdentity(hostNqn, subNqn);
  return tlsPsk(retainedPsk(parseInterchangePsk(interchange), hostNqn), identity);
}

function mac(key: Uint8Array, label: string, ...parts: string[]): string {
  const h = createHmac("sha256", key).update(label);
  for (const p of parts) h.update("\0").update(p);
  return h.digest("hex");
}

function same(a: string, b: string): boolean {
  const x = Buffer.from(a, "hex");
  const y = Buffer.from(b, "hex");
  return x.length === y.length && x.length > 0 && timingSafeEqual(x, y);
}

/**
 * Host side, on one queue's fresh connection: the handshake for `psk` (interchange form) as
 * `hostNqn` to `subNqn`. Rejects with ErrnoError EIO when the target drops the connection (no
 * PSK for the identity, another PSK) or its Finished does not check out, as SPDK's initiator
 * reports a failed TLS connect (-5).
 */
export async function tlsConnect(
  request: (m: Message) => Promise<{ msg: Message }>,
  psk: string,
  hostNqn: string,
  subNqn: string,
): Promise<void> {
  const key = handshakeKey(psk, hostNqn, subNqn);
  const identity = pskIdentity(hostNqn, subNqn);
  const nonce = randomBytes(32).toString("hex");
  const reply = await request({
    op: "tls_client_hello",
    tag: 0,
    identity,
    nonce,
    binder: mac(key, "binder", identity, nonce),
  });
  if (
    reply.msg.op !== "tls_server_hello" ||
    !same(reply.msg.finished, mac(key, "finished", nonce, reply.msg.nonce))
  )
    throw new ErrnoError(Errno.EIO, "TLS handshake failed");
}

/** Where the target looks a PSK up: the configured PSK of `hostNqn` on `subNqn`, if it has one. */
export type PskLookup = (hostNqn: string, subNqn: string) => string | undefined;

/**
 * Target side, for the first frame on a secure listener: the reply that completes the handshake,
 * or undefined when the connection must be dropped (not a ClientHello, an identity of another
 * form, no PSK for it, a binder made with another PSK), with the reason for the log.
 */
export function tlsAccept(
  msg: Message,
  lookup: PskLookup,
): { reply: Message; hostNqn: string; subNqn: string } | { drop: string } {
  if (msg.op !== "tls_client_hello") return { drop: "not a TLS ClientHello on a secure listener" };
  const m = /^NVMe0R01 (\S+) (\S+)$/.exec(msg.identity);
  if (!m) return { drop: `unsupported PSK identity ${msg.identity}` };
  const [hostNqn, subNqn] = [m[1] as string, m[2] as string];
  const psk = lookup(hostNqn, subNqn);
  if (psk === undefined) return { drop: `Could not find PSK for identity: ${msg.identity}` };
  let key: Buffer;
  try {
    key = handshakeKey(psk, hostNqn, subNqn);
  } catch {
    return { drop: "the host's PSK does not parse" };
  }
  if (!same(msg.binder, mac(key, "binder", msg.identity, msg.nonce)))
    return { drop: "spdk_sock_recv() failed, errno 107: Transport endpoint is not connected" };
  const nonce = randomBytes(32).toString("hex");
  return {
    reply: { op: "tls_server_hello", tag: msg.tag, nonce, finished: mac(key, "finished", msg.nonce, nonce) },
    hostNqn,
    subNqn,
  };
}
