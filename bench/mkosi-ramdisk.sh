#!/bin/sh
# bench/mkosi-ramdisk.sh: builds the ramdisk's equivalent with mkosi (Debian
# 12's mkosi 14) next to `make ramdisk`'s build and prints both builds' wall
# time and output size (docs/ramdisk.md, "Size and the mkosi question").
# Not part of `make test`: it needs root and the Debian mirror apt uses
# (MIRROR, default http://deb.debian.org/debian), and it changes nothing in
# the build (scripts/build-ramdisk.sh stays the ramdisk's build).
#
# What "equivalent" means here: the same agent as /init, the same kernel
# modules (both in the order files the agent reads) and the same udev-free
# lvm.conf, taken from a `STORAGE_TOOLS=0` run of scripts/build-ramdisk.sh
# (the part mkosi cannot make: the Go build and the module selection by
# modprobe --show-depends), put into the image as mkosi's extra tree; and
# the storage tools as Debian packages (mdadm, lvm2, e2fsprogs, xfsprogs)
# installed by mkosi into a debootstrap minbase root (mkosi 14's Debian
# base), with --base-packages=no (no systemd, no kernel: the agent is PID
# 1 and the kernel is fetched apart), no documentation (removed with
# --remove-files: mkosi 14's --with-docs=no runs rm through systemd-nspawn,
# which fails on a host without systemd as PID 1), no package metadata. The cpio is compressed as build-ramdisk.sh compresses its own
# (gzip -9n). Each mkosi build starts from an empty package cache, as a
# mkosi build in CI would without a kept cache.
#
# Usage (root): sh bench/mkosi-ramdisk.sh [WORKDIR]   (default: a temporary
# folder, removed at the end; give one to keep the outputs)
# Needs: mkosi, debootstrap, systemd-container (systemd-nspawn), cpio,
# gzip, curl, Go, the kernel package cache of `make ramdisk` (out/ramdisk/cache).
set -eu
cd "$(dirname "$0")/.."
REPO=$(pwd)
[ "$(id -u)" = 0 ] || { echo "mkosi-ramdisk: needs root (mkosi)" >&2; exit 1; }
for tool in mkosi debootstrap systemd-nspawn cpio gzip curl; do
	command -v "$tool" >/dev/null 2>&1 || { echo "mkosi-ramdisk: $tool not found (apt-get install mkosi debootstrap systemd-container)" >&2; exit 1; }
done
MIRROR=${MIRROR:-http://deb.debian.org/debian}
if ! curl -fsS -o /dev/null --max-time 30 "$MIRROR/dists/bookworm/InRelease"; then
	echo "mkosi-ramdisk: the Debian mirror $MIRROR is unreachable: no mkosi build" >&2
	exit 1
fi
KEEP=${1:-}
W=${KEEP:-$(mktemp -d)}
mkdir -p "$W"
W=$(cd "$W" && pwd)
cleanup() { [ -n "$KEEP" ] || rm -rf "$W"; }
trap cleanup EXIT INT TERM

now() { date +%s.%N; }
secs() { echo "$1 $2" | awk '{printf "%.1f", $2-$1}'; }
CACHE=$REPO/out/ramdisk/cache

# 1. make ramdisk's build, as `make ramdisk` runs it (kernel package cached).
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
t0=$(now)
OUT=$W/make CACHE=$CACHE sh scripts/build-ramdisk.sh > "$W/make.log" 2>&1
t1=$(now)

# 2. The agent and modules alone (no storage tools), for mkosi's extra tree.
OUT=$W/base CACHE=$CACHE STORAGE_TOOLS=0 sh scripts/build-ramdisk.sh > "$W/base.log" 2>&1
t2=$(now)
rm -rf "$W/extra" && mkdir -p "$W/extra/etc/lvm"
(cd "$W/extra" && gzip -dc "$W/base/initrd.cpio.gz" | cpio -id --quiet)
cp ramdisk/lvm.conf "$W/extra/etc/lvm/lvm.conf"
# the storage modules, as build-ramdisk.sh puts them: from the full build
(cd "$W/make" && mkdir -p x && cd x && gzip -dc ../initrd.cpio.gz | cpio -id --quiet 'modules/storage/*')
cp -r "$W/make/x/modules/storage" "$W/extra/modules/storage"
t3=$(now)

# 3. mkosi: minbase + the storage packages + the extra tree, as a cpio.
# mkosi 14 writes a kernel-install hook into etc/kernel/install.d after
# the packages and fails when no package made that folder (no systemd with
# --base-packages=no): an empty skeleton folder, copied after debootstrap,
# is there for it.
rm -rf "$W/mkosi" "$W/skeleton" && mkdir -p "$W/mkosi" "$W/skeleton/etc/kernel/install.d"
t4=$(now)
(cd "$W/mkosi" && mkosi --distribution debian --release bookworm --mirror "$MIRROR" \
	--format cpio --base-packages no --package mdadm,lvm2,e2fsprogs,xfsprogs \
	--with-docs yes --remove-files /usr/share/doc,/usr/share/man,/usr/share/locale,/usr/share/info,/usr/share/lintian,/usr/share/groff \
	--clean-package-metadata yes --skeleton-tree "$W/skeleton" --extra-tree "$W/extra" \
	--workspace-dir "$W/mkosi" --output "$W/mkosi/image.cpio" --force build) > "$W/mkosi.log" 2>&1 ||
	{ tail -30 "$W/mkosi.log" >&2; echo "mkosi-ramdisk: mkosi build failed (log above)" >&2; exit 1; }
t5=$(now)
gzip -9n < "$W/mkosi/image.cpio" > "$W/mkosi/image.cpio.gz"
t6=$(now)

mk=$(wc -c < "$W/make/initrd.cpio.gz")
mku=$(gzip -dc "$W/make/initrd.cpio.gz" | wc -c)
mo=$(wc -c < "$W/mkosi/image.cpio.gz")
mou=$(wc -c < "$W/mkosi/image.cpio")
files=$(cpio -it --quiet < "$W/mkosi/image.cpio" | wc -l)
echo "load average before: $LOAD0; after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "make ramdisk (scripts/build-ramdisk.sh): $(secs "$t0" "$t1") s, initrd.cpio.gz $mk bytes ($mku uncompressed)"
echo "agent + modules (STORAGE_TOOLS=0) and extra tree: $(secs "$t1" "$t3") s"
echo "mkosi build (debootstrap minbase + mdadm lvm2 e2fsprogs xfsprogs + extra tree, cpio): $(secs "$t4" "$t5") s, gzip -9n $(secs "$t5" "$t6") s"
echo "mkosi image.cpio.gz $mo bytes ($mou uncompressed, $files entries)"
echo "mkosi total (agent and modules + mkosi + gzip): $(secs "$t1" "$t6") s"
echo "largest folders of the mkosi root (KiB):"
rm -rf "$W/mkosi/x" && mkdir -p "$W/mkosi/x" && (cd "$W/mkosi/x" && cpio -id --quiet < ../image.cpio 2>/dev/null; du -k -d 3 . | sort -rn | head -12)
