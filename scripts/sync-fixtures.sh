#!/bin/sh
# Copy the fixture trees the tests use from the shared fixtures folder into
# testdata/fixtures/ (committed, so CI on a clean clone has them). Each tree is
# copied whole with its README/LICENSE files; names containing ':' are skipped.
# Source: $MACHINA_FIXTURES, default <repo>/../shared/fixtures.
# Usage: scripts/sync-fixtures.sh [tree...]   (default: every tree listed below)
set -eu
cd "$(dirname "$0")/.."
SRC=${MACHINA_FIXTURES:-../shared/fixtures}
TREES=${*:-ipmi}
for tree in $TREES; do
	[ -d "$SRC/$tree" ] || { echo "sync-fixtures: $SRC/$tree not found" >&2; exit 1; }
	rm -rf "testdata/fixtures/$tree"
	(cd "$SRC" && find "$tree" -type f ! -name '*:*') | while IFS= read -r f; do
		mkdir -p "testdata/fixtures/$(dirname "$f")"
		cp "$SRC/$f" "testdata/fixtures/$f"
		chmod 644 "testdata/fixtures/$f"
	done
	echo "sync-fixtures: $tree copied"
done
