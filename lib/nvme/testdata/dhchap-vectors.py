# One-off generator of lib/nvme/testdata/dhchap-vectors.json: DH-HMAC-CHAP values computed with
# Python's hmac/hashlib and pow() only (no DISTORT code), formulas read from the NVMe Base
# Specification (DH-HMAC-CHAP protocol) and Linux drivers/nvme/{common,host,target}/auth.c.
# FFDHE primes: `openssl genpkey -genparam -algorithm DH -pkeyopt group:ffdheN` + `openssl asn1parse`
# (OpenSSL 3.0.19), passed as ffdheN.hex files in the working directory.
# Run: python3 dhchap-vectors.py > dhchap-vectors.json
import base64, hashlib, hmac, json, zlib

HASH = {1: "sha256", 2: "sha384", 3: "sha512"}
LEN = {1: 32, 2: 48, 3: 64}
HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:6f1c2d3e-4b5a-4978-8a1b-2c3d4e5f6a7b"
SUBNQN = "nqn.2026-02.io.distort:volume-v1"
SEQ1, SEQ2, TID = 0x12345678, 0x9ABCDEF0, 7

def secret(hh, key):
    return "DHHC-1:%02d:%s:" % (hh, base64.b64encode(key + zlib.crc32(key).to_bytes(4, "little")).decode())

def transform(hh, key, nqn):
    if hh == 0:
        return key
    return hmac.new(key, nqn.encode() + b"NVMe-over-Fabrics", HASH[hh]).digest()

def response(h, tkey, chal, seq, tid, label, first, second):
    msg = chal + seq.to_bytes(4, "little") + tid.to_bytes(2, "little") + b"\0" + label + first.encode() + b"\0" + second.encode()
    return hmac.new(tkey, msg, HASH[h]).digest()

def augmented(h, shared, chal):
    return hmac.new(hashlib.new(HASH[h], shared).digest(), chal, HASH[h]).digest()

cases = []
for h in (1, 2, 3):
    for hh in (0, h):
        n = LEN[h]
        hk, ck = bytes(range(n)), bytes(range(100, 100 + n))
        c1 = hashlib.sha512(b"c1").digest()[:n]
        c2 = hashlib.sha512(b"c2").digest()[:n]
        thk, tck = transform(hh, hk, HOSTNQN), transform(hh, ck, SUBNQN)
        cases.append({
            "hash": h, "keyHash": hh, "dhgroup": 0,
            "hostSecret": secret(hh, hk), "ctrlSecret": secret(hh, ck),
            "transformedHostKey": thk.hex(), "transformedCtrlKey": tck.hex(),
            "c1": c1.hex(), "c2": c2.hex(),
            "hostResponse": response(h, thk, c1, SEQ1, TID, b"HostHost", HOSTNQN, SUBNQN).hex(),
            "ctrlResponse": response(h, tck, c2, SEQ2, TID, b"Controller", SUBNQN, HOSTNQN).hex(),
        })

dh = []
for gid, bits in ((1, 2048), (2, 3072)):
    p = int(open("ffdhe%d.hex" % bits).read().strip(), 16)
    size = bits // 8
    x = int.from_bytes(hashlib.sha256(b"host-x").digest(), "big")
    y = int.from_bytes(hashlib.sha256(b"ctrl-y").digest(), "big")
    hpub, cpub = pow(2, x, p).to_bytes(size, "big"), pow(2, y, p).to_bytes(size, "big")
    shared = pow(int.from_bytes(cpub, "big"), x, p).to_bytes(size, "big")
    assert shared == pow(int.from_bytes(hpub, "big"), y, p).to_bytes(size, "big")
    h = 3 if gid == 2 else 1
    n = LEN[h]
    hk, ck = bytes(range(n)), bytes(range(100, 100 + n))
    c1 = hashlib.sha512(b"c1").digest()[:n]
    c2 = hashlib.sha512(b"c2").digest()[:n]
    thk, tck = transform(h, hk, HOSTNQN), transform(h, ck, SUBNQN)
    a1, a2 = augmented(h, shared, c1), augmented(h, shared, c2)
    dh.append({
        "hash": h, "dhgroup": gid, "primeSha256": hashlib.sha256(p.to_bytes(size, "big")).hexdigest(),
        "hostPrivate": "%064x" % x, "ctrlPrivate": "%064x" % y,
        "hostPublicSha256": hashlib.sha256(hpub).hexdigest(), "ctrlPublicSha256": hashlib.sha256(cpub).hexdigest(),
        "sharedSha256": hashlib.sha256(shared).hexdigest(),
        "hostSecret": secret(h, hk), "ctrlSecret": secret(h, ck), "c1": c1.hex(), "c2": c2.hex(),
        "augmentedC1": a1.hex(), "augmentedC2": a2.hex(),
        "hostResponse": response(h, thk, a1, SEQ1, TID, b"HostHost", HOSTNQN, SUBNQN).hex(),
        "ctrlResponse": response(h, tck, a2, SEQ2, TID, b"Controller", SUBNQN, HOSTNQN).hex(),
    })

primes = {}
for gid, bits in ((1, 2048), (2, 3072), (3, 4096), (4, 6144), (5, 8192)):
    primes[str(gid)] = hashlib.sha256(bytes.fromhex(open("ffdhe%d.hex" % bits).read().strip())).hexdigest()

print(json.dumps({"hostnqn": HOSTNQN, "subnqn": SUBNQN, "seq1": SEQ1, "seq2": SEQ2, "tid": TID,
                  "null": cases, "dh": dh, "primeSha256": primes}, indent=1))
