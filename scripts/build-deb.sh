#!/bin/sh
# Builds bin/machina_VERSION_amd64.deb with nfpm (pinned, run from the Go
# module proxy): machina, machinactl and machina-node built here
# (-trimpath, stripped), packaging/deb/ and, when built
# (make ramdisk), out/ramdisk/ (installed as /usr/lib/machina/ramdisk/).
# VERSION defaults to 0.1.0~git<commit time>.<short hash>.
set -eu
cd "$(dirname "$0")/.."
GO=${GO:-go}
NFPM_VERSION=v2.45.2
OUTDIR=${OUTDIR:-$(pwd)/bin}
if [ -z "${VERSION:-}" ]; then
	VERSION="0.1.0~git$(git log -1 --format=%cd --date=format:%Y%m%d%H%M%S).$(git rev-parse --short=12 HEAD)"
fi
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
BIN=$BUILD/bin
mkdir -p "$BIN" "$OUTDIR"
CGO_ENABLED=0 $GO build -trimpath -ldflags "-s -w" -o "$BIN/" ./cmd/machina ./cmd/machinactl ./cmd/machina-node
# The default configuration: every serve key with its default and help.
env -i "$BIN/machina" serve --print-config > "$BUILD/machina.yaml.default"
# nfpm expands ${VERSION} itself; the content paths are filled here.
sed -e "s|\${BIN}|$BIN|g" -e "s|\${BUILD}|$BUILD|g" packaging/deb/nfpm.yaml > "$BUILD/nfpm.in"
cp "$BUILD/nfpm.in" "$BUILD/nfpm.yaml"
if [ -f out/ramdisk/vmlinuz ] && [ -f out/ramdisk/initrd.cpio.gz ]; then
	for f in vmlinuz initrd.cpio.gz manifest.txt; do
		[ -f "out/ramdisk/$f" ] || continue
		printf '  - src: %s\n    dst: /usr/lib/machina/ramdisk/%s\n    file_info: {mode: 0644}\n' "$(pwd)/out/ramdisk/$f" "$f" >> "$BUILD/nfpm.contents"
	done
	echo "build-deb: with the ramdisk from out/ramdisk"
else
	echo "build-deb: no out/ramdisk (make ramdisk): the package has no ramdisk; install vmlinuz and initrd.cpio.gz in /usr/lib/machina/ramdisk/ yourself"
fi
if [ -f "$BUILD/nfpm.contents" ]; then
	# Insert the ramdisk entries at the end of contents:, before scripts:.
	awk -v extra="$BUILD/nfpm.contents" '/^scripts:/ { while ((getline l < extra) > 0) print l } { print }' "$BUILD/nfpm.in" > "$BUILD/nfpm.yaml"
fi
OUT="$OUTDIR/machina_$(echo "$VERSION" | sed 's/^[0-9]*://')_amd64.deb"
rm -f "$OUT"
VERSION="$VERSION" BIN="$BIN" BUILD="$BUILD" $GO run "github.com/goreleaser/nfpm/v2/cmd/nfpm@$NFPM_VERSION" package \
	--config "$BUILD/nfpm.yaml" --packager deb --target "$OUT"
echo "build-deb: $OUT"
