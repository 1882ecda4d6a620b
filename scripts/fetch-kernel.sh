#!/bin/sh
# Fetches Debian's kernel package (what linux-image-amd64 depends on) with
# apt-get download, extracts it with dpkg-deb -x (nothing is installed) and
# builds modules.dep, then prints the extracted root (boot/vmlinuz-KVER,
# lib/modules/KVER). Reuses $CACHE (default out/kernel) and, when present,
# the ramdisk build's cache (out/ramdisk/cache). Used by VM tests that need
# kernel features this machine's kernel lacks (e.g. 802.1Q VLANs).
set -eu
cd "$(dirname "$0")/.."
REPO=$(pwd)
for c in "${CACHE:-$REPO/out/kernel}"/root-*/.done "$REPO"/out/ramdisk/cache/root-*/.done; do
	if [ -f "$c" ]; then dirname "$c"; exit 0; fi
done
CACHE=${CACHE:-$REPO/out/kernel}
mkdir -p "$CACHE"
for tool in apt-get apt-cache dpkg-deb depmod; do
	command -v "$tool" >/dev/null 2>&1 || { echo "fetch-kernel: $tool not found" >&2; exit 1; }
done
resolve() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}'; }
PKG=${KERNEL_PKG:-$(resolve)}
if [ -z "$PKG" ] && [ "$(id -u)" = 0 ]; then
	apt-get update -qq >/dev/null
	PKG=$(resolve)
fi
case $PKG in linux-image-[0-9]*) ;; *) echo "fetch-kernel: cannot resolve kernel package (got '$PKG')" >&2; exit 1 ;; esac
KVER=${PKG#linux-image-}
DEB=$(ls "$CACHE"/"$PKG"_*.deb 2>/dev/null | head -n1 || true)
if [ -z "$DEB" ]; then
	(cd "$CACHE" && apt-get download "$PKG" >/dev/null)
	DEB=$(ls "$CACHE"/"$PKG"_*.deb | head -n1)
fi
ROOT=$CACHE/root-$(dpkg-deb -f "$DEB" Version)
if [ ! -f "$ROOT/.done" ]; then
	rm -rf "$ROOT"
	dpkg-deb -x "$DEB" "$ROOT"
	depmod -b "$ROOT" "$KVER"
	touch "$ROOT/.done"
fi
echo "$ROOT"
