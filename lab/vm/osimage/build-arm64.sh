#!/bin/sh
# build-arm64.sh [OUTDIR] : builds the VM lab's minimal arm64 OS image into
# OUTDIR/os.img and OUTDIR/SHA256SUMS (default OUTDIR out/os-image-arm64). No root.
#
# Debian 12 arm64 packages, fetched with scripts/apt-foreign.sh (a private apt state, no
# dpkg --add-architecture) and unpacked with dpkg-deb -x; nothing arm64 runs on this machine, so
# no qemu-user binfmt is needed (a debootstrap --arch arm64 would need it for its second stage):
#   - the kernel: linux-image-arm64 (the ramdisk build's, scripts/fetch-kernel.sh) and the
#     modules the first boot needs (virtio, vfat for the seed, bridge for the join's network);
#   - busybox-static (sh and the tools), curl and openssl with their libraries (apt's closure):
#     what the controller's first-boot join command and install.sh run;
#   - /init: lab/vm/osimage/arm64init (Go, GOARCH=arm64), which mounts, loads the modules,
#     leases eth0 with DHCP, applies the NoCloud seed's write_files and runcmd, and runs the
#     units machina-node install-unit enables (it is also /bin/systemctl).
# The root file system is the initramfs (a gzip'd newc cpio); the disk holds the boot chain:
#   MBR, p1 sectors 2048..end, type ef, FAT16 "MACHINA-A64": EFI/BOOT/BOOTAA64.EFI = GRUB
#   (grub-efi-arm64-bin packed by grub-mkimage with an embedded configuration) which loads
#   /vmlinuz and /initrd.img with console=ttyAMA0.
# The image is 96 MiB; the 4 GiB lab disk leaves room for the seed partition the ramdisk adds.
# The initrd is reproducible from the same packages, source and Go (fixed mtimes, sorted cpio,
# gzip -n); the disk image nearly: mtools 4.0.32 stamps the two folders mmd makes (EFI, EFI/BOOT)
# with the build time (2 bytes differ between two builds).
set -eu
cd "$(dirname "$0")/../../.."
REPO=$(pwd)
OUT=${1:-$REPO/out/os-image-arm64}
CACHE=${CACHE:-$REPO/out/ramdisk/cache}
GO=${GO:-go}
IMG_MIB=96
ESP_START=2048
mkdir -p "$OUT" "$CACHE"
OUT=$(cd "$OUT" && pwd)
CACHE=$(cd "$CACHE" && pwd)
PATH=$PATH:/usr/sbin:/sbin # modprobe, sfdisk, mkfs.vfat: not on a non-root user's PATH on Debian
for t in dpkg-deb apt-get modprobe cpio gzip grub-mkimage sfdisk mkfs.vfat mcopy mmd sha256sum; do
	command -v "$t" >/dev/null 2>&1 || { echo "build-arm64.sh: $t not found (packages: dpkg, apt, kmod, cpio, grub-common, fdisk, dosfstools, mtools)" >&2; exit 1; }
done
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
export SOURCE_DATE_EPOCH # mkfs.vfat stamps the FAT with it
WORK=$(mktemp -d "$OUT/.work.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM
R=$WORK/root
mkdir -p "$R"

# Packages: busybox-static, curl, openssl and everything they depend on.
DEBS=$CACHE/os-arm64-debs
mkdir -p "$DEBS"
PKGS=$(ARCH=arm64 CACHE="$CACHE" sh "$REPO/scripts/apt-foreign.sh" closure busybox-static curl openssl)
[ -n "$PKGS" ] || { echo "build-arm64.sh: apt found no closure for busybox-static curl openssl" >&2; exit 1; }
for p in $PKGS; do
	ls "$DEBS/${p}"_*_arm64.deb >/dev/null 2>&1 || ls "$DEBS/${p}"_*_all.deb >/dev/null 2>&1 ||
		(cd "$DEBS" && ARCH=arm64 CACHE="$CACHE" sh "$REPO/scripts/apt-foreign.sh" download "$p")
done
for p in $PKGS; do
	deb=$(ls "$DEBS/${p}"_*_arm64.deb "$DEBS/${p}"_*_all.deb 2>/dev/null | sort | tail -n1)
	dpkg-deb -x "$deb" "$R"
	echo "$(basename "$deb")" >> "$WORK/packages.txt"
done
rm -rf "$R/usr/share/doc" "$R/usr/share/man" "$R/usr/share/info" "$R/usr/share/locale" "$R/usr/share/lintian" "$R/usr/share/bug"
# busybox applets the join command, install.sh and an operator on the console use.
for a in sh ash cat cut sha256sum mkdir chmod cp mv rm mktemp uname ls ip ps sleep mount umount grep tr head tail sed awk env id hostname dmesg date df free kill poweroff reboot ln touch wc sort uniq printf test true false; do
	ln -sf busybox "$R/bin/$a"
done
mkdir -p "$R/proc" "$R/sys" "$R/dev" "$R/run" "$R/tmp" "$R/root" "$R/var/lib" "$R/usr/local/bin" "$R/etc/systemd/system" "$R/modules"
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$R/etc/passwd"
printf 'root:x:0:\n' > "$R/etc/group"
printf 'NAME="Machina lab arm64 OS"\nID=machina-lab\nVERSION_ID=1\n' > "$R/etc/os-release"
echo machina-os > "$R/etc/hostname"

# Kernel and modules.
KROOT=$(ARCH=arm64 CACHE="$CACHE" sh "$REPO/scripts/fetch-kernel.sh")
KVER=$(ls "$KROOT/lib/modules" | head -n1)
: > "$R/modules/order.txt"
for m in virtio_pci virtio_mmio virtio_net virtio_blk virtio_rng vfat nls_cp437 nls_ascii nls_utf8 bridge; do
	modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" 2>/dev/null || { echo "build-arm64.sh: module $m not in linux-image-$KVER" >&2; exit 1; }
done | awk '$1=="insmod"{print $2}' | awk '!seen[$0]++' | while read -r ko; do
	cp "$ko" "$R/modules/"
	basename "$ko" >> "$R/modules/order.txt"
done

# /init (and systemctl).
CGO_ENABLED=0 GOOS=linux GOARCH=arm64 "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$R/init" ./lab/vm/osimage/arm64init
ln -sf /init "$R/bin/systemctl"

find "$R" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
(cd "$R" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --reproducible --owner=0:0 --quiet) | gzip -6n > "$WORK/initrd.img"

# GRUB for the disk: grub-efi-arm64-bin's modules (the network image's cache, scripts/build-grub-arm64.sh).
GDEB=$(ls "$CACHE"/grub-efi-arm64-bin_*_arm64.deb 2>/dev/null | head -n1 || true)
if [ -z "$GDEB" ]; then
	(cd "$CACHE" && ARCH=arm64 CACHE="$CACHE" sh "$REPO/scripts/apt-foreign.sh" download grub-efi-arm64-bin)
	GDEB=$(ls "$CACHE"/grub-efi-arm64-bin_*_arm64.deb | head -n1)
fi
GROOT=$WORK/grub
dpkg-deb -x "$GDEB" "$GROOT"
cat > "$WORK/grub.cfg" <<'CFG'
set timeout=0
echo "Machina lab arm64 OS: booting from disk"
search --no-floppy --label MACHINA-A64 --set root
linux /vmlinuz console=ttyAMA0 panic=-1 rdinit=/init
initrd /initrd.img
boot
CFG
grub-mkimage -O arm64-efi -d "$GROOT/usr/lib/grub/arm64-efi" -p /EFI/BOOT -c "$WORK/grub.cfg" -o "$WORK/BOOTAA64.EFI" \
	part_msdos fat linux echo search search_label normal gzio test

IMG=$WORK/os.img
truncate -s "${IMG_MIB}M" "$IMG"
sfdisk --quiet "$IMG" <<SFD
label: dos
label-id: 0x4d413634
start=$ESP_START, type=ef, bootable
SFD
ESP_SECTORS=$((IMG_MIB * 2048 - ESP_START))
mkfs.vfat -F 16 -n MACHINA-A64 -i 4d413634 --offset=$ESP_START "$IMG" $((ESP_SECTORS / 2)) > "$WORK/mkfs.log" 2>&1
E="$IMG@@$((ESP_START * 512))"
export MTOOLS_SKIP_CHECK=1
mmd -i "$E" ::EFI ::EFI/BOOT
mcopy -i "$E" "$WORK/BOOTAA64.EFI" ::EFI/BOOT/BOOTAA64.EFI
mcopy -i "$E" "$KROOT/boot/vmlinuz-$KVER" ::vmlinuz
mcopy -i "$E" "$WORK/initrd.img" ::initrd.img

SUM=$(sha256sum "$IMG" | cut -d' ' -f1)
printf '%s  os.img\n' "$SUM" > "$WORK/SHA256SUMS"
printf '%s\n' "$KVER" > "$WORK/kernel-version"
mv "$IMG" "$OUT/os.img"
mv "$WORK/kernel-version" "$OUT/kernel-version"
mv "$WORK/packages.txt" "$OUT/packages.txt"
mv "$WORK/SHA256SUMS" "$OUT/SHA256SUMS" # last: its presence marks a complete build
echo "build-arm64.sh: $OUT/os.img sha256 $SUM kernel $KVER initrd $(wc -c < "$WORK/initrd.img") bytes"
