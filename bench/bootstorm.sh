#!/bin/sh
# bench/bootstorm.sh [-f FILE|both] [-r RAMDISK_CLIENTS] [-n ROUNDS] [CLIENTS]: PXE boot storm, Machina's boot
# servers vs dnsmasq (DHCP, TFTP), a static Go server (script) and nginx (ramdisk), same run.
#
# Creates two network namespaces joined by a veth pair (server 10.66.0.1/21, client 10.66.0.2/21
# and every address of the DHCP pool, each client using the one it leased),
# then, per TFTP file and for each server set in turn (Machina: boot/dhcp + boot/tftp + boot/ipxe
# and the /boot/ramdisk/ route on the api server; peers: dnsmasq with the same pool and files, a
# static HTTP server for the script, nginx for the ramdisk), starts CLIENTS (default 1000)
# concurrent simulated clients. Each does DISCOVER/OFFER/REQUEST/ACK (as a DHCP relay, so one
# socket carries all clients; option 93 = 0 for undionly.kpxe, 7 for ipxe.efi), then, from the
# address it leased (without a lease, stepwise: the pool's i-th), a TFTP download of
# FILE (Debian package ipxe, 74 KB and 1 MB; undionly.kpxe as iPXE/BIOS PXE ask it, blksize 1428 and tsize;
# ipxe.efi as EDK2's PXE asks it, captured from Debian 12's OVMF: a tsize probe aborted with ERROR 8, then
# blksize 1468 and windowsize 4 from a new port, lockstep where the server grants no window, as dnsmasq 2.90
# does not; BOOTSTORM_STORM_FLAGS=-tftp-client=pxe uses the first for both), a GET of its per-MAC iPXE script and, in the
# runs of the first file only, GETs of the ramdisk's vmlinuz and initrd.cpio.gz (out/ramdisk,
# `make ramdisk`) by the first RAMDISK_CLIENTS clients (default 1000; 0 skips the step). Prints
# p50/p99 per step, Machina/peer ratios, the ramdisk step's aggregate MB/s, each server's CPU, and
# (stepwise) the servers' CPU per step.
#   -f FILE   undionly.kpxe, ipxe.efi, or both (default: both, undionly.kpxe first)
#   -r N      clients in the ramdisk step (default 1000; about 15 MB each)
#   -n R      rounds of the stepwise storm per file (default 5): round 1 as above, rounds 2..R on new
#             servers with the peers first in the even rounds; prints each round's Machina/peer
#             ratios and their median (bootstorm rounds), a single round being too noisy on 2 CPUs
# Needs root, iproute2, dnsmasq (dnsmasq-base), ipxe, nginx (nginx-light), Go. Cleans up its
# namespaces and processes.
# BOOTSTORM_PROFILE=FILE writes a CPU profile of the Machina server (both runs of a TFTP file) to
# FILE, or to FILE.<tftp file> with -f both.
# BOOTSTORM_PIN=1 pins the load generator to the last CPU and the servers (Machina's, dnsmasq, the
# static HTTP server and nginx alike) to the others (taskset, util-linux), as separate machines
# would be: without it the clients' own CPU time (a TFTP client per transfer) is taken from the
# servers.
# BOOTSTORM_RAMDISK=DIR serves DIR instead of out/ramdisk.
# Machina's servers are commissioning, and each one's script token is prepared before the storm (and
# again, for a new fleet, between the two storms of a file: SIGUSR1), as the executor's netboot
# prepares it; BOOTSTORM_SERVE_FLAGS=-no-prepare makes every script request mint inline.
# BOOTSTORM_SERVE_FLAGS adds flags to Machina's `bootstorm serve`, e.g. -direct (the iPXE handler and
# the ramdisk route on a bare http.Server, without the api server's middleware).
# BOOTSTORM_BEFORE=BIN also runs BIN's `serve` (a bootstorm binary built from another revision of
# the servers, e.g. before a change) as a third server set labelled "before", ahead of Machina's
# in each file's round (with the ramdisk step in the first file's): a before/after comparison in
# the same run. BOOTSTORM_BEFORE=self runs this revision's build there; BOOTSTORM_BEFORE_FLAGS adds
# flags to that set's `serve` only, e.g. BOOTSTORM_BEFORE=self BOOTSTORM_BEFORE_FLAGS=-mem-tokens
# (servers and tokens in memory, the storm's first shape: what the state store costs).
# BOOTSTORM_STRACE=FILE counts the system calls of Machina's server (strace -f -c attached for the
# two runs of each file, sendfile, read, write, pwrite64, fdatasync; FILE.<tftp file>): to check
# that the ramdisk goes out with sendfile. strace slows the server: take no figures from such a run.
set -eu
FILES="undionly.kpxe ipxe.efi"; RDN=1000; ROUNDS=5
while getopts f:r:n: opt; do
	case $opt in
	f) case $OPTARG in both) FILES="undionly.kpxe ipxe.efi" ;; *) FILES=$OPTARG ;; esac ;;
	r) RDN=$OPTARG ;;
	n) ROUNDS=$OPTARG ;;
	*) echo "usage: bootstorm.sh [-f undionly.kpxe|ipxe.efi|both] [-r RAMDISK_CLIENTS] [-n ROUNDS] [CLIENTS]" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
case $ROUNDS in ''|*[!0-9]*|0) echo "bootstorm: -n $ROUNDS: want a number of rounds, 1 or more" >&2; exit 2 ;; esac
N=${1:-1000}
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bootstorm: needs root (network namespaces)" >&2; exit 1; }
RD=${BOOTSTORM_RAMDISK:-$(pwd)/out/ramdisk}
if [ "$RDN" -gt 0 ]; then
	[ -f "$RD/vmlinuz" ] && [ -f "$RD/initrd.cpio.gz" ] || { echo "bootstorm: no ramdisk in $RD: run make ramdisk (or -r 0)" >&2; exit 1; }
	command -v nginx >/dev/null || { echo "bootstorm: nginx not found: apt-get install nginx-light (or -r 0)" >&2; exit 1; }
	RD=$(cd "$RD" && pwd)
fi
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
# Every address of the DHCP pool (10.66.1.0-10.66.7.250, Machina's and dnsmasq's) on the client
# side, so that each simulated client sends its TFTP, script and ramdisk requests from the address
# its DHCP exchange leased, as the machines of a real storm do: with all of them on 10.66.0.2 the
# api server's per-address connection cap closed most of them (bootstorm.md). On the
# server side the pool's neighbour entries are static: the kernel's ARP table limits are global
# (gc_thresh3, 1,024 entries over every namespace of the host), and ARP was never part of what the
# storm measures.
VCMAC=$(ip -n "$C" -o link show vc0 | awk '{for (i = 1; i < NF; i++) if ($i == "link/ether") print $(i + 1)}')
awk -v pfx=10.66 'BEGIN { for (a = 1; a <= 7; a++) for (b = 0; b <= 255; b++) if (a < 7 || b <= 250) print "address add " pfx "." a "." b "/32 dev vc0" }' > "$W/addrs"
awk -v pfx=10.66 -v mac="$VCMAC" 'BEGIN { for (a = 1; a <= 7; a++) for (b = 0; b <= 255; b++) if (a < 7 || b <= 250) print "neighbour replace " pfx "." a "." b " lladdr " mac " dev vs0 nud permanent" }' > "$W/neigh"
ip -n "$C" -batch "$W/addrs"
ip -n "$S" -batch "$W/neigh"
# The TFTP root: copies of the package's files (Debian's /usr/lib/ipxe/ipxe.efi is a symlink to
# /boot/ipxe.efi, out of the folder, which Machina's os.Root rightly refuses to follow).
IPXE=$(dpkg -L ipxe | grep '/undionly.kpxe$' | head -n1); ROOT=$W/tftp
mkdir -p "$ROOT"
for f in $FILES; do
	[ -f "$(dirname "$IPXE")/$f" ] || { echo "bootstorm: $(dirname "$IPXE")/$f missing (package ipxe)" >&2; exit 1; }
	cp -L "$(dirname "$IPXE")/$f" "$ROOT/$f"
done

# wait_ready FILE: block until the server prints "ready" (it does after binding).
wait_ready() { until grep -q ready "$1" 2>/dev/null; do sleep 0.1; done; }
# cpu_of PID...: user+system CPU seconds of the processes and their threads (/proc/PID/stat).
cpu_of() {
	for p in "$@"; do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || true; done |
		awk -v hz="$(getconf CLK_TCK)" '{s += $1} END {printf "%.2f", s / hz}'
}
# stop PID: end a server we started and wait for it.
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

SRVPIN=""; CLIPIN=""
if [ "${BOOTSTORM_PIN:-0}" = 1 ]; then
	last=$(($(nproc) - 1))
	[ "$last" -ge 1 ] || { echo "bootstorm: BOOTSTORM_PIN needs at least 2 CPUs" >&2; exit 1; }
	SRVPIN="taskset -c 0-$((last - 1))"; CLIPIN="taskset -c $last"
fi
# storm LABEL FILE RAMDISK_URL FLAGS...
# -warm: the TFTP root and the ramdisk folder are read (untimed) before each step, since these
# machines page out page cache left unused for about a minute (DAMON, see warmFiles in
# bootstorm/main.go): whichever server came first in a round read the ramdisk from disk.
storm() {
	l=$1; f=$2; u=$3; shift 3
	ip netns exec "$C" $CLIPIN "$W/bootstorm" storm -clients "$N" -label "$l" -file "$f" -warm "$ROOT${u:+,$RD}" \
		-http http://10.66.0.1:8080/boot/ipxe ${u:+-ramdisk "$u" -ramdisk-clients "$RDN"} ${BOOTSTORM_STORM_FLAGS:-} "$@"
}

# nginx for the ramdisk, in the server namespace: sendfile on, the same folder, no access log,
# a listen backlog as large as Go's (somaxconn) so that 1,000 simultaneous connects are not
# dropped by nginx's default of 511.
mkdir -p "$W/nginx"
cat > "$W/nginx.conf" <<CONF
user root;
worker_processes auto;
daemon off;
pid $W/nginx/nginx.pid;
error_log $W/nginx/error.log warn;
events { worker_connections 4096; }
http {
	access_log off;
	sendfile on;
	tcp_nopush on;
	keepalive_requests 1000;
	default_type application/octet-stream;
	client_body_temp_path $W/nginx/body;
	proxy_temp_path $W/nginx/proxy;
	fastcgi_temp_path $W/nginx/fastcgi;
	uwsgi_temp_path $W/nginx/uwsgi;
	scgi_temp_path $W/nginx/scgi;
	server {
		listen 10.66.0.1:8081 backlog=4096;
		location /boot/ramdisk/ { alias $RD/; }
	}
}
CONF

CPU=""; TABLES=""; ROUNDSETS=""; first=1
for F in $FILES; do
	RDM=""; RDP=""
	if [ "$first" = 1 ] && [ "$RDN" -gt 0 ]; then
		RDM=http://10.66.0.1:8080/boot/ramdisk/; RDP=http://10.66.0.1:8081/boot/ramdisk/
	fi
	PROF=${BOOTSTORM_PROFILE:-}
	[ -n "$PROF" ] && [ "$(echo $FILES | wc -w)" -gt 1 ] && PROF=$PROF.$F

	# --- Machina (and the "before" build) ---
	# machina LABEL BIN RAMDISK_URL [PROFILE]
	machina() {
		xf=""; [ "$1" = before ] && xf=${BOOTSTORM_BEFORE_FLAGS:-}
		ip netns exec "$S" $SRVPIN "$2" serve ${4:+-cpuprofile "$4"} -iface vs0 -http 10.66.0.1:8080 \
			-root "$ROOT" -uefi-file ipxe.efi -clients "$N" ${3:+-ramdisk "$RD"} ${BOOTSTORM_SERVE_FLAGS:-} $xf > "$W/m.out" 2> "$W/m.err" &
		MP=$!; PIDS="$PIDS $MP"
		wait_ready "$W/m.out"
		TP=""
		if [ -n "${BOOTSTORM_STRACE:-}" ] && [ "$1" = machina ]; then
			strace -f -c -e trace=sendfile,read,write,pwrite64,fdatasync -o "$BOOTSTORM_STRACE.$F" -p "$MP" 2> "$W/strace.err" &
			TP=$!; PIDS="$PIDS $TP"
			sleep 1 # attached to every thread
		fi
		if [ "$ROUND" -gt 1 ]; then
			storm "$1" "$F" "$3" -stepwise=true -server-pids "$MP" > "$W/$1-$F-step.$ROUND.json"
			stop "$MP"
			CPU="$CPU$(grep 'server CPU' "$W/m.err" | sed "s/^machina server CPU: \([0-9.]* s\) for both runs/$1 ($F, round $ROUND): server CPU: \1 for the stepwise run/")
"
			rm -f "$W/m.out"
			return
		fi
		storm "$1" "$F" "$3" -stepwise=false > "$W/$1-$F.json"
		# A new netboot of every server between the two storms (serve
		# revokes the tokens the first storm took and prepares new ones,
		# as the executor's netboot does), unless this build
		# cannot (a BOOTSTORM_BEFORE build from before prepared tokens) or
		# runs without them.
		if "$2" serve -h 2>&1 | grep -q -- -no-prepare && ! echo " ${BOOTSTORM_SERVE_FLAGS:-} $xf " | grep -q -- ' -no-prepare \| -mem-tokens '; then
			kill -USR1 "$MP"
			until grep -q prepared "$W/m.out" 2>/dev/null; do sleep 0.1; done
		fi
		storm "$1" "$F" "$3" -stepwise=true -server-pids "$MP" > "$W/$1-$F-step.json"
		cp "$W/$1-$F-step.json" "$W/$1-$F-step.1.json"
		if [ -n "$TP" ]; then kill -INT "$TP" 2>/dev/null || true; wait "$TP" 2>/dev/null || true; fi
		stop "$MP"
		CPU="$CPU$(grep 'server CPU' "$W/m.err" | sed "s/^machina server CPU/$1 ($F): server CPU/")
$(grep 'script requests by source' "$W/m.err" | sed "s/^machina /$1 ($F): /")
"
		rm -f "$W/m.out"
	}
	BB=${BOOTSTORM_BEFORE:-}; [ "$BB" = self ] && BB=$W/bootstorm
	ROUND=1
	[ -n "$BB" ] && machina before "$BB" "$RDM"
	machina machina "$W/bootstorm" "$RDM" "$PROF"

	# --- peers: dnsmasq (same pool, same files, same relay), static script server, nginx ---
	peers() {
		rm -f "$W/dnsmasq.leases"
		cat > "$W/dnsmasq.conf" <<-CONF
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
	dhcp-vendorclass=set:efi64,PXEClient:Arch:00007
	dhcp-boot=tag:ipxe,http://10.66.0.1:8080/boot/ipxe
	dhcp-boot=tag:!ipxe,tag:efi64,ipxe.efi
	dhcp-boot=tag:!ipxe,tag:!efi64,undionly.kpxe
	dhcp-option=encap:175,176,1b
	enable-tftp
	tftp-root=$ROOT
	tftp-max=$((N * 2))
	CONF
		ip netns exec "$S" $SRVPIN dnsmasq --keep-in-foreground --user=root --conf-file="$W/dnsmasq.conf" --pid-file="$W/dnsmasq.pid" 2> "$W/d.err" &
		DP=$!; PIDS="$PIDS $DP"
		ip netns exec "$S" $SRVPIN "$W/bootstorm" static -http 10.66.0.1:8080 > "$W/s.out" 2>&1 &
		SP=$!; PIDS="$PIDS $SP"
		NP=""
		if [ -n "$RDP" ]; then
			ip netns exec "$S" $SRVPIN nginx -c "$W/nginx.conf" -e "$W/nginx/error.log" > "$W/n.out" 2>&1 &
			NP=$!; PIDS="$PIDS $NP"
			until ip netns exec "$S" ss -tln | grep -q '10.66.0.1:8081'; do sleep 0.1; done
		fi
		wait_ready "$W/s.out"
		until ip netns exec "$S" ss -uln | grep -q '10.66.0.1:69\|\*:69\|0.0.0.0:69'; do sleep 0.1; done
		PP="$DP $SP"
		[ -n "$NP" ] && PP="$PP $NP $(pgrep -P "$NP" | tr '\n' ' ')"
		if [ "$ROUND" = 1 ]; then
			storm dnsmasq "$F" "$RDP" -stepwise=false > "$W/dnsmasq-$F.json"
			storm dnsmasq "$F" "$RDP" -stepwise=true -server-pids "$PP" > "$W/dnsmasq-$F-step.json"
			cp "$W/dnsmasq-$F-step.json" "$W/dnsmasq-$F-step.1.json"
			runs="both runs"
		else
			rm -f "$W/dnsmasq.leases"
			storm dnsmasq "$F" "$RDP" -stepwise=true -server-pids "$PP" > "$W/dnsmasq-$F-step.$ROUND.json"
			runs="the stepwise run of round $ROUND"
		fi
		line="peers ($F): dnsmasq CPU $(cpu_of "$DP") s, static script server $(cpu_of "$SP") s"
		# nginx's CPU: the master and its workers (taskset, when pinning, is replaced by nginx by exec).
		[ -n "$NP" ] && line="$line, nginx $(cpu_of "$NP" $(pgrep -P "$NP")) s"
		CPU="$CPU$line for $runs
"
		[ -n "$NP" ] && stop "$NP"
		stop "$DP"; stop "$SP"
		rm -f "$W/s.out"
	}
	peers
	# Rounds 2..ROUNDS: the stepwise storm again on new servers, the peers
	# first in the even rounds, so that neither side always runs on the
	# machine the other has just warmed (or loaded).
	ROUND=2
	while [ "$ROUND" -le "$ROUNDS" ]; do
		if [ $((ROUND % 2)) = 0 ]; then
			peers; machina machina "$W/bootstorm" "$RDM"
		else
			machina machina "$W/bootstorm" "$RDM"; peers
		fi
		ROUND=$((ROUND + 1))
	done
	MR=""; PR=""
	r=1
	while [ "$r" -le "$ROUNDS" ]; do MR="$MR${MR:+,}$W/machina-$F-step.$r.json"; PR="$PR${PR:+,}$W/dnsmasq-$F-step.$r.json"; r=$((r + 1)); done
	ROUNDSETS="$ROUNDSETS $MR $PR"
	TABLES="$TABLES $W/machina-$F.json $W/dnsmasq-$F.json $W/machina-$F-step.json $W/dnsmasq-$F-step.json"
	[ -n "${BOOTSTORM_BEFORE:-}" ] && TABLES="$TABLES $W/before-$F.json $W/dnsmasq-$F.json $W/before-$F-step.json $W/dnsmasq-$F-step.json $W/machina-$F.json $W/before-$F.json $W/machina-$F-step.json $W/before-$F-step.json"
	first=0
done

echo "peers: dnsmasq for DHCP and TFTP, a static Go server for the script, nginx for the ramdisk"
printf '%s' "$CPU"
echo
"$W/bootstorm" table $TABLES
"$W/bootstorm" rounds $ROUNDSETS
