package api

import (
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestServerViewCarriesBootFetch: the admin API's server view carries the
// last kernel or initrd fetch the boot servers noted (file, protocol,
// Secure Boot, time), and none before one.
func TestServerViewCarriesBootFetch(t *testing.T) {
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	got := toServer(state.Server{Name: "x1", BootFetch: &state.BootFetch{File: "machina/ramdisk/vmlinuz", Via: "tftp", SecureBoot: true, At: at}}).BootFetch
	if got == nil || got.File != "machina/ramdisk/vmlinuz" || got.Via != "tftp" || !got.SecureBoot || !got.At.Equal(at) {
		t.Fatalf("toServer boot fetch = %+v", got)
	}
	if got := toServer(state.Server{Name: "x1"}).BootFetch; got != nil {
		t.Fatalf("toServer boot fetch = %+v, want nil", got)
	}
}
