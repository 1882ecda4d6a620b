package api_test

import (
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/boot/ipxe"
	"github.com/machina-metal/machina/state"
)

// BenchmarkBootScriptStore measures the iPXE script handler over the
// store, as controller.Run wires it (api.BootIndex as Lookup and Tokens):
// each request for one of 1,000 commissioning servers reads the server
// and mints a report token into a state file on disk, with an fsync per
// commit as in production (sync) or without (nosync), from 64 concurrent
// callers so that mints share group commits. The CPU profile of this
// benchmark is the handler's side of bench/bootstorm.sh's script step,
// without the network.
func BenchmarkBootScriptStore(b *testing.B) {
	for _, mode := range []string{"sync", "nosync"} {
		b.Run(mode, func(b *testing.B) {
			st, err := state.Open(filepath.Join(b.TempDir(), "state.db"), state.Options{NoSync: mode == "nosync"})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			for i := range 1000 {
				if _, err := st.CreateServer(state.Server{Name: fmt.Sprintf("r1-n%04d", i), Lifecycle: state.LifecycleCommissioning,
					BootMAC: fmt.Sprintf("52:54:01:00:%02x:%02x", i>>8, i&0xff)}); err != nil {
					b.Fatal(err)
				}
			}
			idx, err := api.NewBootIndex(st)
			if err != nil {
				b.Fatal(err)
			}
			h, err := ipxe.New(ipxe.Config{Lookup: idx, Tokens: idx, ControllerURL: "http://10.99.0.1:8080",
				PerIP: ipxe.Limit{Burst: 1 << 30, Every: time.Nanosecond}, PerMAC: ipxe.Limit{Burst: 1 << 30, Every: time.Nanosecond}})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			var next atomic.Int64
			b.ResetTimer()
			b.SetParallelism(32)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := next.Add(1) % 1000
					req := httptest.NewRequest("GET", fmt.Sprintf("/boot/ipxe?mac=52-54-01-00-%02x-%02x&platform=pcbios", i>>8, i&0xff), nil)
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					if rec.Code != 200 {
						b.Fatalf("status %d: %s", rec.Code, rec.Body)
					}
				}
			})
		})
	}
}
