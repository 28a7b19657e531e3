#!/usr/bin/env bash
# Installs the Debian packages the integration tier and the lab drive for real (parted, mkfs.xfs,
# losetup/partx, openssl, setpriv; for the real-cluster lab containerd, runc, the CNI plugins,
# iptables, buildah and mmdebstrap, busybox for the small images; fio for the block-path benches)
# when a command is missing.
# Needs root for apt-get; prints what it would need otherwise. Idempotent and quick when everything
# is present.
set -euo pipefail
declare -A pkg_of=(
  [parted]=parted [partx]=util-linux [losetup]=util-linux [setpriv]=util-linux [wipefs]=util-linux
  [mkfs.ext4]=e2fsprogs [mkfs.xfs]=xfsprogs [openssl]=openssl [blkid]=util-linux
  [containerd]=containerd [runc]=runc [buildah]=buildah [mmdebstrap]=mmdebstrap
  [iptables]=iptables [conntrack]=conntrack [/usr/lib/cni/bridge]=containernetworking-plugins
  [/bin/busybox]=busybox-static [nsenter]=util-linux [fio]=fio
)
missing=()
for cmd in "${!pkg_of[@]}"; do
  if [[ $cmd == /* ]]; then [ -x "$cmd" ] && continue; else command -v "$cmd" >/dev/null 2>&1 && continue; fi
  missing+=("${pkg_of[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" != 0 ]; then
  echo "missing host packages (install as root): ${pkgs[*]}" >&2
  exit 1
fi
echo "installing host packages: ${pkgs[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
