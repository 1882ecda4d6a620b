#!/bin/sh
# Benchmark: import of a 2 GiB local file (verify-and-store)
# against `sha256sum` of the same file in the same run, and peak memory.
#
#   bench/images-import.sh [SIZE_MIB] [ROUNDS]     (defaults 2048, 3)
#
# The file is generated (random bytes, so nothing is sparse) in a temp dir
# under /tmp, synced to disk before timing, and deleted at the end with the
# store. sha256sum and the import alternate ROUNDS times; medians and bests
# are compared (this machine is shared, so single runs are noisy), and the
# CPU seconds (user + system) of each run are shown, which noise affects less. Both read the
# file from the page cache; the import also writes the 2 GiB copy into the
# content-addressed store and fsyncs it, so it is bounded by the disk's write
# speed, which sha256sum never touches. Peak memory is the import process's
# maximum RSS (GNU time %M).
set -eu
cd "$(dirname "$0")/.."
size_mib=${1:-2048}
rounds=${2:-3}
work=$(mktemp -d /tmp/machina-bench-i7.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM
go build -o "$work/machinactl" ./cmd/machinactl
img="$work/disk.raw"
echo "generating ${size_mib} MiB of random data in $img"
head -c "$((size_mib * 1024 * 1024))" /dev/urandom > "$img"
bytes=$(stat -c %s "$img")
sum=$(sha256sum "$img" | cut -d' ' -f1)
sync

now() { date +%s.%N; }
mibs() { echo "$1 $2" | awk '{ printf "%.1f", $1 / $2 / 1048576 }'; }
best() { echo "$1 $2" | awk '{ print ($1 > $2) ? $1 : $2 }'; }
median() { echo "$@" | tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

sha=0 imp=0 kb_max=0 sha_all="" imp_all="" sha_cpu="" imp_cpu=""
i=0
while [ "$i" -lt "$rounds" ]; do
	i=$((i + 1))
	/usr/bin/time -f '%e %U %S' -o "$work/time0" sha256sum "$img" >/dev/null
	read -r s u k < "$work/time0"
	r=$(mibs "$bytes" "$s")
	sha_all="$sha_all $r"; sha=$(best "$sha" "$r")
	sha_cpu="$sha_cpu $(echo "$u $k" | awk '{ printf "%.1f", $1 + $2 }')"

	rm -rf "$work/store"
	sync
	/usr/bin/time -f '%e %M %U %S' -o "$work/time" \
		"$work/machinactl" images import "file://$img" --name bench \
		--checksum "sha256:$sum" --store "$work/store" -q >/dev/null
	read -r s kb u k < "$work/time"
	imp_cpu="$imp_cpu $(echo "$u $k" | awk '{ printf "%.1f", $1 + $2 }')"
	test -f "$work/store/blobs/sha256/$sum" || { echo "blob missing from store" >&2; exit 1; }
	r=$(mibs "$bytes" "$s")
	imp_all="$imp_all $r"; imp=$(best "$imp" "$r")
	[ "$kb" -gt "$kb_max" ] && kb_max=$kb
done

# The same bytes as qcow2 (made by qemu-img): verify + convert through the
# NBD target (raw sha256 computed during conversion) + store.
rm -rf "$work/store"
qemu-img convert -f raw -O qcow2 "$img" "$work/disk.qcow2"
qsum=$(sha256sum "$work/disk.qcow2" | cut -d' ' -f1)
sync
/usr/bin/time -f '%e %M' -o "$work/time2" \
	"$work/machinactl" images import "file://$work/disk.qcow2" --name benchq \
	--checksum "sha256:$qsum" --store "$work/store" -q >/dev/null
read -r q_s q_kb < "$work/time2"
test -f "$work/store/blobs/sha256/$sum" || { echo "converted blob has the wrong raw digest" >&2; exit 1; }

echo "file:            $bytes bytes"
sm=$(median $sha_all) im=$(median $imp_all)
echo "sha256sum:      $sha_all MiB/s (median $sm, best $sha); CPU s:$sha_cpu"
echo "machina import: $imp_all MiB/s (median $im, best $imp; verify + store + fsync); CPU s:$imp_cpu"
echo "ratio:           $(echo "$im $sm" | awk '{ printf "%.2f", $1 / $2 }')x sha256sum median vs median, $(echo "$imp $sha" | awk '{ printf "%.2f", $1 / $2 }')x best vs best (target >= 0.9)"
echo "peak RSS:        $((kb_max / 1024)) MiB (target < 64)"
echo "qcow2 import:    $(mibs "$bytes" "$q_s") MiB/s of raw output ($q_s s: verify + qemu-img convert + raw hash + store), peak RSS $((q_kb / 1024)) MiB (largest of machinactl and qemu-img)"
