#!/bin/sh
# Builds (once per version of lab/vm/osimage/build.sh) or reuses the VM lab's Debian 12 OS image, cached
# outside the repository in ${XDG_CACHE_HOME:-$HOME/.cache}/machina/os-image/<key>/{os.img,SHA256SUMS}.
# Prints "<path> <sha256>". Needs root for a build. Usage: scripts/lab/build-os-image.sh [CACHEDIR]
set -eu
cd "$(dirname "$0")/../.."
exec go run ./cmd/lab-os-image "$@"
