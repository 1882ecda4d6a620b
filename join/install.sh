#!/bin/sh
# Machina install script: installs machina-node and joins this host to the
# controller. Served by the join listener at /join/install.sh (its SHA-256
# is pinned by the first-boot command) and shipped in `machinactl bundle`.
#
# Usage: install.sh --join URL [TOKEN|-] --fingerprint HEX [--ca FILE] [--bundle DIR]
#   The enrolment token comes from MACHINA_JOIN_TOKEN, or the argument after
#   URL ("-" reads one line from stdin). --ca is the controller CA (PEM),
#   already checked against --fingerprint; --bundle installs machina-node
#   from DIR instead of downloading it. MACHINA_PREFIX installs under a
#   directory instead of / and skips systemd (tests).
set -eu
url=""; token="${MACHINA_JOIN_TOKEN:-}"; ca=""; bundle=""; fp=""
prefix="${MACHINA_PREFIX:-}"
die() { echo "machina-install: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
	case "$1" in
	--join)
		[ $# -ge 2 ] || die "--join needs a URL"
		url="$2"; shift 2
		if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then token="$1"; shift; fi ;;
	--ca) [ $# -ge 2 ] || die "--ca needs a file"; ca="$2"; shift 2 ;;
	--fingerprint) [ $# -ge 2 ] || die "--fingerprint needs a value"; fp="$2"; shift 2 ;;
	--bundle) [ $# -ge 2 ] || die "--bundle needs a directory"; bundle="$2"; shift 2 ;;
	*) die "unknown argument $1" ;;
	esac
done
if [ "$token" = "-" ]; then IFS= read -r token || true; fi
[ -n "$url" ] || die "missing --join URL"
[ -n "$token" ] || die "missing enrolment token (MACHINA_JOIN_TOKEN, or --join URL TOKEN)"
case "$url" in https://*) ;; *) die "join URL must be https://" ;; esac
if [ -n "$bundle" ]; then
	[ -n "$ca" ] || ca="$bundle/ca.pem"
	[ -n "$fp" ] || fp="$(cat "$bundle/ca.sha256")"
fi
[ -n "$ca" ] && [ -f "$ca" ] || die "missing --ca FILE"
[ -n "$fp" ] || die "missing --fingerprint"
got="$(openssl x509 -in "$ca" -noout -pubkey | openssl pkey -pubin -outform DER | sha256sum | cut -d' ' -f1)"
[ "$got" = "$fp" ] || die "CA fingerprint mismatch: got $got, want $fp"

bindir="$prefix/usr/local/bin"
state="$prefix/var/lib/machina-node"
mkdir -p "$bindir" "$state"
chmod 0700 "$state"
if [ -n "$bundle" ]; then
	cp "$bundle/machina-node" "$bindir/machina-node.tmp"
else
	case "$(uname -m)" in
	x86_64 | amd64) arch=amd64 ;;
	aarch64 | arm64) arch=arm64 ;;
	*) die "no machina-node build for this machine ($(uname -m)); Machina ships amd64 and arm64" ;;
	esac
	curl -fsS --max-time 120 --cacert "$ca" -o "$bindir/machina-node.tmp" "$url/join/machina-node?arch=$arch" || die "download machina-node ($arch) from $url failed"
fi
chmod 0755 "$bindir/machina-node.tmp"
mv "$bindir/machina-node.tmp" "$bindir/machina-node"
cp "$ca" "$state/ca.pem"

MACHINA_JOIN_TOKEN="$token" "$bindir/machina-node" join --url "$url" --fingerprint "$fp" --dir "$state"
if [ -z "$prefix" ]; then
	"$bindir/machina-node" install-unit --url "$url" --dir "$state"
fi
echo "machina-install: joined $url"
