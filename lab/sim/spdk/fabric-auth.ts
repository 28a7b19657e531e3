// DH-HMAC-CHAP on the simulated fabric: after a CONNECT the target answers "auth_required" when
// the host entry has a key, and the host runs the exchange through Authentication Send/Receive
// frames whose payloads are the specification's messages (lib/nvme/dhchap-messages.ts). Host and
// controller sides follow Linux (drivers/nvme/host/auth.c) and SPDK (lib/nvmf/auth.c).
import { randomBytes } from "node:crypto";
import type { Logger } from "../../../lib/log.ts";
import {
  controllerResponse,
  type DhchapKey,
  dhchapHash,
  type HashId,
  hostResponse,
  parseDhchapSecret,
  responsesEqual,
  transformDhchapKey,
} from "../../../lib/nvme/dhchap.ts";
import {
  type AuthMessage,
  decodeAuthMessage,
  encodeAuthMessage,
  FAILURE_REASON_FAILED,
  FailureExplanation,
} from "../../../lib/nvme/dhchap-messages.ts";
import {
  type DhGroupId,
  type DhKeyPair,
  dhKeyPair,
  dhSharedValue,
  ffdheGroup,
} from "../../../lib/nvme/ffdhe.ts";
import type { FabricServerConnection } from "./fabric.ts";
import type { Message } from "./fabric-protocol.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";

// Linux EPROTO: a challenge outside what the host offered.
const EPROTO = 71;

/** What the host brings to a connect that may need authentication (nvme connect -S/-C, bdev_nvme dhchap_key). */
export interface HostDhchapOptions {
  /** The host's secret, DHHC-1 form. */
  readonly secret: string;
  /** The controller's secret: when given the host also authenticates the controller. */
  readonly ctrlSecret?: string;
  /** Hash ids offered, default all (1, 2, 3), as both Linux and SPDK hosts do. */
  readonly hashes?: readonly HashId[];
  /** DH group ids offered, default all (0..5). */
  readonly dhgroups?: readonly DhGroupId[];
}

/** A refused authentication, with the errno Linux's host reports (ECONNREFUSED, ENOKEY...). */
export class AuthError extends ErrnoError {
  constructor(
    errno: number,
    readonly detail: string,
  ) {
    super(errno, detail);
  }
}

type Exchange = (msg: Message, payload?: Uint8Array) => Promise<{ msg: Message; payload: Buffer }>;

/**
 * Runs the host side on a connection whose CONNECT was answered "auth_required": negotiate,
 * challenge, reply (with C2 when a controller secret is given), success1 (checking the
 * controller's response), success2. Rejects with AuthError: ENOKEY without a usable host secret,
 * ECONNREFUSED when the controller refuses the host (AUTH_Failure1) or fails to prove its own key
 * (the host then sends AUTH_Failure2), EPROTO for a challenge the host did not offer.
 */
export async function authenticateHost(
  exchange: Exchange,
  opts: {
    readonly hostnqn: string;
    readonly subnqn: string;
    readonly dhchap?: HostDhchapOptions | undefined;
  },
): Promise<void> {
  if (!opts.dhchap)
    throw new AuthError(Errno.ENOKEY, "the target requires DH-HMAC-CHAP and no key was given");
  let hostKey: DhchapKey;
  let ctrlKey: DhchapKey | undefined;
  try {
    hostKey = parseDhchapSecret(opts.dhchap.secret);
    ctrlKey = opts.dhchap.ctrlSecret === undefined ? undefined : parseDhchapSecret(opts.dhchap.ctrlSecret);
  } catch (err) {
    throw new AuthError(Errno.ENOKEY, `invalid DH-HMAC-CHAP secret: ${(err as Error).message}`);
  }
  const hashes = opts.dhchap.hashes ?? [1, 2, 3];
  const dhgroups = opts.dhchap.dhgroups ?? [0, 1, 2, 3, 4, 5];
  // Linux counts transactions per controller; each connection here is a fresh controller.
  const tid = randomBytes(2).readUInt16LE(0);
  const send = async (m: AuthMessage) => {
    const f = await exchange({ op: "auth_send", tag: 0 }, encodeAuthMessage(m));
    if (f.msg.op !== "ok") throw new AuthError(Errno.ECONNREFUSED, "authentication send failed");
  };
  const receive = async (): Promise<AuthMessage> => {
    const f = await exchange({ op: "auth_receive", tag: 0 });
    if (f.msg.op !== "data") throw new AuthError(Errno.ECONNREFUSED, "authentication receive failed");
    try {
      return decodeAuthMessage(f.payload);
    } catch (err) {
      throw new AuthError(EPROTO, (err as Error).message);
    }
  };
  const fail2 = async (explanation: number, errno: number, why: string): Promise<never> => {
    await send({ kind: "failure2", tid, reason: FAILURE_REASON_FAILED, explanation }).catch(() => {});
    throw new AuthError(errno, why);
  };
  const refused = (m: AuthMessage) =>
    m.kind === "failure1"
      ? new AuthError(
          Errno.ECONNREFUSED,
          `DH-HMAC-CHAP refused by the controller (${explain(m.explanation)})`,
        )
      : new AuthError(Errno.ECONNREFUSED, `unexpected authentication message ${m.kind}`);

  await send({ kind: "negotiate", tid, scC: 0, protocols: [{ hashes, dhgroups }] });
  const ch = await receive();
  if (ch.kind !== "challenge" || ch.tid !== tid) throw refused(ch);
  if (!hashes.includes(ch.hashId as HashId) || ch.challenge.length !== dhchapHash(ch.hashId).length) {
    return fail2(FailureExplanation.hashUnusable, EPROTO, `challenge with hash ${ch.hashId}`);
  }
  if (!dhgroups.includes(ch.dhgroupId as DhGroupId) || (ch.dhgroupId === 0) !== (ch.dhValue.length === 0)) {
    return fail2(FailureExplanation.dhgroupUnusable, EPROTO, `challenge with DH group ${ch.dhgroupId}`);
  }
  const hash = ch.hashId as HashId;
  let own: DhKeyPair | undefined;
  let shared: Buffer | undefined;
  if (ch.dhgroupId !== 0) {
    own = dhKeyPair(ffdheGroup(ch.dhgroupId));
    try {
      shared = dhSharedValue(own, ch.dhValue);
    } catch {
      return fail2(FailureExplanation.incorrectPayload, EPROTO, "invalid controller DH value");
    }
  }
  const common = {
    hash,
    transactionId: tid,
    hostnqn: opts.hostnqn,
    subnqn: opts.subnqn,
    sharedValue: shared,
  };
  const response = hostResponse({
    ...common,
    transformedKey: transformDhchapKey(hostKey, opts.hostnqn),
    challenge: ch.challenge,
    seqnum: ch.seqnum,
  });
  const c2 = ctrlKey ? randomBytes(dhchapHash(hash).length) : undefined;
  const s2 = ctrlKey ? randomBytes(4).readUInt32LE(0) || 1 : 0;
  await send({
    kind: "reply",
    tid,
    response,
    ctrlChallenge: c2,
    seqnum: s2,
    dhValue: own?.publicValue ?? Buffer.alloc(0),
  });
  const s1 = await receive();
  if (s1.kind !== "success1" || s1.tid !== tid) throw refused(s1);
  if (s1.hashLength !== dhchapHash(hash).length) {
    return fail2(FailureExplanation.hashUnusable, EPROTO, `success1 with hash length ${s1.hashLength}`);
  }
  if (ctrlKey && c2) {
    const expected = controllerResponse({
      ...common,
      transformedKey: transformDhchapKey(ctrlKey, opts.subnqn),
      challenge: c2,
      seqnum: s2,
    });
    // Linux accepts a Success1 without a response here; a host that asked must get one.
    if (!s1.response || !responsesEqual(s1.response, expected)) {
      return fail2(FailureExplanation.failed, Errno.ECONNREFUSED, "controller authentication failed");
    }
    await send({ kind: "success2", tid });
  }
}

/** The controller's keys for one host, read from the keyring when the host connects. */
export interface TargetKeys {
  /** DHHC-1 text of the host key; undefined when it cannot be read (the host is then refused). */
  readonly hostSecret: string | undefined;
  readonly ctrlSecret: string | undefined;
}

/** Target selection: the first id of each list the host offered (SPDK: strongest first). */
export interface TargetAuthPolicy {
  readonly hashes: readonly HashId[];
  readonly dhgroups: readonly DhGroupId[];
}

/** SPDK's nvmf target: the strongest hash and DH group both sides support (lib/nvmf/auth.c). */
export const SPDK_AUTH_POLICY: TargetAuthPolicy = { hashes: [3, 2, 1], dhgroups: [5, 4, 3, 2, 1, 0] };

type State = "negotiate" | "challenge" | "reply" | "success1" | "success2" | "done" | "failure1" | "failed";

/**
 * The controller side of one connection's authentication. Feed it the host's auth_send and
 * auth_receive frames; `authenticated` turns true after Success1 (unidirectional) or Success2.
 * A failed step leaves it in failure1: the next receive returns AUTH_Failure1 and `failed` becomes
 * true, after which the caller drops the connection (SPDK disconnects the qpair).
 */
export class TargetAuthSession {
  #state: State = "negotiate";
  #explanation: number = FailureExplanation.failed;
  #reason = "";
  #tid = 0;
  #hash: HashId = 1;
  #dhgroup: DhGroupId = 0;
  #c1 = Buffer.alloc(0);
  #s1 = 0;
  #own: DhKeyPair | undefined;
  #ctrlResponse: Buffer | undefined;
  #hostKey: DhchapKey | undefined;
  #ctrlKey: DhchapKey | undefined;

  constructor(
    readonly hostnqn: string,
    readonly subnqn: string,
    keys: TargetKeys,
    private readonly policy: TargetAuthPolicy = SPDK_AUTH_POLICY,
  ) {
    try {
      this.#hostKey = keys.hostSecret === undefined ? undefined : parseDhchapSecret(keys.hostSecret);
      this.#ctrlKey = keys.ctrlSecret === undefined ? undefined : parseDhchapSecret(keys.ctrlSecret);
    } catch (err) {
      this.#hostKey = undefined;
      this.#reason = `key unusable: ${(err as Error).message}`;
    }
    if (!this.#hostKey && !this.#reason) this.#reason = "host key unavailable";
  }

  get authenticated(): boolean {
    return this.#state === "done";
  }

  get failed(): boolean {
    return this.#state === "failed";
  }

  /** Why authentication failed (for the target's log); empty while it has not. */
  get reason(): string {
    return this.#state === "failure1" || this.#state === "failed" ? this.#reason : "";
  }

  /** An Authentication Send: always completes (errors surface as Failure1 on the next receive). */
  send(payload: Buffer): undefined {
    let m: AuthMessage;
    try {
      m = decodeAuthMessage(payload);
    } catch {
      return this.#fail(FailureExplanation.incorrectPayload, "undecodable message");
    }
    if (m.kind === "failure2") {
      this.#reason = `host refused the controller (${explain(m.explanation)})`;
      this.#state = "failed";
      return;
    }
    if (m.kind === "negotiate" && this.#state === "negotiate") return this.#negotiate(m);
    if (m.kind === "reply" && this.#state === "reply") return this.#reply(m);
    if (m.kind === "success2" && this.#state === "success2" && m.tid === this.#tid) {
      this.#state = "done";
      return;
    }
    this.#fail(FailureExplanation.incorrectMessage, `${m.kind} in state ${this.#state}`);
  }

  /** An Authentication Receive: the message due in this state. */
  receive(): Buffer {
    switch (this.#state) {
      case "challenge": {
        this.#state = "reply";
        return encodeAuthMessage({
          kind: "challenge",
          tid: this.#tid,
          hashId: this.#hash,
          dhgroupId: this.#dhgroup,
          seqnum: this.#s1,
          challenge: this.#c1,
          dhValue: this.#own?.publicValue ?? Buffer.alloc(0),
        });
      }
      case "success1": {
        this.#state = this.#ctrlResponse ? "success2" : "done";
        return encodeAuthMessage({
          kind: "success1",
          tid: this.#tid,
          hashLength: dhchapHash(this.#hash).length,
          response: this.#ctrlResponse,
        });
      }
      default: {
        if (this.#state !== "failure1")
          this.#fail(FailureExplanation.incorrectMessage, `receive in ${this.#state}`);
        this.#state = "failed";
        return encodeAuthMessage({
          kind: "failure1",
          tid: this.#tid,
          reason: FAILURE_REASON_FAILED,
          explanation: this.#explanation,
        });
      }
    }
  }

  #negotiate(m: Extract<AuthMessage, { kind: "negotiate" }>): undefined {
    this.#tid = m.tid;
    if (m.scC !== 0) return this.#fail(FailureExplanation.concatMismatch, "secure channel concatenation");
    const offer = m.protocols[0];
    if (!offer) return this.#fail(FailureExplanation.incorrectPayload, "no DH-HMAC-CHAP descriptor");
    const hash = this.policy.hashes.find((h) => offer.hashes.includes(h));
    if (hash === undefined) return this.#fail(FailureExplanation.hashUnusable, "no common hash");
    const dhgroup = this.policy.dhgroups.find((g) => offer.dhgroups.includes(g));
    if (dhgroup === undefined) return this.#fail(FailureExplanation.dhgroupUnusable, "no common DH group");
    if (!this.#hostKey) return this.#fail(FailureExplanation.failed, this.#reason);
    this.#hash = hash;
    this.#dhgroup = dhgroup;
    this.#c1 = randomBytes(dhchapHash(hash).length);
    this.#s1 = randomBytes(4).readUInt32LE(0) || 1;
    this.#own = dhgroup === 0 ? undefined : dhKeyPair(ffdheGroup(dhgroup));
    this.#state = "challenge";
  }

  #reply(m: Extract<AuthMessage, { kind: "reply" }>): undefined {
    const hostKey = this.#hostKey as DhchapKey;
    if (m.tid !== this.#tid) return this.#fail(FailureExplanation.incorrectMessage, "transaction id");
    if (m.response.length !== this.#c1.length)
      return this.#fail(FailureExplanation.hashUnusable, "hash length");
    let shared: Buffer | undefined;
    if (this.#own) {
      try {
        shared = dhSharedValue(this.#own, m.dhValue);
      } catch {
        return this.#fail(FailureExplanation.incorrectPayload, "invalid host DH value");
      }
    } else if (m.dhValue.length > 0) {
      return this.#fail(FailureExplanation.incorrectPayload, "DH value with the NULL group");
    }
    const common = {
      hash: this.#hash,
      transactionId: this.#tid,
      hostnqn: this.hostnqn,
      subnqn: this.subnqn,
      sharedValue: shared,
    };
    const expected = hostResponse({
      ...common,
      transformedKey: transformDhchapKey(hostKey, this.hostnqn),
      challenge: this.#c1,
      seqnum: this.#s1,
    });
    if (!responsesEqual(expected, m.response))
      return this.#fail(FailureExplanation.failed, "host response mismatch");
    if (m.ctrlChallenge) {
      if (!this.#ctrlKey)
        return this.#fail(FailureExplanation.failed, "controller authentication asked, no controller key");
      this.#ctrlResponse = controllerResponse({
        ...common,
        transformedKey: transformDhchapKey(this.#ctrlKey, this.subnqn),
        challenge: m.ctrlChallenge,
        seqnum: m.seqnum,
      });
    }
    this.#state = "success1";
  }

  #fail(explanation: number, reason: string): undefined {
    this.#explanation = explanation;
    this.#reason = reason;
    this.#state = "failure1";
  }
}

function explain(code: number): string {
  const name = Object.entries(FailureExplanation).find(([, v]) => v === code)?.[0];
  return name ? `${name} (${code})` : `explanation ${code}`;
}

/**
 * Serves one Authentication Send/Receive frame of a target connection: a send is completed with
 * "ok", a receive with "data" carrying the due message. Without a session (no CONNECT asked for
 * authentication) the connection is dropped; after a failure it is dropped shortly after the
 * host had the chance to read AUTH_Failure1, as SPDK disconnects the qpair.
 */
export function serveAuthFrame(
  auth: TargetAuthSession | undefined,
  conn: FabricServerConnection,
  msg: Extract<Message, { op: "auth_send" | "auth_receive" }>,
  payload: Buffer,
  log: Logger,
): void {
  if (!auth) {
    conn.close();
    return;
  }
  if (msg.op === "auth_send") {
    auth.send(payload);
    conn.send({ op: "ok", tag: msg.tag });
  } else {
    conn.send({ op: "data", tag: msg.tag }, auth.receive());
  }
  if (auth.failed) {
    log.info("DH-HMAC-CHAP failed", { nqn: auth.subnqn, host: auth.hostnqn, reason: auth.reason });
    setTimeout(() => conn.close(), FAILURE_DISCONNECT_MS);
  }
}

// SPDK waits before disconnecting a qpair whose authentication failed.
const FAILURE_DISCONNECT_MS = 100;
