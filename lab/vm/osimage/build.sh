#!/bin/sh
# build.sh OUTDIR : builds the Machina lab OS image into OUTDIR/os.img and OUTDIR/SHA256SUMS.
#
# A minimal Debian 12 (bookworm) made with debootstrap from Debian's packages: linux-image-amd64,
# systemd, cloud-init (NoCloud datasource first), openssh-server, sudo, curl. Layout of the 512 MiB
# sparse raw image (GPT, as cloud images are, so storage layouts can grow its root partition; no loop
# devices, no host mounts of the image):
#   p1  sectors 2048..198655 (96 MiB)  EFI System, LegacyBIOSBootable  FAT16 "MACHINA-ESP" (volume id
#       4D41-4348): syslinux (BIOS, via syslinux's GPT MBR code, which boots the partition marked
#       LegacyBIOSBootable) with syslinux.cfg; for UEFI, with Secure Boot on or off, Debian's signed chain
#       at the removable-media path, so no NVRAM boot entry is needed: EFI/BOOT/BOOTX64.EFI = shim
#       (shim-signed, signed by Microsoft's UEFI CA), EFI/BOOT/grubx64.efi = GRUB (grub-efi-amd64-signed,
#       signed by Debian's Secure Boot CA; shim loads that name from its own directory) reading
#       EFI/debian/grub.cfg (its built-in prefix); plus the kernel (Debian's signed linux-image, which
#       GRUB has shim verify) and the initrd. shim and GRUB are copied from this host's packages, as
#       syslinux is.
#   p2  sectors 198656..(1 MiB-aligned end before the backup GPT) Linux filesystem  ext4 "machina-root", filled with mkfs.ext4 -d.
# mdadm and lvm2 put RAID1 and LVM in the initramfs (storage layouts: a RAID1 root boots with a member
# missing); ifenslave, vlan and bridge-utils let ifupdown bring up the bonds, VLANs and bridges cloud-init
# renders from a network layout, and net-tools its routes (cloud-init's ENI renderer writes
# "post-up route add default gw ...").
# Kernel modules for hardware no lab VM has (sound, GPUs, wireless, USB, most Ethernet, SAN adapters, ...)
# are removed (see "kernel modules" below), so the root fits in 512 MiB with about 45 MiB free: every
# deploy hashes the whole image at least twice under TCG, zeros included, so its size is deploy time.
# A deploy grows the root partition to its disk (cloud-init growpart, or the storage layout).
# The host's /boot and bootloader are never touched: nothing runs grub-install or update-grub.
# Needs root (debootstrap, chroot). Writes only below OUTDIR and a scratch folder it removes.
set -eu

OUT=${1:?usage: build.sh OUTDIR}
SUITE=bookworm
IMG_MIB=512
ESP_START=2048
ESP_SECTORS=196608 # 96 MiB
ROOT_START=$((ESP_START + ESP_SECTORS))
ROOT_UUID=6d616368-696e-4120-8f73-696d61676521 # fixed, so fstab and the kernel command line agree
# Installed with apt inside the chroot (debootstrap's own resolver does not follow virtual packages).
PACKAGES="linux-image-amd64 initramfs-tools systemd-sysv udev dbus cloud-init cloud-guest-utils openssh-server
  sudo curl ca-certificates ifupdown isc-dhcp-client iproute2 netbase procps less mdadm lvm2 ifenslave vlan bridge-utils net-tools"

[ "$(id -u)" = 0 ] || { echo "build.sh: must run as root (debootstrap, chroot)" >&2; exit 1; }
for t in debootstrap sfdisk mkfs.vfat mkfs.ext4 syslinux mcopy mmd sbverify; do
	command -v "$t" >/dev/null 2>&1 || { echo "build.sh: $t not found" >&2; exit 1; }
done
pkgfile() { dpkg -L "$1" | grep "$2\$" | head -n1; }
MBR=$(pkgfile syslinux-common /mbr/gptmbr.bin)
SHIM=$(pkgfile shim-signed /shimx64.efi.signed)
GRUB_EFI=$(pkgfile grub-efi-amd64-signed /grubx64.efi.signed)
[ -n "$MBR" ] || { echo "build.sh: gptmbr.bin not found (Debian package syslinux-common)" >&2; exit 1; }
[ -n "$SHIM" ] || { echo "build.sh: shimx64.efi.signed not found (Debian package shim-signed)" >&2; exit 1; }
[ -n "$GRUB_EFI" ] || { echo "build.sh: grubx64.efi.signed not found (Debian package grub-efi-amd64-signed)" >&2; exit 1; }

# The Debian mirror this host's apt already uses (deb822 or one-line sources).
MIRROR=${MACHINA_DEBIAN_MIRROR:-}
if [ -z "$MIRROR" ]; then
	MIRROR=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/{print $2}' | grep -v security | head -n1)
fi
if [ -z "$MIRROR" ]; then
	MIRROR=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}' | grep -v security | head -n1)
fi
[ -n "$MIRROR" ] || { echo "build.sh: no Debian mirror found in apt sources; set MACHINA_DEBIAN_MIRROR" >&2; exit 1; }

mkdir -p "$OUT"
OUT=$(realpath "$OUT")
WORK=$(mktemp -d "$OUT/.work.XXXXXX")
R="$WORK/root"
case $R in /?*/.work.*/root) ;; *) echo "build.sh: refusing chroot path $R" >&2; exit 1 ;; esac
cleanup() {
	for m in "$R/dev/pts" "$R/dev" "$R/sys" "$R/proc"; do
		if mountpoint -q "$m" 2>/dev/null; then umount "$m" || umount -l "$m"; fi
	done
	rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

echo "build.sh: debootstrap $SUITE from $MIRROR"
debootstrap --variant=minbase "$SUITE" "$R" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
	tail -n 40 "$WORK/debootstrap.log" >&2
	tail -n 40 "$R/debootstrap/debootstrap.log" >&2 2>/dev/null || true
	exit 1
}

mount -t proc proc "$R/proc"
mount -t sysfs sysfs "$R/sys"
# No service may start inside the chroot: the chroot's own policy-rc.d, removed again below.
printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d"
chmod 755 "$R/usr/sbin/policy-rc.d"
# Small initrd: only the drivers a lab VM (and common servers) need to reach the root disk. Set before
# the kernel is installed so its postinst builds the initrd once.
mkdir -p "$R/etc/initramfs-tools/conf.d"
echo MODULES=list >"$R/etc/initramfs-tools/conf.d/machina.conf"
printf '%s\n' virtio_pci virtio_blk virtio_scsi sd_mod sr_mod ata_piix ahci nvme ext4 md_mod raid1 >>"$R/etc/initramfs-tools/modules"
echo "build.sh: apt-get install" $PACKAGES
# shellcheck disable=SC2086
if ! chroot "$R" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $PACKAGES >"$WORK/apt.log" 2>&1; then
	tail -n 60 "$WORK/apt.log" >&2
	exit 1
fi
rm -f "$R/usr/sbin/policy-rc.d"

# --- kernel modules a lab guest never loads ---
# The lab's VMs are qemu pc (BIOS) and q35 (UEFI) machines with virtio disks, virtio-net NICs, an
# IDE/AHCI CD-ROM, NVMe, a TPM (tis or crb) and no display, sound, USB, wireless, camera, InfiniBand
# or SAN adapter: Debian's kernel ships drivers for all of those (its modules are 390 of the root's
# 651 MB). The trees below go, then any module left that needs one that went (modules.dep of the
# full tree says which), then depmod and the initramfs run again over what is left. The kernel itself
# is Debian's signed one, untouched (Secure Boot). KEEP_MODULES must still resolve, or the build fails:
# virtio (pci, blk, net, scsi, rng), ata_piix/ahci and sr_mod for the CD-ROM, NVMe, md RAID1 and
# device-mapper (mdadm, lvm2 in storage layouts), bonding, 8021q and bridge (network layouts and the
# node agent's bridge), the TPM drivers (attestation), efivarfs, ext4/xfs (the storage layouts'
# filesystems), vfat/nls and iso9660 (the NoCloud seed and config drives), e1000/e1000e (qemu's
# default NIC models, kept although the labs use virtio-net).
PRUNE_TREES="
	sound drivers/gpu drivers/media drivers/staging drivers/iio drivers/infiniband drivers/usb drivers/bluetooth
	drivers/net/wireless drivers/net/usb drivers/net/wwan drivers/net/can drivers/net/ieee802154
	drivers/net/hamradio drivers/comedi drivers/isdn drivers/mtd drivers/mmc drivers/memstick drivers/target
	drivers/thunderbolt drivers/firewire drivers/nfc drivers/atm drivers/pcmcia drivers/parport
	drivers/soundwire drivers/gnss
	net/bluetooth net/mac80211 net/wireless net/mac802154 net/ieee802154 net/6lowpan net/nfc net/can net/atm
	net/ax25 net/netrom net/rose net/rds net/tipc net/smc net/ceph net/sunrpc net/rxrpc net/9p
	fs/ocfs2 fs/gfs2 fs/dlm fs/ceph fs/nfs fs/nfsd fs/nfs_common fs/lockd fs/smb fs/afs fs/coda fs/orangefs
	fs/9p fs/f2fs fs/nilfs2 fs/jfs fs/reiserfs fs/ubifs fs/jffs2 fs/btrfs fs/hfs fs/hfsplus fs/affs fs/adfs
	fs/befs fs/bfs fs/efs fs/hpfs fs/minix fs/omfs fs/qnx4 fs/qnx6 fs/sysv fs/ufs fs/freevxfs fs/vboxsf"
KEEP_MODULES="virtio_pci virtio_blk virtio_net virtio_scsi virtio_rng virtio_console sd_mod sr_mod ata_piix
  ahci nvme md_mod raid1 dm_mod dm_mirror dm_snapshot bonding 8021q bridge tpm_tis tpm_crb efivarfs ext4 xfs
  vfat nls_cp437 nls_ascii nls_utf8 isofs e1000 e1000e"
KVER=$(basename "$(ls -d "$R"/lib/modules/* | head -n1)")
M="$R/usr/lib/modules/$KVER"
K="$M/kernel"
[ -d "$K/drivers" ] || { echo "build.sh: no module tree $K" >&2; exit 1; }
cp "$M/modules.dep" "$WORK/modules.dep.full"
for t in $PRUNE_TREES; do rm -rf "${K:?}/$t"; done
# Ethernet: every vendor's drivers but e1000 and e1000e (no physical NIC in a lab VM).
for f in "$K"/drivers/net/ethernet/* "$K"/drivers/net/ethernet/intel/*; do
	case ${f#"$K"/drivers/net/ethernet/} in intel | intel/e1000 | intel/e1000e) ;; *) rm -rf "$f" ;; esac
done
# SCSI: the core, sd, sr, sg, virtio_scsi and the transports stay (top level); the folders are host
# adapters (FC, SAS, iSCSI offload) no VM has.
find "$K/drivers/scsi" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
while :; do
	(cd "$M" && find kernel -name '*.ko') >"$WORK/modules.left"
	gone=$(awk 'NR == FNR { have[$1] = 1; next }
		{ sub(/:$/, "", $1); if (!($1 in have)) next
		  for (i = 2; i <= NF; i++) if (!($i in have)) { print $1; break } }' "$WORK/modules.left" "$WORK/modules.dep.full")
	[ -n "$gone" ] || break
	for f in $gone; do rm -f "${M:?}/$f"; done
done
find "$K" -depth -type d -empty -delete
chroot "$R" depmod "$KVER"
# shellcheck disable=SC2086
chroot "$R" modprobe -a -S "$KVER" --show-depends $KEEP_MODULES >/dev/null ||
	{ echo "build.sh: a module the labs need is gone from $K" >&2; exit 1; }
chroot "$R" update-initramfs -u -k "$KVER" >"$WORK/initramfs.log" 2>&1 || { tail -n 40 "$WORK/initramfs.log" >&2; exit 1; }

# --- configuration of the guest ---
echo machina-os >"$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 machina-os\n::1 localhost ip6-localhost ip6-loopback\n' >"$R/etc/hosts"
printf 'UUID=%s / ext4 errors=remount-ro 0 1\n' "$ROOT_UUID" >"$R/etc/fstab"
printf 'auto lo\niface lo inet loopback\nsource /etc/network/interfaces.d/*\n' >"$R/etc/network/interfaces"
mkdir -p "$R/etc/network/interfaces.d"
: >"$R/etc/machine-id" # systemd generates one on first boot
rm -f "$R/var/lib/dbus/machine-id" "$R"/etc/ssh/ssh_host_* # per-machine, regenerated (cloud-init cc_ssh)
cat >"$R/etc/cloud/cloud.cfg.d/90-machina.cfg" <<'EOF'
# Machina lab image: the NoCloud seed (a drive labelled CIDATA, or ds=nocloud on the command line) first.
datasource_list: [ NoCloud, None ]
EOF
[ -f "$R/boot/initrd.img-$KVER" ] || { echo "build.sh: no initrd for $KVER" >&2; exit 1; }
# Under Secure Boot, GRUB boots only a kernel shim trusts: Debian's linux-image-*-amd64 is signed.
sbverify --list "$R/boot/vmlinuz-$KVER" 2>/dev/null | grep -q 'Debian Secure Boot' ||
	{ echo "build.sh: $R/boot/vmlinuz-$KVER is not signed by Debian's Secure Boot CA" >&2; exit 1; }
# Trim what a lab OS never reads.
chroot "$R" apt-get clean
umount "$R/sys" "$R/proc"
rm -rf "$R"/var/lib/apt/lists/* "$R"/usr/share/doc/* "$R"/usr/share/man/* "$R"/usr/share/info/* \
	"$R"/var/cache/debconf/*-old "$R"/var/log/*.log "$R"/tmp/*
find "$R/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'en*' ! -name locale.alias -exec rm -rf {} +

CMDLINE="root=UUID=$ROOT_UUID ro console=tty0 console=ttyS0,115200n8 net.ifnames=0"
cat >"$WORK/syslinux.cfg" <<EOF
DEFAULT debian
PROMPT 0
TIMEOUT 0
LABEL debian
  KERNEL /vmlinuz
  INITRD /initrd.img
  APPEND $CMDLINE
EOF
# GRUB's root is the partition it was loaded from (it sets root and prefix from its own device
# path), so the kernel comes from the ESP that booted, whatever other disk or partition is there.
# No search by volume id: the ramdisk's NoCloud seed partition is a FAT with the same fixed serial
# (4D41-4348), and a search found it first on a deployed RAID1 root ("file /vmlinuz not found").
# The root filesystem is found by UUID on the kernel command line.
cat >"$WORK/grub.cfg" <<EOF
set timeout=0
linux /vmlinuz $CMDLINE
initrd /initrd.img
boot
EOF

# --- disk image ---
IMG="$WORK/os.img"
truncate -s "${IMG_MIB}M" "$IMG"
sfdisk --quiet "$IMG" <<EOF
label: gpt
label-id: 4d414348-696e-4120-8f73-696d61676500
start=$ESP_START, size=$ESP_SECTORS, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, attrs="LegacyBIOSBootable", name=MACHINA-ESP
start=$ROOT_START, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name=machina-root
EOF
mkfs.vfat -F 16 -n MACHINA-ESP -i 4d414348 --offset=$ESP_START "$IMG" $((ESP_SECTORS / 2)) >"$WORK/mkfs.log" 2>&1
syslinux --install --offset $((ESP_START * 512)) "$IMG"
dd if="$MBR" of="$IMG" bs=440 count=1 conv=notrunc status=none
E="$IMG@@$((ESP_START * 512))"
mmd -i "$E" ::EFI ::EFI/BOOT ::EFI/debian
mcopy -i "$E" "$R/boot/vmlinuz-$KVER" ::vmlinuz
mcopy -i "$E" "$R/boot/initrd.img-$KVER" ::initrd.img
mcopy -i "$E" "$WORK/syslinux.cfg" ::syslinux.cfg
mcopy -i "$E" "$SHIM" ::EFI/BOOT/BOOTX64.EFI
mcopy -i "$E" "$GRUB_EFI" ::EFI/BOOT/grubx64.efi
mcopy -i "$E" "$WORK/grub.cfg" ::EFI/debian/grub.cfg
# The root filesystem fills its partition exactly: sfdisk aligns the last
# partition's end down to 1 MiB below the backup GPT, so its size is read
# back from the table rather than computed.
ROOT_SECTORS=$(sfdisk --dump "$IMG" | awk -F'size=' '/name="?machina-root/ {split($2, a, ","); gsub(/ /, "", a[1]); print a[1]}')
[ -n "$ROOT_SECTORS" ] || { echo "build.sh: no machina-root partition in the table" >&2; exit 1; }
ROOT_KIB=$((ROOT_SECTORS / 2))
mkfs.ext4 -q -F -L machina-root -U "$ROOT_UUID" -E offset=$((ROOT_START * 512)) -d "$R" "$IMG" "${ROOT_KIB}k"

SUM=$(sha256sum "$IMG" | cut -d' ' -f1)
printf '%s  os.img\n' "$SUM" >"$WORK/SHA256SUMS"
printf '%s\n' "$KVER" >"$WORK/kernel-version"
mv "$IMG" "$OUT/os.img"
mv "$WORK/kernel-version" "$OUT/kernel-version"
mv "$WORK/SHA256SUMS" "$OUT/SHA256SUMS" # last: its presence marks a complete build
echo "build.sh: $OUT/os.img sha256 $SUM kernel $KVER"
