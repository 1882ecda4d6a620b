#!/bin/sh
# bench/ha.sh [SIZES]: the HA figures of docs/ha.md. The simulated lab at each size
# (default 1000,10000) from the inventory commit to every server ready and
# to the counts deployed, with the controller's state on bbolt and then on a
# 3-member etcd cluster (Debian's etcd-server) on loopback, in the same run;
# then the bytes the etcd sites take (the database size after compacting
# the revision history and defragmenting every member, as an operator's
# --auto-compaction would leave it), against etcd's default 2 GiB quota.
# Last, the failover gap (bench/failover): two controllers on the same
# etcd cluster over the smallest size's lab (at most 1,000 servers), the
# leader SIGKILLed KILLS times (default 5; env MACHINA_HA_KILLS) while
# servers commission or deploy, with the time from each SIGKILL to the
# standby elected, to its first reconcile action (a BMC write) and to its
# first answer to a machine, and their min, median and max. --ha-ttl is
# MACHINA_HA_TTL (default 5s); the gap is about one TTL plus one pass.
#
# The controllers' and the lab's logs of each run are kept under
# MACHINA_BENCH_OUT (default a new /tmp/machina-bench-ha-logs.* folder,
# named at the start), in bbolt-N/ and etcd-N/; a warning or error that
# bench/scale does not expect (its allow-list, each entry with its reason)
# fails that run, and the script exits 1 after running every size. With
# MACHINA_BENCH_CPUPROFILE=1 each run also writes the controller's CPU and
# heap profiles and the lab's CPU profile there (bench/scale -cpuprofile).
#
# With MACHINA_BENCH_BEFORE=BINARY (e.g. bin/machina-before, built from
# the commit before a change) each size runs that binary first on both
# engines, in bbolt-before-N/ and etcd-before-N/, then bin/machina: a
# before/after pair from one sitting on one etcd cluster (its history
# compacted and defragmented between the two, so the second run does not
# start on the first one's revisions).
#
# Uses bench/scale (go run ./bench/scale, which runs `bin/machina serve`
# as its own process: `make build` first). Starts its etcd members with
# data under a temporary folder on ports 23790-23795 of 127.0.0.1 (from
# MACHINA_HA_PORT on, when set, for a run beside another one) and stops
# them by PID at the end. Needs etcd and etcdctl (etcd-server,
# etcd-client).
set -eu
cd "$(dirname "$0")/.."
sizes=${1:-1000,10000}
kills=${MACHINA_HA_KILLS:-5}
ttl=${MACHINA_HA_TTL:-5s}
port=${MACHINA_HA_PORT:-23790}
for b in etcd etcdctl; do
	command -v $b >/dev/null || { echo "bench/ha.sh: $b not found: apt-get install etcd-server etcd-client" >&2; exit 2; }
done
[ -x bin/machina ] || { echo "bench/ha.sh: bin/machina missing: run make build" >&2; exit 2; }
work=$(mktemp -d /tmp/machina-bench-ha.XXXXXX)
out=${MACHINA_BENCH_OUT:-$(mktemp -d /tmp/machina-bench-ha-logs.XXXXXX)}
mkdir -p "$out"
echo "logs: $out"
status=0
pids=""
cleanup() {
	for p in $pids; do kill "$p" 2>/dev/null || true; done
	for p in $pids; do wait "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT INT TERM

cluster=""
for i in 0 1 2; do
	cluster="${cluster:+$cluster,}m$i=http://127.0.0.1:$((port + 1 + 2 * i))"
done
eps=""
for i in 0 1 2; do
	c=$((port + 2 * i)); p=$((port + 1 + 2 * i))
	eps="${eps:+$eps,}127.0.0.1:$c"
	etcd --name m$i --data-dir "$work/m$i" \
		--listen-client-urls http://127.0.0.1:$c --advertise-client-urls http://127.0.0.1:$c \
		--listen-peer-urls http://127.0.0.1:$p --initial-advertise-peer-urls http://127.0.0.1:$p \
		--initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token machina-bench-ha \
		--log-level warn >"$work/m$i.log" 2>&1 &
	pids="$pids $!"
done
export ETCDCTL_API=3
i=0
until etcdctl --endpoints "$eps" endpoint health >/dev/null 2>&1; do
	i=$((i + 1)); [ $i -lt 100 ] || { echo "bench/ha.sh: etcd did not become healthy" >&2; cat "$work"/m*.log >&2; exit 1; }
	sleep 0.2
done
dbsize() {
	rev=$(etcdctl --endpoints "$eps" endpoint status -w json | tr ',' '\n' | sed -n 's/.*"revision":\([0-9]*\).*/\1/p' | head -1)
	etcdctl --endpoints "$eps" compact "$rev" >/dev/null 2>&1 || true
	etcdctl --endpoints "$eps" defrag >/dev/null
	etcdctl --endpoints "$eps" endpoint status -w json | tr ',' '\n' | sed -n 's/.*"dbSize":\([0-9]*\).*/\1/p' | sort -n | tail -1
}
keys() { etcdctl --endpoints "$eps" get --prefix /machina --keys-only | grep -c . || true; }

empty=$(dbsize)
echo "etcd: 3 members on loopback ($eps), empty database $empty bytes after compaction and defrag"
for n in $(echo "$sizes" | tr ',' ' '); do
	if [ -n "${MACHINA_BENCH_BEFORE:-}" ]; then
		echo
		echo "== $n servers, bbolt, $MACHINA_BENCH_BEFORE"
		go run ./bench/scale -servers "$n" -machina "$MACHINA_BENCH_BEFORE" -out "$out/bbolt-before-$n" ${MACHINA_BENCH_CPUPROFILE:+-cpuprofile "$out/bbolt-before-$n"} || status=1
		echo "== $n servers, etcd, $MACHINA_BENCH_BEFORE"
		go run ./bench/scale -servers "$n" -machina "$MACHINA_BENCH_BEFORE" -out "$out/etcd-before-$n" ${MACHINA_BENCH_CPUPROFILE:+-cpuprofile "$out/etcd-before-$n"} -etcd "etcd://$eps/machina" || status=1
		etcdctl --endpoints "$eps" del --prefix /machina >/dev/null
		echo "etcd after the $MACHINA_BENCH_BEFORE run, its keys deleted (compacted, defragmented): $(dbsize) bytes"
	fi
	echo
	echo "== $n servers, bbolt"
	go run ./bench/scale -servers "$n" -out "$out/bbolt-$n" ${MACHINA_BENCH_CPUPROFILE:+-cpuprofile "$out/bbolt-$n"} || status=1
	echo "== $n servers, etcd"
	go run ./bench/scale -servers "$n" -out "$out/etcd-$n" ${MACHINA_BENCH_CPUPROFILE:+-cpuprofile "$out/etcd-$n"} -etcd "etcd://$eps/machina" || status=1
	k=$(keys)
	b=$(dbsize)
	echo "etcd after $n servers (compacted, defragmented): $b bytes, $k keys under /machina (default quota 2147483648 bytes)"
	etcdctl --endpoints "$eps" del --prefix /machina >/dev/null
done

small=$(echo "$sizes" | tr ',' '\n' | sort -n | head -1)
[ "$small" -le 1000 ] || small=1000
echo
echo "== failover gap, $small servers, $kills kills, --ha-ttl $ttl"
go run ./bench/failover -etcd "$eps" -servers "$small" -kills "$kills" -ttl "$ttl" || status=1
exit $status
