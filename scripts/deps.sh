#!/bin/sh
# scripts/deps.sh [test|demo|list]: installs what Machina's tests (test, the
# default) or `make demo` (demo) use as real protocol peers and build tools,
# on Debian 12. `make test`, `make demo` and .ci/run call it.
#
#   root:                     apt-get update + install of the missing packages
#   not root, `sudo -n` works: the same through sudo
#   otherwise:                prints the exact command to run as root, exit 1
#
# Then (test) the npm modules of the schema second opinion (scripts/ajv,
# `npm ci`, from the npm registry). Nothing is installed when nothing is
# missing, so a second run needs no network. `list` prints the package list.
# DEPS_ADMINDIR names another dpkg database to consult (dpkg-query
# --admindir), e.g. an empty folder to try the fresh-machine path here.
# Every Debian package a test names when its peer is missing
# (internal/peertest.Packages) is in TEST_PKGS (peertest's
# TestPackagesInDepsScript).
set -eu
cd "$(dirname "$0")/.."
mode=${1:-test}

# lldpd is the switch side of the ramdisk's LLDP tests (ramdisk/agent).
# cloud-init is the second opinion on the network-config v2 documents and
# the merged cloud-config user-data Machina writes into NoCloud seeds.
# The ramdisk build copies mdadm, lvm (lvm2), mke2fs and resize2fs
# (e2fsprogs), mkfs.xfs and xfs_growfs (xfsprogs) and mkswap (util-linux)
# with their shared libraries from this machine (scripts/build-ramdisk.sh).
# prometheus ships promtool, which checks and unit-tests the alerting rules
# of the monitoring kit (packaging/monitoring).
# The simulated lab's IPMI servers run OpenIPMI's ipmi_sim; ipmitool is the
# second client the tests cross-check with.
DEMO_PKGS="openipmi ipmitool"
TEST_PKGS="$DEMO_PKGS
  git make gcc ca-certificates iproute2 util-linux mount coreutils grep tar gzip dash dpkg apt
  qemu-system-x86 qemu-utils qemu-block-extra ovmf ipxe
  qemu-system-arm qemu-efi-aarch64 grub-common
  busybox-static udhcpc isc-dhcp-client tftp-hpa dnsmasq-base
  xorriso mtools syslinux-common isolinux syslinux-efi grub-efi-amd64-bin grub-pc-bin
  e2fsprogs dosfstools cpio kmod socat gdisk fdisk lvm2 mdadm xfsprogs
  chromium chromium-driver
  curl openssl openssh-client
  debootstrap syslinux
  tshark nginx-light etcd-server etcd-client systemd
  python3 python3-pyghmi
  prometheus
  swtpm swtpm-tools lldpd cloud-init
  shim-signed grub-efi-amd64-signed sbsigntool"

case $mode in
test) PKGS=$TEST_PKGS ;;
demo) PKGS=$DEMO_PKGS ;;
list) echo $TEST_PKGS; exit 0 ;;
*) echo "usage: $0 [test|demo|list]" >&2; exit 2 ;;
esac
# node and npm run ajv; take Debian's when none is installed (a node from
# elsewhere, e.g. nodesource or a tarball, is fine).
if [ "$mode" = test ] && ! { command -v node && command -v npm; } >/dev/null 2>&1; then
	PKGS="$PKGS nodejs npm"
fi

missing=""
for p in $PKGS; do
	dpkg-query ${DEPS_ADMINDIR:+--admindir="$DEPS_ADMINDIR"} -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
missing=${missing# }
if [ -n "$missing" ]; then
	if [ "$(id -u)" = 0 ]; then
		SUDO=
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		SUDO="sudo -n"
	else
		cat >&2 <<EOF
deps.sh: missing Debian packages: $missing
deps.sh: not root and no password-less sudo; run as root, then re-run:

  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing

EOF
		exit 1
	fi
	echo "deps.sh: installing $missing"
	# Retry while another apt/dpkg holds the lock (up to 10 minutes).
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
	# shellcheck disable=SC2086
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $missing
fi

[ "$mode" = test ] || exit 0
# The schema second opinion (schema/ajv_test.go) runs ajv under node.
if [ ! -f scripts/ajv/node_modules/ajv/package.json ] || [ scripts/ajv/package-lock.json -nt scripts/ajv/node_modules/.package-lock.json ]; then
	npm ci --prefix scripts/ajv --no-audit --no-fund --loglevel=error
fi
