package boot

import (
	"bytes"
	"debug/pe"
	"fmt"
	"os"
)

// UEFI Secure Boot network boot (x86-64). A server whose profile asks for
// Secure Boot (firmware.secureBoot: true, [Assignment.SecureBoot]) cannot
// run iPXE: Debian's iPXE binaries are not signed, and firmware with
// Secure Boot on refuses them (and qemu's unsigned iPXE option ROMs, so
// OVMF uses its own virtio-net driver and PXE). Such a server boots the
// chain every Debian netboot uses, each stage signed and verified by the
// one before:
//
//  1. the firmware's PXE gets [ShimImageX64] by DHCP + TFTP: Debian's
//     shimx64.efi.signed (package shim-signed), signed by the Microsoft
//     UEFI CA 2011 that firmware trusts in db;
//  2. shim loads [GRUBImageX64] ("\grubx64.efi", shim's default loader)
//     from the same TFTP server and directory: Debian's
//     grubnetx64.efi.signed (package grub-efi-amd64-signed), signed by the
//     Debian Secure Boot CA that shim carries;
//  3. GRUB's embedded prefix is "/grub" on the device it was loaded from,
//     (tftp,SERVER)/grub; its memdisk configuration sources
//     $prefix/x86_64-efi/grub.cfg if it exists, else $prefix/grub.cfg (both
//     read from the strings of grubnetx64.efi.signed 2.06-13+deb12u2: the
//     config module is "normal (memdisk)/grub.cfg", the prefix module
//     "/grub"). TFTP serves [GRUBPrefixConfig] ([SecureBootGRUBConfig]),
//     which sources the per-machine GRUB script from the same TFTP server
//     as [GRUBTFTPScriptDir]+MAC: this GRUB has no http module (it asks
//     the TFTP server for x86_64-efi/http.mod, and a locked-down GRUB
//     loads no module from outside its signed image anyway);
//  4. the script's `linux` and `initrd` fetch the ramdisk by TFTP
//     ([TFTPRamdiskKernel], [TFTPRamdiskInitrd]: the files the controller
//     read, and hashed for attestation, at start); GRUB
//     asks shim (shim_lock protocol) to verify the kernel, which must be
//     signed by a key shim trusts: Debian's linux-image-*-amd64 kernels
//     are (the ramdisk's vmlinuz; `sbverify --list` names "Debian Secure
//     Boot Signer 2022 - linux"). The initrd is not verified: it is
//     measured (GRUB's tpm module, PCR 9) and attested.
//
// The kernel then runs locked down (integrity mode: lockdown=integrity is
// what Debian turns on under Secure Boot): modules must be signed (the
// ramdisk's are Debian's own, signed at build), and /dev/mem, kexec of
// unsigned kernels, hibernation and raw I/O port access are refused;
// nothing the agent does needs those.
const (
	// ShimImageX64 is the TFTP name of the signed shim, the DHCP boot file
	// of a Secure Boot server's x64 UEFI PXE client (option 93 arch 7 or 9).
	ShimImageX64 = "shimx64.efi"
	// GRUBImageX64 is the TFTP name of the signed GRUB network image:
	// shim's DEFAULT_LOADER, fetched from the directory shim came from.
	GRUBImageX64 = "grubx64.efi"
	// GRUBPrefixConfig is the TFTP name Debian's signed grubnetx64 reads
	// its configuration from ($prefix/grub.cfg, prefix "/grub"; GRUB asks
	// for "/grub/grub.cfg", the TFTP server finds generated names with or
	// without the leading "/").
	GRUBPrefixConfig = "grub/grub.cfg"
	// DefaultShimPath and DefaultGRUBX64Path are where Debian 12 installs
	// the signed shim (shim-signed) and GRUB network image
	// (grub-efi-amd64-signed).
	// GRUBTFTPScriptDir prefixes the TFTP name of a machine's GRUB script
	// in the Secure Boot chain: GRUBTFTPScriptDir + the boot NIC's MAC in
	// GRUB's ${net_default_mac} form (lower-case colon form).
	GRUBTFTPScriptDir = "machina/grub/"
	// TFTPRamdiskKernel and TFTPRamdiskInitrd are the TFTP names of the
	// ramdisk's kernel and initrd for the Secure Boot chain's GRUB.
	TFTPRamdiskKernel  = "machina/ramdisk/vmlinuz"
	TFTPRamdiskInitrd  = "machina/ramdisk/initrd.cpio.gz"
	DefaultShimPath    = "/usr/lib/shim/shimx64.efi.signed"
	DefaultGRUBX64Path = "/usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed"
)

// SecureBootImages are the signed x64 UEFI images the TFTP server hands a
// Secure Boot server: shim and the GRUB network image it loads.
type SecureBootImages struct {
	Shim, GRUB []byte
}

// LoadSecureBootImages reads shim and GRUB from shimPath and grubPath and
// checks that each is an x86-64 PE32+ image that carries an Authenticode
// signature (a non-empty certificate table, PE/COFF spec "The Attribute
// Certificate Table"): an unsigned image would be refused by the firmware
// or by shim anyway, so serving one is a configuration error, reported
// here at start rather than as a machine that never boots.
func LoadSecureBootImages(shimPath, grubPath string) (SecureBootImages, error) {
	var out SecureBootImages
	for _, f := range []struct {
		path string
		dst  *[]byte
	}{{shimPath, &out.Shim}, {grubPath, &out.GRUB}} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			return SecureBootImages{}, fmt.Errorf("secure boot images: %w", err)
		}
		if err := CheckSignedX64(b); err != nil {
			return SecureBootImages{}, fmt.Errorf("secure boot images: %s: %w", f.path, err)
		}
		*f.dst = b
	}
	return out, nil
}

// CheckSignedX64 returns an error unless img is a PE32+ image for x86-64
// (machine 0x8664) with a non-empty certificate table (data directory 4).
// It does not verify the signature: the firmware and shim do.
func CheckSignedX64(img []byte) error {
	f, err := pe.NewFile(bytes.NewReader(img))
	if err != nil {
		return fmt.Errorf("not a PE image: %w", err)
	}
	defer f.Close()
	if f.Machine != pe.IMAGE_FILE_MACHINE_AMD64 {
		return fmt.Errorf("PE machine %#x, want x86-64 (0x8664)", f.Machine)
	}
	oh, ok := f.OptionalHeader.(*pe.OptionalHeader64)
	if !ok {
		return fmt.Errorf("not a PE32+ image")
	}
	if oh.NumberOfRvaAndSizes <= pe.IMAGE_DIRECTORY_ENTRY_SECURITY || oh.DataDirectory[pe.IMAGE_DIRECTORY_ENTRY_SECURITY].Size == 0 {
		return fmt.Errorf("no Authenticode signature (empty certificate table)")
	}
	return nil
}

// SecureBootGRUBConfig returns [GRUBPrefixConfig]: it sources the
// machine's script from the TFTP server GRUB was loaded from ($root is
// "tftp,SERVER" there), named by the boot NIC's MAC.
func SecureBootGRUBConfig() []byte {
	return []byte(`# Machina (Secure Boot chain): this machine's script, by TFTP.
echo "Machina: fetching ($root)/` + GRUBTFTPScriptDir + `${net_default_mac}"
source "($root)/` + GRUBTFTPScriptDir + `${net_default_mac}"
`)
}
