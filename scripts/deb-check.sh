#!/bin/sh
# deb-check: build machina_VERSION_amd64.deb, then run docs/operations.md's
# `sh` blocks in order on this machine against it: dpkg -i, machina
# bootstrap, machina serve --config from the installed files (systemd when
# it is PID 1, else the unit's ExecStart as the machina user with the
# unit's capabilities), a simulated BMC (the installed machina bmcsim) named
# by a file:// inventory, secret set and state snapshot over TLS, restore,
# upgrade, dpkg -r and dpkg --purge; and check what each step leaves.
# Root: it installs into the real system. It refuses to run where machina
# is installed or /etc/machina or /var/lib/machina exist, and removes
# everything it made (package, folders, processes by PID) on any exit.
# Listens on loopback only (ports 18080, 18443, 18444 and a free one for
# the BMC); connects to nothing else.
set -eu
cd "$(dirname "$0")/.."
REPO=$(pwd)
fail() { echo "deb-check: FAIL: $*" >&2; exit 1; }
say() { echo "deb-check: $*"; }

[ "$(id -u)" = 0 ] || fail "run as root (it installs the package with dpkg -i)"
if dpkg-query -W -f='${Status}' machina 2>/dev/null | grep -q installed; then
	fail "the machina package is installed here; deb-check would remove it"
fi
for d in /etc/machina /var/lib/machina; do
	[ ! -e "$d" ] || fail "$d exists: deb-check would delete a site"
done
for tool in curl git setpriv awk; do
	command -v "$tool" >/dev/null 2>&1 || fail "$tool missing (Debian packages curl git util-linux gawk|mawk)"
done

if [ -z "${DEB:-}" ]; then
	make deb
	DEB=$(ls -t bin/machina_*_amd64.deb | head -n 1)
fi
DEB=$(cd "$(dirname "$DEB")" && pwd)/$(basename "$DEB")
say "package $DEB"

if getent passwd machina >/dev/null; then USER_BEFORE=1; else USER_BEFORE=0; fi
if [ "$(ps -p 1 -o comm=)" = systemd ]; then SYSTEMD=1; else SYSTEMD=0; fi
DROPIN=/run/systemd/system/machina.service.d/deb-check.conf
if [ "$SYSTEMD" = 1 ]; then
	# Under systemd the unit's PrivateTmp and ProtectSystem=strict hide /tmp
	# and make the rest read-only: the file:// inventory (which the status
	# writer pushes to) lives in /srv, opened by a runtime drop-in.
	# (This path has not run on the development machine, which has no
	# systemd as PID 1.)
	mkdir -p /srv
	WORK=$(mktemp -d /srv/machina-deb-check.XXXXXX)
	mkdir -p "$(dirname "$DROPIN")"
	printf '[Service]\nReadWritePaths=%s\n' "$WORK" >"$DROPIN"
else
	WORK=$(mktemp -d /tmp/deb-check.XXXXXX)
fi
chmod 0755 "$WORK"
SVC_PID=""
BMC_PID=""
cleanup() {
	rc=$?
	set +e
	[ -n "$SVC_PID" ] && kill "$SVC_PID" 2>/dev/null && wait "$SVC_PID" 2>/dev/null
	[ -n "$BMC_PID" ] && kill "$BMC_PID" 2>/dev/null && wait "$BMC_PID" 2>/dev/null
	if dpkg-query -W -f='${Status}' machina 2>/dev/null | grep -q 'ok installed\|config-files'; then
		dpkg --purge machina >/dev/null 2>&1
	fi
	rm -rf /etc/machina /var/lib/machina "$WORK"
	if [ "$SYSTEMD" = 1 ]; then rm -f "$DROPIN"; systemctl daemon-reload; fi
	# The package keeps the machina user (Debian practice); the user
	# deb-check's install created goes with the rest.
	if [ "$USER_BEFORE" = 0 ] && getent passwd machina >/dev/null; then userdel machina 2>/dev/null; getent group machina >/dev/null && groupdel machina 2>/dev/null; fi
	[ $rc = 0 ] || echo "deb-check: failed (exit $rc); logs were in $WORK" >&2
	exit $rc
}
trap cleanup EXIT INT TERM

# --- The package as built -----------------------------------------------
dpkg-deb --field "$DEB" Package Version Architecture Depends
dpkg-deb --field "$DEB" Depends | grep -qw ipxe || fail "Depends lacks ipxe"
dpkg-deb --contents "$DEB" > "$WORK/contents"
for f in ./usr/bin/machina ./usr/bin/machinactl ./usr/bin/machina-node ./lib/systemd/system/machina.service \
	./usr/share/machina/machina.yaml.default ./usr/share/doc/machina/operations.md \
	./usr/share/machina/monitoring/machina.rules.yml ./usr/share/machina/monitoring/machina-dashboard.json; do
	grep -q " $f\$" "$WORK/contents" || fail "package lacks $f"
done
if grep -q ' ./usr/lib/machina/ramdisk/vmlinuz$' "$WORK/contents"; then say "package holds the ramdisk"; else say "package holds no ramdisk (out/ramdisk not built)"; fi

# --- The simulated lab: one BMC (bmcsim over the fixtures), one server ----
BMC_PASSWORD=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
export BMC_PASSWORD

# --- CI's site values (docs/operations.md section 4) -----------------------
SITE_REPO="file://$WORK/inventory.git"
MGMT_NAME=localhost
NET_FLAGS="--listen 127.0.0.1:18080 --admin-listen 127.0.0.1:18444 --join-listen 127.0.0.1:18443"
ADMIN_URL=https://localhost:18444
MACHINE_URL=http://127.0.0.1:18080
TOKEN_FILE="$WORK/admin.token"
BACKUP_DIR="$WORK/backups"
mkdir -p "$BACKUP_DIR"
export DEB SITE_REPO MGMT_NAME NET_FLAGS ADMIN_URL MACHINE_URL TOKEN_FILE BACKUP_DIR
say "site values: SITE_REPO=$SITE_REPO MGMT_NAME=$MGMT_NAME ADMIN_URL=$ADMIN_URL MACHINE_URL=$MACHINE_URL NET_FLAGS=\"$NET_FLAGS\""

# Stand-ins for the `sh systemd` blocks where systemd is not PID 1: the
# installed unit's ExecStart, as its User= with its capabilities.
UNIT=/lib/systemd/system/machina.service
svc_start() {
	exec_start=$(sed -n 's/^ExecStart=//p' "$UNIT")
	caps=$(sed -n 's/^AmbientCapabilities=//p' "$UNIT" | tr 'A-Z' 'a-z' | sed 's/cap_/+/g; s/ /,/g')
	user=$(sed -n 's/^User=//p' "$UNIT")
	# shellcheck disable=SC2086
	setpriv --reuid="$user" --regid="$user" --init-groups --inh-caps="$caps" --ambient-caps="$caps" --bounding-set="-all,$caps" \
		--no-new-privs $exec_start >>"$WORK/serve.log" 2>&1 &
	SVC_PID=$!
	say "stand-in for systemctl start: pid $SVC_PID: $exec_start (user $user, capabilities $caps)"
}
svc_stop() {
	if [ -n "$SVC_PID" ]; then
		kill "$SVC_PID"
		wait "$SVC_PID" || true
		SVC_PID=""
	fi
}
svc_logs() { tail -n 20 "$WORK/serve.log"; }

# Run the `sh` blocks of docs/operations.md in order, in this shell.
awk '
	/^```sh( |$)/ { n++; tag = $2; file = sprintf("'"$WORK"'/block-%02d.%s", n, tag == "" ? "sh" : tag); inb = 1; next }
	/^```/ && inb { inb = 0; close(file); next }
	inb { print > file }
' docs/operations.md
ls "$WORK"/block-* >/dev/null 2>&1 || fail "no sh blocks in docs/operations.md"

# Before the doc's blocks: the inventory (one server on the simulated BMC).
start_bmc() {
	MACHINA_BMCSIM_PASSWORD="$BMC_PASSWORD" /usr/bin/machina bmcsim --tree dell-poweredge-r750-idrac9 --listen 127.0.0.1:0 --plain-http --fixtures "$REPO/testdata/fixtures" >"$WORK/bmcsim.log" 2>&1 &
	BMC_PID=$!
	for _ in $(seq 100); do
		BMC_URL=$(sed -n 's/.* on \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' "$WORK/bmcsim.log")
		[ -n "$BMC_URL" ] && break
		sleep 0.1
	done
	[ -n "$BMC_URL" ] || fail "bmcsim did not start: $(cat "$WORK/bmcsim.log")"
	mkdir -p "$WORK/inv"
	cat >"$WORK/inv/servers.yaml" <<YAML
servers:
  - name: sim-n01
    zone: zone-a
    site: lab1
    rack: r1
    bootMAC: "52:54:00:09:00:01"
    bootMode: uefi
    bmc:
      driver: redfish
      address: $BMC_URL
      credentials: bmc-default
YAML
	git -C "$WORK/inv" init -q -b main
	git -C "$WORK/inv" add servers.yaml
	git -C "$WORK/inv" -c user.name=deb-check -c user.email=deb-check@localhost commit -q -m "one simulated server"
	git clone -q --bare "$WORK/inv" "$WORK/inventory.git"
	say "simulated BMC at $BMC_URL (pid $BMC_PID), inventory $SITE_REPO"
}

n_done=0
for block in "$WORK"/block-*; do
	case "$block" in
	*.site) say "not run (site values): $(basename "$block")"; continue ;;
	*.systemd)
		if [ "$SYSTEMD" = 1 ]; then
			run="$block"
		else
			run="$block.standin"
			sed -e 's/^systemctl daemon-reload$/:/' -e 's/^systemctl enable --now machina$/svc_start/' \
				-e 's/^systemctl start machina$/svc_start/' -e 's/^systemctl stop machina$/svc_stop/' \
				-e 's/^journalctl -u machina.*/svc_logs/' "$block" >"$run"
			say "no systemd: $(basename "$block") runs as: $(tr '\n' ';' <"$run")"
		fi ;;
	*) run="$block" ;;
	esac
	# Without systemd nothing stops the stand-in before dpkg -r (prerm does under systemd).
	if [ "$SYSTEMD" = 0 ] && grep -q '^dpkg -r machina' "$run"; then svc_stop; fi
	say "--- $(basename "$block"):"
	sed 's/^/    /' "$run"
	# The inventory repository must exist before bootstrap names it; the
	# machina user must be able to push status commits into it.
	if grep -q '^machina bootstrap' "$run"; then
		start_bmc
		chown -R machina:machina "$WORK/inventory.git"
	fi
	# shellcheck disable=SC1090
	. "$run"
	n_done=$((n_done + 1))

	# Checks after particular steps.
	if grep -q '^dpkg -i' "$run" && [ ! -e "$WORK/installed" ]; then
		touch "$WORK/installed"
		getent passwd machina >/dev/null || fail "the package did not create the machina user"
		[ -x /usr/bin/machina ] && [ -f "$UNIT" ] || fail "installed files missing"
		if command -v systemd-analyze >/dev/null 2>&1; then systemd-analyze verify "$UNIT" || fail "systemd-analyze verify $UNIT"; say "systemd-analyze verify $UNIT: ok"; else say "systemd-analyze not installed: the unit's directives are not verified here"; fi
		# The default configuration is one serve accepts.
		env -i /usr/bin/machina serve --config /usr/share/machina/machina.yaml.default --print-config >/dev/null ||
			fail "serve rejects /usr/share/machina/machina.yaml.default"
	fi
	if grep -q '^machina bootstrap' "$run"; then
		for f in /etc/machina/master.key:600:machina /var/lib/machina/state.db:600:machina /etc/machina/machina.yaml:640:root /etc/machina/ca.pem:644:root; do
			p=${f%%:*}; rest=${f#*:}; want_mode=${rest%%:*}; want_owner=${rest#*:}
			got=$(stat -c '%a:%U' "$p") || fail "$p missing"
			[ "$got" = "$want_mode:$want_owner" ] || fail "$p is $got, want $want_mode:$want_owner"
		done
		grep -Eq '^mna_[A-Za-z0-9_-]+$' "$TOKEN_FILE" || fail "bootstrap printed no admin token"
		[ ! -e /etc/systemd/system/machina.service ] || fail "bootstrap wrote a unit although the package has one"
		if machina bootstrap --repo "$SITE_REPO" >/dev/null 2>"$WORK/again.err"; then fail "a second bootstrap succeeded"; fi
		grep -q 'already exists' "$WORK/again.err" || fail "second bootstrap: $(cat "$WORK/again.err")"
		say "bootstrap: files, modes and owners as documented; a second bootstrap refuses"
	fi
	if grep -q 'machinactl secret set' "$run"; then
		# The admin API answers over TLS with the CA and token, and not without the CA.
		printf 'Authorization: Bearer %s\n' "$MACHINA_TOKEN" >"$WORK/auth.hdr"
		if curl -fsS -o /dev/null "$ADMIN_URL/healthz" 2>/dev/null; then fail "the admin TLS certificate verified without the controller CA"; fi
		for _ in $(seq 120); do
			curl -fsS --cacert /etc/machina/ca.pem -H @"$WORK/auth.hdr" "$ADMIN_URL/api/v1/servers/sim-n01" >"$WORK/server.json" 2>/dev/null && break
			sleep 0.5
		done
		grep -q '"name":"sim-n01"' "$WORK/server.json" || fail "server sim-n01 not visible over the admin API: $(tail -n 5 "$WORK/serve.log")"
		say "server visible over TLS: $(cat "$WORK/server.json" | head -c 300)"
		for _ in $(seq 120); do
			curl -fsS --cacert /etc/machina/ca.pem -H @"$WORK/auth.hdr" "$ADMIN_URL/api/v1/servers/sim-n01" >"$WORK/server.json" 2>/dev/null
			grep -q '"lifecycle":"commissioning"' "$WORK/server.json" && break
			sleep 0.5
		done
		grep -q '"lifecycle":"commissioning"' "$WORK/server.json" || fail "sim-n01 never started commissioning: $(cat "$WORK/server.json")"
		# The controller logged in to the simulated BMC with the stored
		# secret: PXE boot override set and the system powered on.
		printf 'user = "admin:%s"\n' "$BMC_PASSWORD" >"$WORK/bmc.curl"
		for _ in $(seq 120); do
			curl -fsS -K "$WORK/bmc.curl" "$BMC_URL/redfish/v1/Systems/System.Embedded.1" >"$WORK/system.json" 2>/dev/null
			grep -q '"PowerState": *"On"' "$WORK/system.json" && grep -q '"BootSourceOverrideTarget": *"Pxe"' "$WORK/system.json" && break
			sleep 0.5
		done
		grep -q '"PowerState": *"On"' "$WORK/system.json" && grep -q '"BootSourceOverrideTarget": *"Pxe"' "$WORK/system.json" ||
			fail "the simulated BMC was not set to PXE and powered on: $(head -c 400 "$WORK/system.json"); $(tail -n 5 "$WORK/serve.log")"
		say "sim-n01 commissioning: the controller set PXE and powered the simulated BMC on with the stored secret"
		if [ "$SYSTEMD" = 1 ]; then journalctl -u machina --no-pager >"$WORK/serve.log" 2>&1 || true; fi
		if grep -q "$BMC_PASSWORD" "$WORK/serve.log" || grep -q "$MACHINA_TOKEN" "$WORK/serve.log"; then fail "a secret is in the controller's log"; fi
	fi
	if grep -q '^machinactl state snapshot' "$run"; then
		[ "$(stat -c %a "$SNAPSHOT")" = 600 ] || fail "snapshot mode $(stat -c %a "$SNAPSHOT")"
	fi
	if grep -q '^dpkg -r machina' "$run"; then
		[ ! -e /usr/bin/machina ] || fail "dpkg -r left /usr/bin/machina"
		[ -f /etc/machina/master.key ] && [ -f /var/lib/machina/state.db ] || fail "dpkg -r removed the site"
		say "dpkg -r: binaries gone, /etc/machina and /var/lib/machina kept"
	fi
	if grep -q '^dpkg --purge machina' "$run"; then
		[ ! -e /etc/machina ] && [ ! -e /var/lib/machina ] || fail "dpkg --purge left /etc/machina or /var/lib/machina"
		say "dpkg --purge: /etc/machina and /var/lib/machina gone; user machina kept: $(getent passwd machina | cut -d: -f1)"
	fi
done
say "ok: $n_done blocks of docs/operations.md run"
