package images

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestEgressRateSharedByAllDownloads: with EgressBytesPerSecond at 1 MiB/s,
// two machines downloading a 2 MiB image at once take about 4 s of (fake)
// time together, not 2 s each in parallel: one token bucket paces the
// handler's whole egress. Unlimited, they take no time. Both get the whole
// image either way.
func TestEgressRateSharedByAllDownloads(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, 2*mib)
	srv.put("/x.raw", raw)
	e := newTestEnv(t, nil)
	if _, err := e.im.Import(t.Context(), Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rate     int64
		min, max time.Duration
	}{
		{rate: 1 << 20, min: 3700 * time.Millisecond, max: 4 * time.Second}, // 4 MiB less the 256 KiB burst
		{rate: 0, min: 0, max: 0},
	} {
		synctest.Test(t, func(t *testing.T) {
			tokens := &memTokens{}
			tokens.add("tok", "x", time.Hour)
			h, err := NewHandler(HandlerConfig{Store: e.store, Tokens: tokens, EgressBytesPerSecond: tc.rate})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			var wg sync.WaitGroup
			for range 2 {
				wg.Go(func() {
					req := httptest.NewRequest(http.MethodGet, "/images/x", nil)
					req.Header.Set("Authorization", "Bearer tok")
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), raw) {
						t.Errorf("rate %d: GET = %d with %d bytes, want the image", tc.rate, rec.Code, rec.Body.Len())
					}
				})
			}
			wg.Wait()
			if d := time.Since(start); d < tc.min || d > tc.max {
				t.Errorf("rate %d B/s: two 2 MiB downloads took %v, want %v to %v", tc.rate, d, tc.min, tc.max)
			}
		})
	}
}
