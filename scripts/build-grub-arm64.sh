#!/bin/sh
# Builds the arm64 UEFI network boot loader Machina's TFTP server hands to
# DHCP option 93 arch 11 clients: GRUB from Debian's grub-efi-arm64-bin
# (fetched for arm64 with scripts/apt-foreign.sh and unpacked with dpkg-deb
# -x; nothing is installed) packed by this machine's grub-mkimage (package
# grub-common) with the network modules and an embedded configuration that
# sources machina-grub.cfg from the TFTP server it was loaded from (the TFTP
# server generates that file; it chains to the controller's /boot/grub).
# Debian 12 ships no arm64 iPXE, and its ipxe source package is not on the
# mirrors the build may use, hence GRUB (docs/arm64.md).
#
# Writes $OUT/grubnetaa64.efi (default OUT=out/boot). Reproducible: the
# same package and the same grub-mkimage give the same bytes (the image has
# no timestamp). Environment: OUT, CACHE (default out/ramdisk/cache).
set -eu
cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT=${OUT:-$REPO/out/boot}
CACHE=${CACHE:-$REPO/out/ramdisk/cache}
mkdir -p "$OUT" "$CACHE"
OUT=$(cd "$OUT" && pwd)
CACHE=$(cd "$CACHE" && pwd)
for tool in grub-mkimage dpkg-deb apt-get; do
	command -v "$tool" >/dev/null 2>&1 || { echo "build-grub-arm64: $tool not found (Debian package grub-common, dpkg, apt)" >&2; exit 1; }
done
DEB=$(ls "$CACHE"/grub-efi-arm64-bin_*_arm64.deb 2>/dev/null | head -n1 || true)
if [ -z "$DEB" ]; then
	(cd "$CACHE" && ARCH=arm64 CACHE="$CACHE" sh "$REPO/scripts/apt-foreign.sh" download grub-efi-arm64-bin)
	DEB=$(ls "$CACHE"/grub-efi-arm64-bin_*_arm64.deb | head -n1)
fi
VER=$(dpkg-deb -f "$DEB" Version)
ROOT=$CACHE/grub-arm64-$VER
if [ ! -f "$ROOT/.done" ]; then
	rm -rf "$ROOT"
	dpkg-deb -x "$DEB" "$ROOT"
	touch "$ROOT/.done"
fi
CFG=$OUT/grub-embedded.cfg
# The firmware's PXE left the DHCP answer to efinet, so (tftp) is the server
# GRUB came from. The embedded configuration has no loops (GRUB's embedded
# config parser knows no `while`): when the controller does not answer, the
# machine reboots and the firmware's PXE tries again.
cat > "$CFG" <<'CFGEOF'
set timeout=0
echo "Machina: GRUB network boot"
source (tftp)/machina-grub.cfg
echo "Machina: machina-grub.cfg or this machine's script not available; rebooting in 5 s to retry"
sleep 5
reboot
CFGEOF
MODULES="efinet net tftp http linux echo sleep test true configfile normal reboot efi_gop all_video gzio part_gpt fat"
# shellcheck disable=SC2086
grub-mkimage -O arm64-efi -d "$ROOT/usr/lib/grub/arm64-efi" -p "(tftp)/" -c "$CFG" -o "$OUT/grubnetaa64.efi.tmp" $MODULES
mv "$OUT/grubnetaa64.efi.tmp" "$OUT/grubnetaa64.efi"
rm -f "$CFG"
echo "grub: $OUT/grubnetaa64.efi $(wc -c < "$OUT/grubnetaa64.efi") bytes, grub-efi-arm64-bin $VER, $(sha256sum "$OUT/grubnetaa64.efi" | cut -d' ' -f1)"
