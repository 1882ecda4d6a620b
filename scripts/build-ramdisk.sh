#!/bin/sh
# Builds the Machina ramdisk: Debian's kernel (linux-image-$ARCH, extracted with
# apt-get download + dpkg-deb -x, nothing installed), and a gzip'd newc cpio
# whose /init is the static Go agent (cmd/machina-agent) plus the kernel
# modules it loads, with their dependencies in load order. Writes
#   $OUT/vmlinuz  $OUT/initrd.cpio.gz  $OUT/manifest.txt (SHA-256 sums, versions, modules)
# Reproducible: same kernel package + same source + same Go => same bytes
# (sorted cpio, fixed mtimes and owners, gzip -n, go build -trimpath).
# Environment: ARCH (amd64, the default, or arm64: the kernel package and the
# agent's GOARCH; a foreign kernel is fetched through a private apt state, see
# scripts/fetch-kernel.sh), OUT (default out/ramdisk for amd64,
# out/ramdisk/arm64 for arm64: the controller serves OUT's parent folder at
# /boot/ramdisk/ and an arm64 machine's script names arm64/), CACHE (default
# out/ramdisk/cache, shared by both architectures), KERNEL_PKG (default: what
# linux-image-$ARCH depends on), SOURCE_DATE_EPOCH, EXTRA_MODULES
# (space-separated module names to add), STORAGE_TOOLS (0 leaves out the
# storage layout's tools and modules below; default 1 for amd64).
#
# Storage layout tools (docs/storage.md): mdadm, lvm, mke2fs (as mkfs.ext4),
# resize2fs, mkfs.xfs, xfs_growfs and mkswap are copied from this machine's
# Debian packages (mdadm, lvm2, e2fsprogs, xfsprogs, util-linux) with every
# shared library ldd names and the ELF interpreter, the way initramfs-tools'
# copy_exec does, plus a udev-free /etc/lvm/lvm.conf and /etc/mke2fs.conf.
# The agent runs them by absolute path. They are host binaries, so an arm64
# ramdisk built on amd64 has none (its layout step fails, naming the tool).
set -eu
cd "$(dirname "$0")/.."
REPO=$(pwd)
ARCH=${ARCH:-amd64}
case $ARCH in
amd64) OUT=${OUT:-$REPO/out/ramdisk} ;;
arm64) OUT=${OUT:-$REPO/out/ramdisk/arm64} ;;
*) echo "build-ramdisk: ARCH must be amd64 or arm64 (got '$ARCH')" >&2; exit 2 ;;
esac
mkdir -p "$OUT" "$REPO/out/ramdisk"
OUT=$(cd "$OUT" && pwd)
CACHE=${CACHE:-$REPO/out/ramdisk/cache}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
GO=${GO:-go}

# md RAID1 (md_mod, raid1), device-mapper for LVM (dm_mod), and the
# filesystems the layout grows and writes the deployed OS's files on.
STORAGE_MODULES="md_mod raid1 dm_mod ext4 xfs"

# Drivers for the machines Machina provisions (virtual lab + common server
# hardware). arm64 adds virtio_mmio (qemu's virt board also has MMIO
# transports) and drops ata_piix (an Intel PIIX/ICH south bridge driver).
case $ARCH in
amd64) MODULES="virtio_pci virtio_net virtio_blk virtio_scsi virtio_rng
  e1000 e1000e igb ixgbe i40e ice bnxt_en mlx5_core tg3
  nvme ahci ata_piix sd_mod megaraid_sas mpt3sas" ;;
arm64) MODULES="virtio_pci virtio_mmio virtio_net virtio_blk virtio_scsi virtio_rng
  e1000e igb ixgbe i40e ice bnxt_en mlx5_core tg3
  nvme ahci sd_mod megaraid_sas mpt3sas" ;;
esac
STORAGE_TOOLS=${STORAGE_TOOLS:-$([ "$ARCH" = amd64 ] && echo 1 || echo 0)}
[ "$STORAGE_TOOLS" = 1 ] || STORAGE_MODULES=""
MODULES="$MODULES ${EXTRA_MODULES:-}"

# modprobe (kmod) lives in /sbin, which a non-root user's PATH on Debian
# does not hold; it only reads the extracted modules here.
PATH=$PATH:/usr/sbin:/sbin
for tool in modprobe cpio gzip sha256sum; do
	command -v "$tool" >/dev/null 2>&1 || { echo "build-ramdisk: $tool not found" >&2; exit 1; }
done

# The kernel package, extracted into the cache (scripts/fetch-kernel.sh).
ROOT=$(ARCH="$ARCH" CACHE="$CACHE" sh "$REPO/scripts/fetch-kernel.sh")
DEBVER=${ROOT##*/root-}
DEBVER=${DEBVER#"$ARCH"-}
KVER=$(ls "$ROOT/lib/modules" | head -n1)
PKG=linux-image-$KVER

SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
VERSION=$(git describe --always --dirty 2>/dev/null || echo dev)

STAGE=$OUT/stage
rm -rf "$STAGE"
mkdir -p "$STAGE/modules" "$STAGE/proc" "$STAGE/sys" "$STAGE/dev" "$STAGE/tmp"
CGO_ENABLED=0 GOOS=linux GOARCH=$ARCH "$GO" build -trimpath -buildvcs=false \
	-ldflags "-s -w -X main.version=$VERSION" -o "$STAGE/init" ./cmd/machina-agent

# copy_exec BIN: BIN and every library ldd resolves, at their own paths.
copy_exec() {
	src=$(command -v "$1") || { echo "build-ramdisk: $1 not found (install its Debian package: scripts/deps.sh)" >&2; exit 1; }
	mkdir -p "$STAGE/usr/sbin"
	cp -L "$src" "$STAGE/usr/sbin/${2:-$(basename "$src")}"
	ldd "$src" | awk '$2=="=>"&&$3~/^\//{print $3} $1~/^\//{print $1}' | while read -r lib; do
		[ -e "$STAGE$lib" ] && continue
		mkdir -p "$STAGE$(dirname "$lib")"
		cp -L "$lib" "$STAGE$lib"
	done
}
if [ "$STORAGE_TOOLS" = 1 ]; then
	PATH=$PATH:/usr/sbin:/sbin
	copy_exec mdadm
	copy_exec lvm
	copy_exec mke2fs mkfs.ext4
	copy_exec resize2fs
	copy_exec mkfs.xfs
	copy_exec xfs_growfs
	copy_exec mkswap
	mkdir -p "$STAGE/etc/lvm" "$STAGE/run"
	cp /etc/mke2fs.conf "$STAGE/etc/mke2fs.conf"
	cp "$REPO/ramdisk/lvm.conf" "$STAGE/etc/lvm/lvm.conf"
fi

# Dependency order from modprobe; first appearance wins, so dependencies come first.
# copy_modules DIR MODULE...: DIR/order.txt, skipping what /modules already has.
copy_modules() {
	dir=$1
	shift
	mkdir -p "$dir"
	: > "$dir/order.txt"
	for m in "$@"; do
		modprobe -d "$ROOT" -S "$KVER" --show-depends "$m" 2>/dev/null || { echo "build-ramdisk: module $m not in $PKG" >&2; exit 1; }
	done | awk '$1=="insmod"{print $2}' | awk '!seen[$0]++' | while read -r ko; do
		case $ko in *.ko) ;; *) echo "build-ramdisk: compressed module $ko not supported (kernel lacks MODULE_DECOMPRESS)" >&2; exit 1 ;; esac
		name=$(basename "$ko")
		[ "$dir" != "$STAGE/modules" ] && grep -qx "$name" "$STAGE/modules/order.txt" && continue
		cp "$ko" "$dir/$name"
		echo "$name" >> "$dir/order.txt"
	done
}
copy_modules "$STAGE/modules" $MODULES
# The storage layout's modules are loaded by the agent only when a deploy
# plan has a layout, so commissioning does not pay for them at boot.
[ -z "$STORAGE_MODULES" ] || copy_modules "$STAGE/modules/storage" $STORAGE_MODULES

find "$STAGE" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
(cd "$STAGE" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --reproducible --owner=0:0 --quiet) | gzip -9n > "$OUT/initrd.cpio.gz.tmp"
mv "$OUT/initrd.cpio.gz.tmp" "$OUT/initrd.cpio.gz"
cp "$ROOT/boot/vmlinuz-$KVER" "$OUT/vmlinuz"

{
	echo "# Machina ramdisk manifest"
	echo "arch: $ARCH"
	echo "kernel-package: $PKG $DEBVER"
	echo "kernel-release: $KVER"
	echo "agent-version: $VERSION"
	echo "go: $("$GO" env GOVERSION)"
	echo "source-date-epoch: $SOURCE_DATE_EPOCH"
	echo "modules: $(wc -l < "$STAGE/modules/order.txt")"
	[ -z "$STORAGE_MODULES" ] || echo "storage-modules: $(wc -l < "$STAGE/modules/storage/order.txt")"
	echo "sha256:"
	(cd "$OUT" && sha256sum vmlinuz initrd.cpio.gz)
} > "$OUT/manifest.txt"
rm -rf "$STAGE"
echo "ramdisk: $OUT/initrd.cpio.gz $(wc -c < "$OUT/initrd.cpio.gz") bytes, kernel $PKG $DEBVER ($(wc -c < "$OUT/vmlinuz") bytes)"
echo "manifest: $OUT/manifest.txt"
