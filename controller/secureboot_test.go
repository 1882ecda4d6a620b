package controller

import (
	"bytes"
	"context"
	"crypto/sha256"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/attestation"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// TestSecureBootServersFromInventory: a server whose profile (pinned or
// allocated) sets firmware.secureBoot: true is marked SecureBoot on the
// boot lookup's answer and attests against the chain computed from the
// served shim, GRUB, kernel and initrd (with the operator's extra
// digests); other servers keep the operator's chain and the iPXE path.
func TestSecureBootServersFromInventory(t *testing.T) {
	peertest.File(t, boot.DefaultShimPath, "shim-signed")
	peertest.File(t, boot.DefaultGRUBX64Path, "grub-efi-amd64-signed")
	st, err := state.Open(filepath.Join(t.TempDir(), "s.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	on, off := true, false
	inv := &inventory.Inventory{
		Servers: []inventory.Server{{Name: "sb", Profile: "trusted"}, {Name: "alloc"}, {Name: "plain", Profile: "plainfw"}},
		Profiles: []inventory.Profile{
			{Name: "trusted", Attestation: api.AttestRequired, Firmware: &inventory.Firmware{SecureBoot: &on}},
			{Name: "plainfw", Firmware: &inventory.Firmware{SecureBoot: &off}},
		},
	}
	if _, err := st.CreateServer(state.Server{Name: "alloc", Allocation: &state.Allocation{Profile: "trusted"}}); err != nil {
		t.Fatal(err)
	}
	// The ramdisk folder: any signed PE serves as the kernel here (the
	// chain is what the controller computes from what it serves).
	ramdisk := t.TempDir()
	kernel, _ := os.ReadFile(boot.DefaultShimPath)
	initrd := []byte("initrd bytes")
	_ = os.WriteFile(filepath.Join(ramdisk, "vmlinuz"), kernel, 0o644)
	_ = os.WriteFile(filepath.Join(ramdisk, "initrd.cpio.gz"), initrd, 0o644)
	_, extra, err := newVerifier(Config{AttestBootApplications: []string{strings.Repeat("01", 32)}})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := secureBootChain(boot.DefaultShimPath, boot.DefaultGRUBX64Path, ramdisk, extra)
	if err != nil {
		t.Fatal(err)
	}
	grub, _ := os.ReadFile(boot.DefaultGRUBX64Path)
	acShim, _ := attestation.Authenticode(kernel)
	acGRUB, _ := attestation.Authenticode(grub)
	kSum, iSum := sha256.Sum256(kernel), sha256.Sum256(initrd)
	if len(sb.Applications) != 4 || !bytes.Equal(sb.Applications[0], extra.Applications[0]) || !bytes.Equal(sb.Applications[1], acShim) ||
		!bytes.Equal(sb.Applications[2], acGRUB) || !bytes.Equal(sb.Applications[3], acShim) {
		t.Errorf("applications %x", sb.Applications)
	}
	if len(sb.Kernels) != 1 || !bytes.Equal(sb.Kernels[0], kSum[:]) || len(sb.Initrds) != 1 || !bytes.Equal(sb.Initrds[0], iSum[:]) {
		t.Errorf("kernels %x initrds %x", sb.Kernels, sb.Initrds)
	}
	if _, err := secureBootChain(boot.DefaultShimPath, boot.DefaultGRUBX64Path, t.TempDir(), extra); err == nil {
		t.Error("a ramdisk folder without vmlinuz was taken")
	}

	desired := func() *inventory.Inventory { return inv }
	p := attestPolicy{desired: desired, st: st, chain: extra, secureBoot: &sb}
	for name, wantSB := range map[string]bool{"sb": true, "alloc": true, "plain": false} {
		r := p.AttestRule(name)
		if gotSB := len(r.Chain.Kernels) == 1; gotSB != wantSB {
			t.Errorf("%s: chain %+v, secure boot chain wanted: %v", name, r.Chain, wantSB)
		}
	}

	var mem boot.MemLookup
	macs := map[string]net.HardwareAddr{"sb": {0x52, 0x54, 0, 0, 0x5c, 1}, "alloc": {0x52, 0x54, 0, 0, 0x5c, 2}, "plain": {0x52, 0x54, 0, 0, 0x5c, 3}}
	for name, mac := range macs {
		_ = mem.Set(boot.Assignment{MAC: mac, Name: name, Lifecycle: boot.LifecycleCommissioning})
	}
	l := secureBootLookup{inner: &mem, desired: desired, st: st}
	for name, want := range map[string]bool{"sb": true, "alloc": true, "plain": false} {
		a, err := l.Lookup(context.Background(), macs[name])
		if err != nil || a.SecureBoot != want {
			t.Errorf("%s: lookup %+v, %v; want SecureBoot %v", name, a, err, want)
		}
	}
}
