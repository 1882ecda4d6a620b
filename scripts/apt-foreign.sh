#!/bin/sh
# apt-get for a foreign architecture without root and without touching the
# machine's apt set-up: a private state under $CACHE/apt-$ARCH (its own
# sources list naming Debian's mirrors and suites from this machine's apt
# sources, each for $ARCH; its own package lists; no dpkg status), so no
# `dpkg --add-architecture` and no lock on the system's lists.
#
# Usage: ARCH=arm64 CACHE=DIR scripts/apt-foreign.sh depends PKG
#        ARCH=arm64 CACHE=DIR scripts/apt-foreign.sh closure PKG... (PKG and everything it depends on)
#        ARCH=arm64 CACHE=DIR scripts/apt-foreign.sh download PKG... (into the current folder)
set -eu
: "${ARCH:?ARCH is required}" "${CACHE:?CACHE is required}"
A=$CACHE/apt-$ARCH
mkdir -p "$A/lists/partial" "$A/cache/archives/partial"
if [ ! -s "$A/sources.list" ]; then
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
			sed -E "s#^deb (\\[[^]]*\\] )?#deb [arch=$ARCH signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] #"
	} | sort -u > "$A/sources.list.tmp"
	[ -s "$A/sources.list.tmp" ] || { echo "apt-foreign: no Debian apt sources found in /etc/apt" >&2; exit 1; }
	mv "$A/sources.list.tmp" "$A/sources.list"
fi
OPTS="-o APT::Architecture=$ARCH -o APT::Architectures=$ARCH -o Dir::State::Lists=$A/lists
	-o Dir::State::status=/dev/null -o Dir::Cache=$A/cache -o Dir::Etc::SourceList=$A/sources.list
	-o Dir::Etc::SourceParts=$A/none -o Debug::NoLocking=1"
# shellcheck disable=SC2086
[ -n "$(ls "$A/lists" | grep -v '^partial$' || true)" ] || apt-get $OPTS update -qq >/dev/null
cmd=$1
shift
case $cmd in
# shellcheck disable=SC2086
depends) apt-cache $OPTS depends "$@" ;;
# closure: the packages an install of PKG... into an empty system needs
# (apt's own resolver, no recommends), one name a line.
closure)
	args=""
	for p in "$@"; do args="$args $p:$ARCH"; done
	# shellcheck disable=SC2086
	apt-get $OPTS install -s -qq --no-install-recommends $args 2>/dev/null | awk '$1=="Inst"{sub(/:.*/, "", $2); print $2}' | sort -u ;;
download)
	for p in "$@"; do
		# shellcheck disable=SC2086
		apt-get $OPTS download "$p:$ARCH" 2>&1 >/dev/null | grep -v 'unsandboxed as root' >&2 || true
		ls "${p}"_*_"$ARCH".deb >/dev/null 2>&1 || { echo "apt-foreign: download of $p:$ARCH failed" >&2; exit 1; }
	done ;;
*) echo "apt-foreign: unknown command $cmd" >&2; exit 2 ;;
esac
