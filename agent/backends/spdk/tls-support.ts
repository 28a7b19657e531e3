// Whether an SPDK target can serve NVMe/TCP TLS with a PSK, judged from spdk_get_version. SPDK up
// to v25.x passes a NULL salt to OpenSSL's HKDF when it derives the retained and TLS PSKs; OpenSSL
// 3.0.17 and later refuse that, so nvmf_subsystem_add_host with a psk fails (-32603) and every
// initiator gets -19. SPDK v26.01 fixed it (commit 197ff0c9a5); an image may carry the fix as a
// backport, which its version string cannot show, so the agent is told (DISTORT_SPDK_TLS_SALT_FIX).
import type { SpdkVersion } from "../../../lib/spdk/schemas.ts";

/** The first release with the fix, and the fix commit (abbreviated as SPDK prints commits). */
export const TLS_SALT_FIX = { major: 26, minor: 1, commit: "197ff0c9a5" } as const;

/** The verdict: supported, or the reason in words for the partition's condition. */
export type TlsSupport = { ok: true } | { ok: false; why: string };

/**
 * Judges `v`. Supported: v26.01 or later; a build whose commit is the fix commit; or
 * `backported` (the operator says the image carries 197ff0c9a5). Anything else is refused with a
 * message naming the version and the fix.
 */
export function tlsSupport(v: SpdkVersion, backported: boolean): TlsSupport {
  const f = v.fields;
  const fixedRelease =
    f.major > TLS_SALT_FIX.major || (f.major === TLS_SALT_FIX.major && f.minor >= TLS_SALT_FIX.minor);
  const atFix =
    f.commit !== undefined && f.commit.length >= 7 && TLS_SALT_FIX.commit.startsWith(f.commit.slice(0, 10));
  if (fixedRelease || atFix || backported) return { ok: true };
  return {
    ok: false,
    why: `the SPDK target (${v.version}) lacks commit ${TLS_SALT_FIX.commit} ("nvme: Do not use NULL salt in OpenSSL for TLS-PSK", in v26.01): with OpenSSL 3.0.17 or later it cannot derive a TLS PSK, so TLS volumes are refused on this node. Run SPDK v26.01 or later, or set DISTORT_SPDK_TLS_SALT_FIX=true on an image that carries the backport`,
  };
}
