package ipxe

import (
	"fmt"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/machina-metal/machina/boot"
)

// BenchmarkScript measures the handler's own cost per script request
// (lookup, token mint for the ramdisk lifecycles, render), without network.
func BenchmarkScript(b *testing.B) {
	for _, l := range []boot.Lifecycle{boot.LifecycleCommissioning, boot.LifecycleReady} {
		b.Run(string(l), func(b *testing.B) {
			var look boot.MemLookup
			for i := range 1000 {
				_ = look.Set(boot.Assignment{MAC: net.HardwareAddr{0x52, 0x54, 1, 0, byte(i >> 8), byte(i)}, Lifecycle: l})
			}
			h, err := New(Config{Lookup: &look, Tokens: boot.NewMemTokens(), ControllerURL: "http://10.99.0.1:8080",
				PerIP: Limit{Burst: 1 << 30, Every: time.Nanosecond}, PerMAC: Limit{Burst: 1 << 30, Every: time.Nanosecond}})
			if err != nil {
				b.Fatal(err)
			}
			i := 0
			for b.Loop() {
				req := httptest.NewRequest("GET", fmt.Sprintf("/boot/ipxe?mac=52-54-01-00-%02x-%02x&platform=pcbios", (i%1000)>>8, (i%1000)&0xff), nil)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != 200 {
					b.Fatalf("status %d", rec.Code)
				}
				i++
			}
		})
	}
}
