#!/bin/sh
# Measures `machinactl validate` as a separate process on a generated site
# of 10,000 servers with networks (inventorygen Size.Networks: networks.yaml
# with 201 subnets, every profile's layout with a bond, a pool-mode VLAN
# on the shared tenant subnet and a bridge with a fixed address, each
# server's fixed address): wall time and peak RSS per run, then the
# fastest and the median. Target: under 1 s.
set -eu
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/machinactl" ./cmd/machinactl
mkdir -p "$tmp/inv"
go run ./bench/geninventory -networks "$tmp/inv"
ls -l "$tmp/inv"
"$tmp/machinactl" validate "$tmp/inv" >"$tmp/out" 2>&1 || { cat "$tmp/out"; echo "validate failed: the generated site is not valid" >&2; exit 1; }
tail -n 3 "$tmp/out"
runs=${RUNS:-5}
i=0
while [ $i -lt "$runs" ]; do
	start=$(date +%s%N)
	if [ -x /usr/bin/time ]; then
		/usr/bin/time -f "%M" -o "$tmp/rss" "$tmp/machinactl" validate "$tmp/inv" >/dev/null
		rss="$(cat "$tmp/rss") KiB peak RSS"
	else
		"$tmp/machinactl" validate "$tmp/inv" >/dev/null
		rss="(install 'time' for peak RSS)"
	fi
	end=$(date +%s%N)
	ms=$(( (end - start) / 1000000 ))
	echo "$ms" >>"$tmp/ms"
	echo "run $i: $ms ms wall, $rss"
	i=$((i + 1))
done
sort -n "$tmp/ms" | awk '{a[NR]=$1} END {printf "fastest %d ms, median %d ms of %d runs\n", a[1], a[int((NR+1)/2)], NR}'
