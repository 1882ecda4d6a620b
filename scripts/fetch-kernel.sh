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
# and downloaded through a private apt state under $CACHE/apt-$ARCH (its own
# sources list naming Debian's mirrors from this machine's apt sources, its
# own package lists, no dpkg status), so neither root nor
# `dpkg --add-architecture` is needed and the machine's apt set-up is not
# touched.
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
APTOPTS=
if [ "$ARCH" != "$(dpkg --print-architecture)" ]; then
	A=$CACHE/apt-$ARCH
	mkdir -p "$A/lists/partial" "$A/cache/archives/partial"
	# Debian's mirrors and suites as this machine's apt knows them (deb822
	# .sources and one-line .list files), each for the foreign architecture.
	{
		cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '
			/^URIs:/ {u=$2} /^Suites:/ {s=""; for (i=2;i<=NF;i++) s=s" "$i}
			/^Components:/ {c=""; for (i=2;i<=NF;i++) c=c" "$i}
			/^Signed-By:/ {k=$2}
			/^$/ {if (u!="") print u "|" s "|" c "|" k; u=""}
			END {if (u!="") print u "|" s "|" c "|" k}' |
			while IFS='|' read -r u s c k; do
				for suite in $s; do echo "deb [arch=$ARCH signed-by=${k:-/usr/share/keyrings/debian-archive-keyring.gpg}] $u $suite$c"; done
			done
		grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
			sed -E "s#^deb (\[[^]]*\] )?#deb [arch=$ARCH signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] #"
	} | sort -u > "$A/sources.list"
	[ -s "$A/sources.list" ] || { echo "fetch-kernel: no Debian apt sources found in /etc/apt" >&2; exit 1; }
	APTOPTS="-o APT::Architecture=$ARCH -o APT::Architectures=$ARCH -o Dir::State::Lists=$A/lists
		-o Dir::State::status=/dev/null -o Dir::Cache=$A/cache -o Dir::Etc::SourceList=$A/sources.list
		-o Dir::Etc::SourceParts=$A/none -o Debug::NoLocking=1"
	# shellcheck disable=SC2086
	[ -n "$(ls "$A/lists" 2>/dev/null | grep -v partial)" ] || apt-get $APTOPTS update -qq >/dev/null
fi
# shellcheck disable=SC2086
resolve() { apt-cache $APTOPTS depends "linux-image-$ARCH" 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}'; }
PKG=${KERNEL_PKG:-$(resolve)}
if [ -z "$PKG" ] && [ "$(id -u)" = 0 ] && [ -z "$APTOPTS" ]; then
	apt-get update -qq >/dev/null
	PKG=$(resolve)
fi
case $PKG in linux-image-[0-9]*-"$ARCH") ;; *) echo "fetch-kernel: cannot resolve the $ARCH kernel package (got '$PKG')" >&2; exit 1 ;; esac
KVER=${PKG#linux-image-}
DEB=$(ls "$CACHE"/"$PKG"_*.deb 2>/dev/null | head -n1 || true)
if [ -z "$DEB" ]; then
	# shellcheck disable=SC2086
	(cd "$CACHE" && apt-get $APTOPTS download "$PKG:$ARCH" >/dev/null)
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
