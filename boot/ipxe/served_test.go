package ipxe

import (
	"context"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/machina-metal/machina/boot"
)

// TestOnScriptAndOnServed: OnScript hears of each ramdisk script served
// to a known server (HTTP iPXE and TFTP GRUB), with its assignment and the
// client's address, and of none that boots the local disk or is for an
// unknown MAC; OnServed hears of each /boot/ramdisk/ GET answered in full
// (a range, a HEAD and a missing file are not).
func TestOnScriptAndOnServed(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "vmlinuz"), []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	var look boot.MemLookup
	for _, a := range []boot.Assignment{
		{MAC: mustMAC(t, "52:54:00:00:7a:01"), Name: "r1-n01", Lifecycle: boot.LifecycleCommissioning, SecureBoot: true},
		{MAC: mustMAC(t, "52:54:00:00:7a:02"), Name: "r1-n02", Lifecycle: boot.LifecycleDeployed},
		{MAC: mustMAC(t, "52:54:00:00:7a:03"), Name: "r1-n03", Lifecycle: boot.LifecycleCommissioning},
	} {
		if err := look.Set(a); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var heard []string
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, s)
	}
	cfg := Config{Lookup: &look, Tokens: &seqTokens{}, RamdiskDir: dir,
		OnScript: func(a boot.Assignment, peer netip.Addr) {
			note("script " + a.Name + " " + peer.String() + map[bool]string{true: " secure", false: ""}[a.SecureBoot])
		},
		OnServed: func(path string, peer netip.Addr) { note("served " + path + " " + peer.String()) }}
	h, srv := newTestHandler(t, cfg)
	defer h.Close()
	for _, mac := range []string{"52:54:00:00:7a:03", "52:54:00:00:7a:02", "52:54:00:00:7a:09"} {
		if code, body := get(t, srv.URL+"/boot/ipxe?mac="+mac+"&platform=efi"); code != 200 {
			t.Fatalf("script of %s: %d %q", mac, code, body)
		}
	}
	if _, err := h.TFTPScript(context.Background(), "52:54:00:00:7a:01", netip.MustParseAddr("10.99.0.50")); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, srv.URL+"/boot/ramdisk/vmlinuz"); code != 200 || body != "0123456789" {
		t.Fatalf("vmlinuz: %d %q", code, body)
	}
	if code, _ := get(t, srv.URL+"/boot/ramdisk/initrd.cpio.gz"); code != 404 {
		t.Fatalf("missing initrd: %d", code)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/boot/ramdisk/vmlinuz", nil)
	req.Header.Set("Range", "bytes=0-3")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent {
		t.Fatalf("range: %d", resp.StatusCode)
	}
	if resp, err = http.Head(srv.URL + "/boot/ramdisk/vmlinuz"); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := []string{"script r1-n03 127.0.0.1", "script r1-n01 10.99.0.50 secure", "served vmlinuz 127.0.0.1"}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(heard, want) {
		t.Fatalf("heard %q, want %q", heard, want)
	}
}
