package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

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
// ns/op between cases is the server's cost per script request (issue 24);
// the CPU profile of one case (-cpuprofile) shows where it goes.
func BenchmarkScriptTCP(b *testing.B) {
	const n = 1000
	for _, tc := range []struct {
		name           string
		static, direct bool
		prepare        bool
	}{
		{name: "static", static: true},
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
				serveFn = func(ctx context.Context, ln net.Listener) error {
					hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						w.Header().Set("Content-Type", "text/plain")
						_, _ = w.Write(body)
					})}
					go func() { <-ctx.Done(); _ = hs.Close() }()
					_ = hs.Serve(ln)
					return nil
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
