#!/bin/sh
# Fetches Debian's kernel package (what linux-image-$ARCH depends on) with
# apt-get download, extracts it with dpkg-deb -x (nothing is installed) and
# builds modules.dep, then prints the extracted root (boot/vmlinuz-KVER,
# lib/modules/KVER). Reuses $CACHE (default out/kernel) and, when present,
# the ramdisk build's cache (out/ramdisk/cache). Used by VM tests that need
# kernel features this machine's kernel lacks (e.g. 802.1Q VLANs), and by
# scripts/build-ramdisk.sh.
#
# ARCH (default amd64) is amd64 or arm64. A foreign architecture is resolved
# and downloaded through scripts/apt-foreign.sh (a private apt state under
# $CACHE/apt-$ARCH): neither root nor `dpkg --add-architecture` is needed.
set -eu
cd "$(dirname "$0")/.."
REPO=$(pwd)
ARCH=${ARCH:-amd64}
case $ARCH in amd64 | arm64) ;; *) echo "fetch-kernel: ARCH must be amd64 or arm64 (got '$ARCH')" >&2; exit 2 ;; esac
# The caches are per architecture: root-VERSION for amd64 (the layout
# earlier builds left), root-arm64-VERSION for arm64.
if [ "$ARCH" = amd64 ]; then TAG=; else TAG=$ARCH-; fi
for c in "${CACHE:-$REPO/out/kernel}"/root-"$TAG"[0-9]*/.done "$REPO"/out/ramdisk/cache/root-"$TAG"[0-9]*/.done; do
	if [ -f "$c" ]; then dirname "$c"; exit 0; fi
done
CACHE=${CACHE:-$REPO/out/kernel}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
for tool in apt-get apt-cache dpkg-deb depmod; do
	command -v "$tool" >/dev/null 2>&1 || { echo "fetch-kernel: $tool not found (Debian package apt, dpkg, kmod)" >&2; exit 1; }
done
if [ "$ARCH" = "$(dpkg --print-architecture)" ]; then
	resolve() { apt-cache depends "linux-image-$ARCH" 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}'; }
	download() { apt-get download "$1:$ARCH" >/dev/null; }
	PKG=${KERNEL_PKG:-$(resolve)}
	if [ -z "$PKG" ] && [ "$(id -u)" = 0 ]; then
		apt-get update -qq >/dev/null
		PKG=$(resolve)
	fi
else
	resolve() { ARCH=$ARCH CACHE=$CACHE sh "$REPO/scripts/apt-foreign.sh" depends "linux-image-$ARCH" 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}'; }
	download() { ARCH=$ARCH CACHE=$CACHE sh "$REPO/scripts/apt-foreign.sh" download "$1"; }
	PKG=${KERNEL_PKG:-$(resolve)}
fi
case $PKG in linux-image-[0-9]*-"$ARCH") ;; *) echo "fetch-kernel: cannot resolve the $ARCH kernel package (got '$PKG')" >&2; exit 1 ;; esac
KVER=${PKG#linux-image-}
DEB=$(ls "$CACHE"/"$PKG"_*.deb 2>/dev/null | head -n1 || true)
if [ -z "$DEB" ]; then
	(cd "$CACHE" && download "$PKG")
	DEB=$(ls "$CACHE"/"$PKG"_*.deb | head -n1)
fi
[ "$(dpkg-deb -f "$DEB" Architecture)" = "$ARCH" ] || { echo "fetch-kernel: $DEB is not $ARCH" >&2; exit 1; }
ROOT=$CACHE/root-$TAG$(dpkg-deb -f "$DEB" Version)
if [ ! -f "$ROOT/.done" ]; then
	rm -rf "$ROOT"
	dpkg-deb -x "$DEB" "$ROOT"
	depmod -b "$ROOT" "$KVER"
	touch "$ROOT/.done"
fi
echo "$ROOT"
