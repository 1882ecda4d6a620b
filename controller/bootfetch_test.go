package controller

import (
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/state"
)

// TestBootFetchesAttributeByScriptAddress: a kernel or initrd fetch (TFTP
// or HTTP) from the address a server's ramdisk script went to is noted on
// that server, with the Secure Boot mark of its assignment; other files,
// addresses that fetched no script, and fetches past bootPeerTTL are not.
func TestBootFetchesAttributeByScriptAddress(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "s.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, n := range []string{"a", "b"} {
		if _, err := st.CreateServer(state.Server{Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	b := newBootFetches(st)
	b.now = func() time.Time { return now }
	pa, pb := netip.MustParseAddr("10.99.0.50"), netip.MustParseAddr("10.99.0.51")
	b.script(boot.Assignment{Name: "a", SecureBoot: true}, pa)
	b.script(boot.Assignment{Name: "b"}, pb)
	b.tftpServed(boot.GRUBImageX64, pa)                                    // not a ramdisk file
	b.tftpServed(boot.TFTPRamdiskKernel, netip.MustParseAddr("10.99.0.9")) // no script from there
	b.tftpServed(boot.TFTPRamdiskKernel, pa)
	b.httpServed("initrd.cpio.gz", pb)
	if err := st.FlushHeard(); err != nil {
		t.Fatal(err)
	}
	a, _ := st.Server("a")
	if f := a.BootFetch; f == nil || f.File != boot.TFTPRamdiskKernel || f.Via != "tftp" || !f.SecureBoot || a.LastHeard != "boot file fetched: machina/ramdisk/vmlinuz by tftp" {
		t.Fatalf("a: last heard %q, boot fetch %+v", a.LastHeard, a.BootFetch)
	}
	sb, _ := st.Server("b")
	if f := sb.BootFetch; f == nil || f.File != "/boot/ramdisk/initrd.cpio.gz" || f.Via != "http" || f.SecureBoot {
		t.Fatalf("b: last heard %q, boot fetch %+v", sb.LastHeard, sb.BootFetch)
	}
	now = now.Add(bootPeerTTL + time.Second)
	b.httpServed("vmlinuz", pb)
	if err := st.FlushHeard(); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.Server("b"); got.BootFetch.File != "/boot/ramdisk/initrd.cpio.gz" {
		t.Fatalf("a fetch past the TTL was noted: %+v", got.BootFetch)
	}
}
