#!/bin/sh
# Measures `machinactl validate` on a generated inventory of 10,000 servers,
# 200 profiles and 50 images, as a separate process: wall time and peak RSS
# (VmHWM read by /usr/bin/time, or GNU time's %M). Targets: < 1 s, < 200 MB.
set -eu
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/machinactl" ./cmd/machinactl
go run ./bench/geninventory "$tmp/inv" 2>/dev/null || { mkdir -p "$tmp/inv"; go run ./bench/geninventory "$tmp/inv"; }
ls -l "$tmp/inv"
runs=${RUNS:-5}
i=0
while [ $i -lt "$runs" ]; do
	if [ -x /usr/bin/time ]; then
		/usr/bin/time -f "run $i: %e s wall, %M KiB peak RSS" "$tmp/machinactl" validate "$tmp/inv" >/dev/null
	else
		start=$(date +%s.%N); "$tmp/machinactl" validate "$tmp/inv" >/dev/null; end=$(date +%s.%N)
		echo "run $i: $(echo "$end - $start" | bc) s wall (install 'time' for peak RSS)"
	fi
	i=$((i + 1))
done
