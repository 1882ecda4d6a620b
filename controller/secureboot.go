package controller

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/machina-metal/machina/attestation"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// Secure Boot servers. A server is one when its profile (pinned in
// servers.yaml, else the profile it is allocated to) sets
// firmware.secureBoot: true: the firmware step turns the BMC's
// SecureBootEnable on, the boot servers offer it only the signed chain
// (boot/secureboot.go: shim, GRUB, Debian's signed kernel), and its
// attestation is checked against the boot chain the controller computes
// from the very files it serves (secureBootChain). The inventory decides,
// not what the machine reports: a server that reports Secure Boot off
// (commissioning's facts, the BMC) while its profile asks for it must not
// be handed iPXE, and one whose profile does not ask for it keeps the iPXE
// path even if its firmware has Secure Boot on (it then fails to boot iPXE,
// visibly, until the profile says secureBoot: true).

// serverProfile returns the inventory profile that governs server: the
// one servers.yaml pins, else the one it is allocated to; nil when none.
func serverProfile(inv *inventory.Inventory, st *state.Store, server string) *inventory.Profile {
	if inv == nil {
		return nil
	}
	s := inv.Server(server)
	if s == nil {
		return nil
	}
	profile := s.Profile
	if profile == "" && st != nil {
		if srv, err := st.Server(server); err == nil && srv.Allocation != nil {
			profile = srv.Allocation.Profile
		}
	}
	return inv.Profile(profile)
}

// wantsSecureBoot reports whether server's profile sets firmware.secureBoot: true.
func wantsSecureBoot(inv *inventory.Inventory, st *state.Store, server string) bool {
	p := serverProfile(inv, st, server)
	return p != nil && p.Firmware != nil && p.Firmware.SecureBoot != nil && *p.Firmware.SecureBoot
}

// secureBootLookup marks the assignments of Secure Boot servers
// (boot.Assignment.SecureBoot) on top of the boot index's lookup.
type secureBootLookup struct {
	inner   boot.Lookup
	desired func() *inventory.Inventory
	st      *state.Store
}

// Lookup implements boot.Lookup.
func (l secureBootLookup) Lookup(ctx context.Context, mac net.HardwareAddr) (boot.Assignment, error) {
	a, err := l.inner.Lookup(ctx, mac)
	if err != nil || a.Name == "" {
		return a, err
	}
	a.SecureBoot = wantsSecureBoot(l.desired(), l.st, a.Name)
	return a, nil
}

// secureBootChain computes the boot chain of a Secure Boot server from the
// files the controller serves it, as the firmware, shim and GRUB measure
// them (recorded from Debian 12's signed shim 15.8 and grubnetx64 2.06
// under OVMF with Secure Boot and swtpm; attestation/testdata):
//
//   - PCR 4, EV_EFI_BOOT_SERVICES_APPLICATION: the Authenticode SHA-256 of
//     shim (the firmware starts it), of GRUB (shim loads it) and of the
//     kernel (shim measures what it verifies for GRUB's shim_lock call);
//   - PCR 9, EV_IPL: the file SHA-256 of the kernel and the initrd, which
//     GRUB's tpm module measures as it reads them.
//
// extra (the --attest-boot-apps and --attest-initrds digests) is added to
// the allowed sets. The files are hashed once, at start: a ramdisk rebuilt
// under a running controller is attested against the old one until the
// controller restarts (the ramdisk is served from the same folder, so a
// restart follows a rebuild in any case for the new manifest).
func secureBootChain(shimPath, grubPath, ramdiskDir string, extra attestation.BootChain) (attestation.BootChain, error) {
	chain := attestation.BootChain{
		Applications: append([][]byte(nil), extra.Applications...),
		Initrds:      append([][]byte(nil), extra.Initrds...),
		Kernels:      append([][]byte(nil), extra.Kernels...),
	}
	for _, p := range []string{shimPath, grubPath, filepath.Join(ramdiskDir, "vmlinuz")} {
		b, err := os.ReadFile(p)
		if err != nil {
			return attestation.BootChain{}, fmt.Errorf("secure boot chain: %w", err)
		}
		d, err := attestation.Authenticode(b)
		if err != nil {
			return attestation.BootChain{}, fmt.Errorf("secure boot chain: %s: %w", p, err)
		}
		chain.Applications = append(chain.Applications, d)
		if filepath.Base(p) == "vmlinuz" {
			sum := sha256.Sum256(b)
			chain.Kernels = append(chain.Kernels, sum[:])
		}
	}
	b, err := os.ReadFile(filepath.Join(ramdiskDir, "initrd.cpio.gz"))
	if err != nil {
		return attestation.BootChain{}, fmt.Errorf("secure boot chain: %w", err)
	}
	sum := sha256.Sum256(b)
	chain.Initrds = append(chain.Initrds, sum[:])
	return chain, nil
}
