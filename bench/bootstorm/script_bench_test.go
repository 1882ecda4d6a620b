package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/dhcp"
	"github.com/machina-metal/machina/boot/ipxe"
)

// BenchmarkScriptTCP is the storm's script step without the namespaces:
// rounds of 1,000 concurrent script GETs over loopback TCP (each from its
// own 127.0.x.y source address, Connection: close, as iPXE), one per
// commissioning server of a state store on disk, against
//   - static: a bare http.Server writing a fixed chain script (the storm's
//     peer),
//   - direct: the iPXE handler on a bare http.Server (no api middleware),
//   - api: the handler behind the api server (per-address connection cap,
//     metrics, request log), as controller.Run serves it,
//
// with the tokens prepared before each round (the executor's netboot) or,
// for api-inline, minted by each request (after a controller restart).
// The client side is the same code for every case, so the difference of
// ns/op between cases is the server's cost per script request;
// the CPU profile of one case (-cpuprofile) shows where it goes.
func BenchmarkScriptTCP(b *testing.B) {
	const n = 1000
	for _, tc := range []struct {
		name           string
		static, direct bool
		prepare        bool
		apiStatic      bool // the static handler behind the api server: its HTTP side's own cost
	}{
		{name: "static", static: true},
		{name: "api-static", static: true, apiStatic: true},
		{name: "direct", direct: true, prepare: true},
		{name: "api", prepare: true},
		{name: "api-inline"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			addr := ln.Addr().String()
			log := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
			var serveFn func(context.Context, net.Listener) error
			var reprepare func() error
			if tc.static {
				body, err := boot.ChainScript("http://" + addr + ipxe.ScriptPath)
				if err != nil {
					b.Fatal(err)
				}
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/plain")
					_, _ = w.Write(body)
				})
				serveFn = func(ctx context.Context, ln net.Listener) error {
					hs := &http.Server{Handler: h}
					go func() { <-ctx.Done(); _ = hs.Close() }()
					_ = hs.Serve(ln)
					return nil
				}
				if tc.apiStatic {
					st, dir, err := stormStore(1)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { _ = st.Close(); _ = os.RemoveAll(dir) })
					if serveFn, err = httpSide(h, st, false, false, log); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				big := ipxe.Limit{Burst: 1 << 30, Every: time.Nanosecond} // rounds repeat the MACs
				cfg := ipxe.Config{ControllerURL: "http://" + addr, Logger: log, PerIP: big, PerMAC: big}
				side, err := newStormSide(ctx, n, cfg, false, tc.prepare)
				if err != nil {
					b.Fatal(err)
				}
				lc := &leaseCheck{leases: &dhcp.MemLeases{}}
				lc.next.Store(side)
				var sides []*stormSide
				b.Cleanup(func() {
					lc.next.Load().close()
					for _, s := range sides {
						s.close()
					}
				})
				if serveFn, err = httpSide(lc, side.st, false, tc.direct, log); err != nil {
					b.Fatal(err)
				}
				// Each round is a new fleet netbooted (a new store whose
				// tokens are prepared, or not), as the storm's second run.
				reprepare = func() error {
					next, err := newStormSide(ctx, n, cfg, false, tc.prepare)
					if err != nil {
						return err
					}
					sides = append(sides, lc.next.Swap(next))
					return nil
				}
			}
			done := make(chan struct{})
			go func() { defer close(done); _ = serveFn(ctx, ln) }()
			defer func() { cancel(); <-done }()
			round := func() {
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						if err := scriptGET(addr, i); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
			}
			runtime.GC()
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; done += n {
				if reprepare != nil && done > 0 {
					b.StopTimer()
					if err := reprepare(); err != nil {
						b.Fatal(err)
					}
					runtime.GC() // the set-up's garbage, not the round's
					b.StartTimer()
				}
				round()
			}
		})
	}
}

// scriptGET fetches storm server i's script from 127.0.x.y (i-th).
func scriptGET(addr string, i int) error {
	src := netip.AddrFrom4([4]byte{127, 0, byte(1 + i>>8), byte(i)})
	_, err := getScript(context.Background(), addr, ipxe.ScriptPath, stormMAC(i), src)
	return err
}

// BenchmarkScriptHandler is the server's user-space cost per script
// request without TCP: the request (as iPXE sends it, with a source
// address) goes straight into the handler, and the answer into a
// ResponseWriter that keeps only its header and length, for
//   - static: the storm's peer, a handler writing a fixed chain script;
//   - api: the iPXE handler behind the api server's handler (routing,
//     metrics, request log) and the storm's lease counter, over a store on
//     disk with every token prepared, as the storm's Machina side (a new
//     fleet, prepared with the timer stopped, for every 1,000 requests:
//     a prepared token is handed out once).
//
// One request per commissioning server of a 1,000-server fleet, in turn.
// The difference of ns/op is what Machina's script endpoint adds per
// request to a boot storm's CPU, the part of it that net/http
// and TCP do not decide; -cpuprofile shows where. The LastHeard notes the
// requests leave are written behind (state.HeardDelay) and count where
// they land.
func BenchmarkScriptHandler(b *testing.B) {
	const n = 1000
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
	reqs := make([]*http.Request, n)
	for i := range reqs {
		r, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s?mac=%s&platform=pcbios&arch=i386", ipxe.ScriptPath, hyphen(stormMAC(i))), nil)
		if err != nil {
			b.Fatal(err)
		}
		r.RemoteAddr = netip.AddrPortFrom(clientAddr(netip.MustParseAddr("10.66.1.0"), i), 40000).String()
		r.Header.Set("User-Agent", "iPXE/1.21.1")
		reqs[i] = r
	}
	for _, name := range []string{"static", "api"} {
		b.Run(name, func(b *testing.B) {
			var h http.Handler
			var renew func()
			if name == "static" {
				body, err := boot.ChainScript("http://10.66.0.1:8080" + ipxe.ScriptPath)
				if err != nil {
					b.Fatal(err)
				}
				h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/plain")
					_, _ = w.Write(body)
				})
			} else {
				cfg := ipxe.Config{ControllerURL: "http://10.66.0.1:8080", Logger: log}
				side, err := newStormSide(ctx, n, cfg, false, true)
				if err != nil {
					b.Fatal(err)
				}
				lc := &leaseCheck{leases: &dhcp.MemLeases{}}
				lc.next.Store(side)
				b.Cleanup(func() { lc.next.Load().close() })
				srv, err := api.New(api.Config{Store: side.st, Logger: log})
				if err != nil {
					b.Fatal(err)
				}
				if err := srv.HandlePublic(ipxe.ScriptPath, lc); err != nil {
					b.Fatal(err)
				}
				h = srv.Handler()
				renew = func() {
					b.StopTimer()
					next, err := newStormSide(ctx, n, cfg, false, true)
					if err != nil {
						b.Fatal(err)
					}
					lc.next.Swap(next).close()
					runtime.GC()
					b.StartTimer()
				}
			}
			w := &countingWriter{h: http.Header{}}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i%n == 0 && i > 0 && renew != nil {
					renew()
				}
				clear(w.h)
				w.code, w.n = 0, 0
				h.ServeHTTP(w, reqs[i%n])
				if w.code != http.StatusOK && w.code != 0 || w.n == 0 {
					b.Fatalf("request %d: status %d, %d bytes", i, w.code, w.n)
				}
			}
		})
	}
}

// countingWriter is a ResponseWriter that keeps the header map, the
// status and the body's length.
type countingWriter struct {
	h    http.Header
	code int
	n    int
}

func (w *countingWriter) Header() http.Header         { return w.h }
func (w *countingWriter) WriteHeader(code int)        { w.code = code }
func (w *countingWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
