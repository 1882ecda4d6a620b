#!/bin/sh
# Measures `machinactl validate` as a separate process on a generated site
# of 10,000 servers with networks (inventorygen Size.Networks: networks.yaml
# with 201 subnets, every profile's layout with a bond, a pool-mode VLAN
# on the shared tenant subnet and a bridge with a fixed address, each
# server's fixed address): wall time, CPU time (user+sys) and peak RSS per
# run, then the fastest and the median. Target: under 1 s.
#
# BASE=REV (a commit, e.g. main or a hash) also builds machinactl from a
# `git archive` of REV and runs the two binaries alternately on the same
# inventory, RUNS times each, so load on the machine falls on both alike;
# it then prints the ratios of the medians (this tree / REV).
set -eu
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/new" ./cmd/machinactl
bins=new
if [ -n "${BASE:-}" ]; then
	mkdir "$tmp/base-src"
	git archive "$BASE" | tar -x -C "$tmp/base-src"
	(cd "$tmp/base-src" && go build -o "$tmp/base" ./cmd/machinactl)
	bins="base new"
fi
mkdir -p "$tmp/inv"
go run ./bench/geninventory -networks "$tmp/inv"
ls -l "$tmp/inv"
for b in $bins; do
	"$tmp/$b" validate "$tmp/inv" >"$tmp/out" 2>&1 || { cat "$tmp/out"; echo "validate failed ($b): the generated site is not valid" >&2; exit 1; }
	tail -n 3 "$tmp/out"
done
runs=${RUNS:-5}
i=0
while [ $i -lt "$runs" ]; do
	for b in $bins; do
		start=$(date +%s%N)
		if [ -x /usr/bin/time ]; then
			/usr/bin/time -f "%M %U %S" -o "$tmp/time" "$tmp/$b" validate "$tmp/inv" >/dev/null
			read -r rss user sys <"$tmp/time"
			cpu=$(echo "$user $sys" | awk '{printf "%d", ($1 + $2) * 1000}')
			echo "$cpu" >>"$tmp/$b.cpu"
			extra="$cpu ms CPU, $rss KiB peak RSS"
		else
			"$tmp/$b" validate "$tmp/inv" >/dev/null
			extra="(install 'time' for CPU time and peak RSS)"
		fi
		end=$(date +%s%N)
		ms=$(( (end - start) / 1000000 ))
		echo "$ms" >>"$tmp/$b.ms"
		echo "run $i $b: $ms ms wall, $extra"
	done
	i=$((i + 1))
done
median() { sort -n "$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for b in $bins; do
	sort -n "$tmp/$b.ms" | awk -v b="$b" '{a[NR]=$1} END {printf "%s: wall fastest %d ms, median %d ms of %d runs\n", b, a[1], a[int((NR+1)/2)], NR}'
	if [ -f "$tmp/$b.cpu" ]; then
		sort -n "$tmp/$b.cpu" | awk -v b="$b" '{a[NR]=$1} END {printf "%s: CPU fastest %d ms, median %d ms\n", b, a[1], a[int((NR+1)/2)]}'
	fi
done
if [ -n "${BASE:-}" ]; then
	echo "$(median "$tmp/new.ms") $(median "$tmp/base.ms")" | awk '{printf "wall median ratio new/base: %.2f\n", $1 / $2}'
	if [ -f "$tmp/new.cpu" ]; then
		echo "$(median "$tmp/new.cpu") $(median "$tmp/base.cpu")" | awk '{printf "CPU median ratio new/base: %.2f\n", $1 / $2}'
	fi
fi
