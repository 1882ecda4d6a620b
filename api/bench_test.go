package api_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/machina-metal/machina/state"
)

// BenchmarkListServers10k measures GET /api/v1/servers over loopback HTTP
// with 10,000 servers stored: the full list in one page (limit=10000), a
// default page, and a zone+lifecycle filter that scans every record.
func BenchmarkListServers10k(b *testing.B) {
	f := newFixture(b, state.Options{NoSync: true})
	for i := range 10_000 {
		srv := state.Server{Name: fmt.Sprintf("r%02d-n%04d", i/100, i), Zone: fmt.Sprintf("zone-%c", 'a'+i%4),
			BootMAC: fmt.Sprintf("52:54:00:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff),
			BMC:     state.BMCFacts{Driver: "redfish", Address: fmt.Sprintf("https://10.10.%d.%d", i/250, i%250+1), Credentials: "bmc-default"}}
		if _, err := f.store.CreateServer(srv); err != nil {
			b.Fatal(err)
		}
	}
	for _, q := range []string{"?limit=10000", "", "?zone=zone-c&lifecycle=new&limit=10000"} {
		b.Run("query="+q, func(b *testing.B) {
			var n int64
			for b.Loop() {
				req, _ := http.NewRequest("GET", f.srv.URL+"/api/v1/servers"+q, nil)
				req.Header.Set("Authorization", "Bearer "+f.token)
				resp, err := f.srv.Client().Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			b.ReportMetric(float64(n), "bytes/response")
		})
	}
	// The handler alone, without the loopback transfer of ~3.9 MB.
	b.Run("handler-only/limit=10000", func(b *testing.B) {
		h := f.api.Handler()
		for b.Loop() {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/api/v1/servers?limit=10000", nil)
			req.Header.Set("Authorization", "Bearer "+f.token)
			h.ServeHTTP(rec, req)
			if rec.Code != 200 {
				b.Fatalf("status %d", rec.Code)
			}
		}
	})
}
