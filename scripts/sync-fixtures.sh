#!/bin/sh
# sync-fixtures.sh copies the fixture trees the tests use from the shared
# fixtures folder into testdata/fixtures/, keeping each tree's LICENSE file(s).
# Files whose names contain ':' are skipped (Go module zips and Windows reject
# them). Run it after the shared fixtures change and commit the result.
#
# Copies the Redfish trees below and the ipmi folder.
# Usage: scripts/sync-fixtures.sh  (source: $MACHINA_FIXTURES, else ../shared/fixtures
# or ../../shared/fixtures next to the repo)
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ -n "${MACHINA_FIXTURES:-}" ]; then
	src="$MACHINA_FIXTURES"
elif [ -d "$root/../shared/fixtures" ]; then
	src="$root/../shared/fixtures"
else
	src="$root/../../shared/fixtures" # git worktrees one level deeper
fi
dst="$root/testdata/fixtures"

# Redfish trees served by bmc/bmcsim and driven by bmc/redfish's vendor table.
REDFISH_TREES="dmtf-public-rackmount1
dell-poweredge-r750-idrac9
hpe-proliant-dl385gen10plusv2-ilo5
lenovo-thinksystem-sr670v2-xcc
supermicro-sys821ge-tnhr-x13
openbmc-bmcweb-stock"

[ -d "$src/redfish" ] || { echo "sync-fixtures: $src/redfish not found" >&2; exit 1; }
mkdir -p "$dst/redfish"
cp "$src/redfish/README.md" "$dst/redfish/README.md"
for t in $REDFISH_TREES; do
	[ -d "$src/redfish/$t" ] || { echo "sync-fixtures: tree $t missing" >&2; exit 1; }
	ls "$src/redfish/$t"/LICENSE* >/dev/null 2>&1 || { echo "sync-fixtures: $t has no LICENSE" >&2; exit 1; }
	rm -rf "$dst/redfish/$t"
	mkdir -p "$dst/redfish/$t"
	(cd "$src/redfish/$t" && find . -type f ! -name '*:*' -print) | while IFS= read -r f; do
		mkdir -p "$dst/redfish/$t/$(dirname "$f")"
		cp "$src/redfish/$t/$f" "$dst/redfish/$t/$f"
	done
done
echo "sync-fixtures: copied $(find "$dst/redfish" -type f | wc -l) files into $dst/redfish"

# IPMI simulator configuration (ipmi_sim lan.conf and sim.emu) used by
# bmc/ipmi's tests; the folder has no LICENSE file: its README says where
# the files come from.
[ -d "$src/ipmi" ] || { echo "sync-fixtures: $src/ipmi not found" >&2; exit 1; }
rm -rf "$dst/ipmi"
mkdir -p "$dst/ipmi"
(cd "$src/ipmi" && find . -type f ! -name '*:*' -print) | while IFS= read -r f; do
	mkdir -p "$dst/ipmi/$(dirname "$f")"
	cp "$src/ipmi/$f" "$dst/ipmi/$f"
	chmod 644 "$dst/ipmi/$f"
done
echo "sync-fixtures: copied $(find "$dst/ipmi" -type f | wc -l) files into $dst/ipmi"
