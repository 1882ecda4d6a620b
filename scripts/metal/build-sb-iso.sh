#!/bin/sh
# build-sb-iso.sh: build Machina's virtual-media boot ISO for UEFI Secure Boot servers, from
# Debian's signed boot chain only.
#
#   scripts/metal/build-sb-iso.sh CONTROLLER_URL [OUTDIR]
#
# CONTROLLER_URL  the controller's base URL as machines reach it, e.g. http://10.99.0.1:8080.
#                 Its host (an IPv4 address or a DNS name) is where GRUB fetches its
#                 configuration by TFTP (port 69).
# OUTDIR          where to write the ISO (default: ./out/iso). Also settable as MACHINA_ISO_DIR.
#
# Writes:
#   machina-sb-uefi.iso         El Torito EFI boot image (FAT12, built with mtools) holding
#                               EFI/BOOT/BOOTX64.EFI  shim (shim-signed: shimx64.efi.signed, signed by
#                                                     Microsoft's UEFI CA 2011, in the db of firmware
#                                                     with Microsoft's keys) at the removable-media
#                                                     path, so no NVRAM boot entry is needed;
#                               EFI/BOOT/grubx64.efi  GRUB (grub-efi-amd64-signed:
#                                                     grubnetx64.efi.signed, signed by Debian's Secure
#                                                     Boot CA, which shim trusts), under the name shim
#                                                     loads from its own directory;
#                               grub/grub.cfg         the script below, where that GRUB image looks
#                                                     (its built-in prefix is /grub on the device it
#                                                     was loaded from).
#                               The ISO9660 tree holds the FAT image and grub/grub.cfg again.
#   machina-sb-uefi.iso.sha256  its checksum (sha256sum format).
#
# The script: net_bootp (DHCP on every NIC the firmware's network stack offers, through GRUB's
# efinet), then source (tftp,HOST)/grub/grub.cfg, the configuration the controller's TFTP
# server gives every Secure Boot machine (boot.GRUBPrefixConfig), which chains to the
# per-machine script with ${net_default_mac} (here the first NIC that got a lease, efinet0):
# the same lookup and single-use token as the iPXE ISO's chain to /boot/ipxe?mac=..., so this
# ISO, like the iPXE ones, is one per controller, not per server. Debian's signed GRUB images
# have no HTTP client (grub-efi-amd64-signed 2.06-13+deb12u2 builds none into them and, with
# Secure Boot on, GRUB loads no module from disk), so TFTP is the only protocol they fetch with.
# GRUB's `linux` has shim verify the kernel (shim_lock): Debian's signed kernel boots, another
# is refused. UEFI only; Secure Boot may be on or off.
#
# The controller serves OUTDIR at /boot/iso/NAME (boot/ipxe Config.ISODir) for BMC InsertMedia;
# the reconciler hands this ISO to Secure Boot servers (reconciler Config.SBISOURL).
# Tools: xorriso, mtools (mformat, mmd, mcopy), shim-signed, grub-efi-amd64-signed. No root, no
# loop devices. Deterministic apart from file times (SOURCE_DATE_EPOCH is honoured by xorriso).
set -eu

usage() { sed -n '2,43p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
URL=${1%/}
OUT=${2:-${MACHINA_ISO_DIR:-out/iso}}

case $URL in
http://?*|https://?*) ;;
*) echo "build-sb-iso: controller URL must start with http:// or https://" >&2; exit 2 ;;
esac
HOST=${URL#*://}
HOST=${HOST%%/*}
HOST=${HOST%:*}
# GRUB's device syntax takes a host name or an IPv4 address; nothing GRUB or a shell could
# interpret may reach the script.
if [ -z "$HOST" ] || printf '%s' "$HOST" | LC_ALL=C grep -q '[^A-Za-z0-9.-]'; then
	echo "build-sb-iso: controller host must be an IPv4 address or a DNS name (got '$HOST')" >&2; exit 2
fi

need() { command -v "$1" >/dev/null 2>&1 || { echo "build-sb-iso: $1 missing (Debian package $2)" >&2; exit 1; }; }
need xorriso xorriso
need mformat mtools
need mcopy mtools
need mmd mtools

pkgfile() { # pkgfile PACKAGE SUFFIX FALLBACK
	f=$(dpkg -L "$1" 2>/dev/null | grep -E "$2\$" | head -n1 || true)
	[ -n "$f" ] || f=$3
	[ -r "$f" ] || { echo "build-sb-iso: $3 not found (Debian package $1)" >&2; exit 1; }
	printf '%s\n' "$f"
}
SHIM=$(pkgfile shim-signed /shimx64.efi.signed /usr/lib/shim/shimx64.efi.signed)
GRUB=$(pkgfile grub-efi-amd64-signed /grubnetx64.efi.signed /usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed)

mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT INT TERM

T=$WORK/tree
mkdir -p "$T/grub"
# net_bootp names each configured interface CARD:dhcp; the controller's configuration reads
# ${net_default_mac}, which follows net_default_interface, where GRUB 2.06 finds the interface
# only under the variable form of its name, CARD_dhcp (CARD:dhcp leaves the MAC empty).
cat > "$T/grub/grub.cfg" <<EOF
# Machina (Secure Boot virtual media): get an address, then the controller's configuration.
set timeout=0
echo "Machina: DHCP"
net_bootp
set net_default_interface=efinet0_dhcp
echo "Machina: sourcing (tftp,$HOST)/grub/grub.cfg for \${net_default_mac}"
source (tftp,$HOST)/grub/grub.cfg
echo "Machina: no boot configuration from $HOST; leaving GRUB for the firmware's next boot device"
sleep 5
exit 1
EOF

EFIIMG=$WORK/efiboot.img
SIZE_KB=$(( ($(wc -c < "$SHIM") + $(wc -c < "$GRUB")) / 1024 + 512 ))
mformat -i "$EFIIMG" -C -T $((SIZE_KB * 2)) -h 2 -s 16 -v MACHINASB ::
mmd -i "$EFIIMG" ::EFI ::EFI/BOOT ::grub
mcopy -i "$EFIIMG" "$SHIM" ::EFI/BOOT/BOOTX64.EFI
mcopy -i "$EFIIMG" "$GRUB" ::EFI/BOOT/grubx64.efi
mcopy -i "$EFIIMG" "$T/grub/grub.cfg" ::grub/grub.cfg
mv "$EFIIMG" "$T/efiboot.img"
xorriso -as mkisofs -quiet -o "$OUT/machina-sb-uefi.iso" -V MACHINA_SB_EFI -R -J \
	-e efiboot.img -no-emul-boot -isohybrid-gpt-basdat "$T"

(cd "$OUT" && sha256sum machina-sb-uefi.iso > machina-sb-uefi.iso.sha256)
echo "build-sb-iso: wrote $OUT/machina-sb-uefi.iso for $URL"
