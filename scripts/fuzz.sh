#!/bin/sh
# scripts/fuzz.sh FUZZTIME: runs every fuzz target (scripts/fuzz-targets.sh)
# for FUZZTIME each, for `make fuzz`. Exits 1 if any target has a real
# finding.
#
# The targets run in FUZZ_LANES lanes side by side (default: the number of
# CPUs, at most 4), each target with one fuzz worker (-parallel 1): a
# target's build (with coverage instrumentation) and its baseline coverage
# run take as long as its fuzzing, and one lane leaves the other CPUs idle
# through them. A lane is a sequence of targets; a lane that finds
# something stops, the others finish their targets.
#
# Go 1.26's fuzz coordinator can fail a target with a bare "context deadline
# exceeded" when -fuzztime ends while a worker is mid-call, under CPU load
# (golang/go#75804, fixed in Go 1.27). A real finding always writes a
# reproducer ("Failing input written to") or reports a panic or a test
# failure. So a run that ends in that bare error, wrote no reproducer and
# whose seed corpus still passes when replayed is run once more; a second
# such run is reported as a flake and not counted as a finding. Anything
# else that exits non-zero fails.
set -u
cd "$(dirname "$0")/.."
FUZZTIME=${1:-10s}
GO=${GO:-go}
lanes=${FUZZ_LANES:-$(nproc 2>/dev/null || echo 1)}
[ "$lanes" -gt 4 ] && lanes=4
[ "$lanes" -lt 1 ] && lanes=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
scripts/fuzz-targets.sh > "$tmp/targets"

# lane N: the targets whose line number is N modulo lanes, one after
# another; writes its flake count to $tmp/flakes.N, exits 1 on a finding.
lane() {
	n=$1
	log="$tmp/log.$n"
	flakes=0
	awk -v n="$n" -v lanes="$lanes" '(NR - 1) % lanes == n' "$tmp/targets" > "$tmp/targets.$n"
	while read -r t; do
		pkg=${t%%:*}; name=${t##*:}
		attempt=1
		while :; do
			if $GO test -run '^$' -fuzz "^$name\$" -fuzztime "$FUZZTIME" -parallel 1 "$pkg" > "$log" 2>&1; then
				{ echo "fuzz $pkg $name for $FUZZTIME"; tail -n 3 "$log"; } > "$log.out"
				cat "$log.out"
				break
			fi
			{ echo "fuzz $pkg $name for $FUZZTIME"; cat "$log"; } > "$log.out"
			cat "$log.out"
			if grep -q 'context deadline exceeded' "$log" && ! grep -qE 'Failing input written|panic:|_test\.go:[0-9]+:' "$log" &&
				$GO test -count=1 -run "^$name\$" "$pkg" > /dev/null 2>&1; then
				if [ "$attempt" -lt 2 ]; then
					echo "fuzz: $name: bare deadline at the fuzztime boundary, no reproducer, corpus passes (golang/go#75804): running it again"
					attempt=$((attempt + 1))
					continue
				fi
				echo "fuzz: $name: the boundary deadline again, no reproducer: counted as a flake, not a finding"
				flakes=$((flakes + 1))
				break
			fi
			echo "fuzz: $name: FAILED (see above; a reproducer, if written, is under $pkg/testdata/fuzz/$name/)"
			echo "$flakes" > "$tmp/flakes.$n"
			return 1
		done
	done < "$tmp/targets.$n"
	echo "$flakes" > "$tmp/flakes.$n"
}

pids=""
n=0
while [ "$n" -lt "$lanes" ]; do
	lane "$n" &
	pids="$pids $!"
	n=$((n + 1))
done
rc=0
for p in $pids; do
	wait "$p" || rc=1
done
flakes=$(cat "$tmp"/flakes.* 2>/dev/null | awk '{s += $1} END {print s + 0}')
if [ "$rc" -ne 0 ]; then
	echo "fuzz: a target FAILED (above)"
	exit 1
fi
echo "fuzz: all $(wc -l < "$tmp/targets") targets done in $lanes lanes ($flakes boundary flakes)"
