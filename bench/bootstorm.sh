#!/bin/sh
# bench/bootstorm.sh [CLIENTS]: PXE boot storm, Machina's boot servers vs dnsmasq, same run.
#
# Creates two network namespaces joined by a veth pair (server 10.66.0.1/21, client 10.66.0.2/21),
# then, for each server in turn (Machina: boot/dhcp + boot/tftp + boot/ipxe; dnsmasq: DHCP + TFTP
# with the same pool and files, a static HTTP server for the script), starts CLIENTS (default 1000)
# concurrent simulated clients. Each does DISCOVER/OFFER/REQUEST/ACK (as a DHCP relay, so one socket
# carries all clients), a TFTP download of undionly.kpxe (Debian package ipxe; blksize 1428, tsize)
# and a GET of its per-MAC iPXE script. Prints p50/p99 per step and for the whole sequence.
# Needs root, iproute2, dnsmasq (dnsmasq-base), ipxe, Go. Cleans up its namespaces and processes.
# BOOTSTORM_PROFILE=FILE writes a CPU profile of the Machina server (both runs) to FILE.
# BOOTSTORM_PIN=1 pins the load generator to the last CPU and the servers (Machina's, dnsmasq and
# the static HTTP server alike) to the others (taskset, util-linux), as separate machines would be:
# without it the clients' own CPU time (a TFTP client per transfer) is taken from the servers.
set -eu
N=${1:-1000}
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bootstorm: needs root (network namespaces)" >&2; exit 1; }
SFX=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
S=m6-$SFX-s; C=m6-$SFX-c
W=$(mktemp -d)
PIDS=""
cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
	ip netns del "$S" 2>/dev/null || true
	ip netns del "$C" 2>/dev/null || true
	rm -rf "$W"
}
trap cleanup EXIT INT TERM

go build -o "$W/bootstorm" ./bench/bootstorm
ip netns add "$S"; ip netns add "$C"
ip -n "$S" link add vs0 type veth peer name vc0 netns "$C"
ip -n "$S" addr add 10.66.0.1/21 dev vs0
ip -n "$C" addr add 10.66.0.2/21 dev vc0
for ns in "$S" "$C"; do ip -n "$ns" link set lo up; done
ip -n "$S" link set vs0 up; ip -n "$C" link set vc0 up
IPXE=$(dpkg -L ipxe | grep '/undionly.kpxe$' | head -n1); ROOT=$(dirname "$IPXE")

# wait_ready FILE: block until the server prints "ready" (it does after binding).
wait_ready() { until grep -q ready "$1" 2>/dev/null; do sleep 0.1; done; }

SRVPIN=""; CLIPIN=""
if [ "${BOOTSTORM_PIN:-0}" = 1 ]; then
	last=$(($(nproc) - 1))
	[ "$last" -ge 1 ] || { echo "bootstorm: BOOTSTORM_PIN needs at least 2 CPUs" >&2; exit 1; }
	SRVPIN="taskset -c 0-$((last - 1))"; CLIPIN="taskset -c $last"
fi
storm() { ip netns exec "$C" $CLIPIN "$W/bootstorm" storm -clients "$N" -label "$1" -http http://10.66.0.1:8080/boot/ipxe "$2"; }

# --- Machina ---
ip netns exec "$S" $SRVPIN "$W/bootstorm" serve ${BOOTSTORM_PROFILE:+-cpuprofile "$BOOTSTORM_PROFILE"} -iface vs0 -http 10.66.0.1:8080 -root "$ROOT" -clients "$N" > "$W/m.out" 2> "$W/m.err" &
MP=$!; PIDS="$PIDS $MP"
wait_ready "$W/m.out"
storm machina -stepwise=false > "$W/machina.json"
storm machina -stepwise=true > "$W/machina-step.json"
kill "$MP"; wait "$MP" 2>/dev/null || true
grep 'server CPU' "$W/m.err" || true

# --- dnsmasq (same pool, same file, same relay) ---
cat > "$W/dnsmasq.conf" <<CONF
port=0
no-resolv
no-hosts
interface=vs0
bind-interfaces
dhcp-range=10.66.1.0,10.66.7.250,255.255.248.0,1h
dhcp-leasefile=$W/dnsmasq.leases
dhcp-lease-max=10000
no-ping
dhcp-userclass=set:ipxe,iPXE
dhcp-boot=tag:ipxe,http://10.66.0.1:8080/boot/ipxe
dhcp-boot=tag:!ipxe,undionly.kpxe
dhcp-option=encap:175,176,1b
enable-tftp
tftp-root=$ROOT
tftp-max=$((N * 2))
CONF
ip netns exec "$S" $SRVPIN dnsmasq --keep-in-foreground --user=root --conf-file="$W/dnsmasq.conf" --pid-file="$W/dnsmasq.pid" 2> "$W/d.err" &
DP=$!; PIDS="$PIDS $DP"
ip netns exec "$S" $SRVPIN "$W/bootstorm" static -http 10.66.0.1:8080 > "$W/s.out" 2>&1 &
SP=$!; PIDS="$PIDS $SP"
wait_ready "$W/s.out"
until ip netns exec "$S" ss -uln | grep -q '10.66.0.1:69\|\*:69\|0.0.0.0:69'; do sleep 0.1; done
storm dnsmasq -stepwise=false > "$W/dnsmasq.json"
storm dnsmasq -stepwise=true > "$W/dnsmasq-step.json"

"$W/bootstorm" table "$W/machina.json" "$W/dnsmasq.json" "$W/machina-step.json" "$W/dnsmasq-step.json"
