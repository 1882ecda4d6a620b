#!/bin/sh
# build-ipxe-iso.sh: build Machina's virtual-media boot ISOs from Debian packages only.
#
#   scripts/metal/build-ipxe-iso.sh CONTROLLER_URL [OUTDIR]
#
# CONTROLLER_URL  the controller's base URL as machines reach it, e.g. http://10.99.0.1:8080
#                 (http or https, host and optional port/path; no spaces, quotes, '$' or '\').
# OUTDIR          where to write the ISOs (default: ./out/iso). Also settable as MACHINA_ISO_DIR.
#
# Writes:
#   machina-ipxe-bios.iso  ISOLINUX (package isolinux, syslinux-common) boots iPXE's ipxe.lkrn
#                          (package ipxe) with machina.ipxe as its initrd; iPXE runs that embedded
#                          script: DHCP, then chain to CONTROLLER_URL/boot/ipxe?mac=... . Needs no
#                          DHCP boot options on the network. Hybrid: also boots as a USB disk image.
#   machina-ipxe-uefi.iso  El Torito EFI boot image (FAT, built with mtools) holding Debian's
#                          ipxe.efi as EFI/BOOT/BOOTX64.EFI, plus the script as machina.ipxe and
#                          autoexec.ipxe at the image root. Debian 12's iPXE (git 2019-01-25) has
#                          no embedded script, no autoexec.ipxe and no EFI command line, so this
#                          iPXE gets the script URL from DHCP: it sends user class "iPXE", which
#                          Machina's DHCP answers with the script URL in full mode and in proxyDHCP
#                          mode (boot/dhcp). iPXE 1.21.1+ (Debian 13) runs autoexec.ipxe itself.
#   SHA256SUMS             checksums of both.
#
# The controller serves OUTDIR at /boot/iso/NAME (boot/ipxe Config.ISODir) for BMC InsertMedia.
# Tools: xorriso, mtools (mformat, mmd, mcopy), isolinux, syslinux-common, ipxe. No root, no loop
# devices. Deterministic apart from file times (SOURCE_DATE_EPOCH is honoured by xorriso).
set -eu

usage() { sed -n '2,27p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
URL=${1%/}
OUT=${2:-${MACHINA_ISO_DIR:-out/iso}}

case $URL in
http://?*|https://?*) ;;
*) echo "build-ipxe-iso: controller URL must start with http:// or https://" >&2; exit 2 ;;
esac
# Refuse anything iPXE's script parser or a shell could interpret.
if printf '%s' "$URL" | LC_ALL=C grep -q '[^A-Za-z0-9._~:/?#@!&()*+,;=%-]'; then
	echo "build-ipxe-iso: controller URL has characters outside the URL set" >&2; exit 2
fi
case $URL in *'$'*|*'#'*|*'?'*) echo "build-ipxe-iso: controller URL must be a base URL (no query, fragment or \$)" >&2; exit 2 ;; esac

need() { command -v "$1" >/dev/null 2>&1 || { echo "build-ipxe-iso: $1 missing (Debian package $2)" >&2; exit 1; }; }
need xorriso xorriso
need mformat mtools
need mcopy mtools
need mmd mtools

# Files shipped by the Debian packages, found through dpkg where possible.
pkgfile() { # pkgfile PACKAGE SUFFIX FALLBACK
	f=$(dpkg -L "$1" 2>/dev/null | grep -E "$2\$" | head -n1 || true)
	[ -n "$f" ] || f=$3
	[ -r "$f" ] || { echo "build-ipxe-iso: $3 not found (Debian package $1)" >&2; exit 1; }
	printf '%s\n' "$f"
}
ISOLINUX=$(pkgfile isolinux /isolinux.bin /usr/lib/ISOLINUX/isolinux.bin)
ISOHDPFX=$(pkgfile isolinux /isohdpfx.bin /usr/lib/ISOLINUX/isohdpfx.bin)
LDLINUX=$(pkgfile syslinux-common /modules/bios/ldlinux.c32 /usr/lib/syslinux/modules/bios/ldlinux.c32)
LKRN=$(pkgfile ipxe /ipxe.lkrn /usr/lib/ipxe/ipxe.lkrn)
IPXEEFI=$(pkgfile ipxe /boot/ipxe.efi /usr/lib/ipxe/ipxe.efi)

mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT INT TERM

# The embedded script: the same text as boot.ChainScript(URL/boot/ipxe) (a test compares them).
write_script() {
	cat > "$1" <<EOF
#!ipxe
# Machina: get an address (retrying), then fetch this machine's script.
:retry
isset \${net0/ip} || dhcp || goto wait
chain --autofree $URL/boot/ipxe?mac=\${net0/mac:hexhyp}&platform=\${platform}&arch=\${buildarch} || goto wait
# The script returned: boot from disk. Leave iPXE for the next boot device
# (UEFI: with an error status, so the boot manager tries the next entry).
echo Machina: leaving iPXE for the firmware's next boot device
iseq \${platform} efi && exit 1 ||
exit 0
:wait
echo Machina: boot script not available, retrying in 5 s
sleep 5
goto retry
EOF
}

# --- BIOS: ISOLINUX -> ipxe.lkrn + script as initrd ---
B=$WORK/bios
mkdir -p "$B/isolinux"
cp "$ISOLINUX" "$B/isolinux/isolinux.bin"
cp "$LDLINUX" "$B/isolinux/ldlinux.c32"
cp "$LKRN" "$B/ipxe.lkrn"
write_script "$B/machina.ipxe"
cat > "$B/isolinux/isolinux.cfg" <<'EOF'
DEFAULT machina
PROMPT 0
TIMEOUT 0
LABEL machina
  KERNEL /ipxe.lkrn
  INITRD /machina.ipxe
EOF
xorriso -as mkisofs -quiet -o "$OUT/machina-ipxe-bios.iso" -V MACHINA_IPXE -R -J \
	-isohybrid-mbr "$ISOHDPFX" -c isolinux/boot.cat -b isolinux/isolinux.bin \
	-no-emul-boot -boot-load-size 4 -boot-info-table "$B"

# --- UEFI: FAT El Torito image with ipxe.efi as the removable-media loader ---
U=$WORK/uefi
mkdir -p "$U"
write_script "$U/machina.ipxe"
EFIIMG=$U/efiboot.img
SIZE_KB=$(( ($(wc -c < "$IPXEEFI") / 1024) + 512 ))
mformat -i "$EFIIMG" -C -T $((SIZE_KB * 2)) -h 2 -s 16 -v MACHINAEFI ::
mmd -i "$EFIIMG" ::EFI ::EFI/BOOT
mcopy -i "$EFIIMG" "$IPXEEFI" ::EFI/BOOT/BOOTX64.EFI
mcopy -i "$EFIIMG" "$U/machina.ipxe" ::machina.ipxe
# iPXE 1.21.1 and later (Debian 13) run autoexec.ipxe from the filesystem they were loaded
# from; Debian 12's 2019 build ignores it and takes the script URL from DHCP instead.
mcopy -i "$EFIIMG" "$U/machina.ipxe" ::autoexec.ipxe
xorriso -as mkisofs -quiet -o "$OUT/machina-ipxe-uefi.iso" -V MACHINA_IPXE_EFI -R -J \
	-e efiboot.img -no-emul-boot -isohybrid-gpt-basdat "$U"

(cd "$OUT" && sha256sum machina-ipxe-bios.iso machina-ipxe-uefi.iso > SHA256SUMS)
echo "build-ipxe-iso: wrote $OUT/machina-ipxe-bios.iso and $OUT/machina-ipxe-uefi.iso for $URL"
