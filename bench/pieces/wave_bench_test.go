// Package pieces benchmarks deploy waves that share image pieces: N agents
// (the real ramdisk/agent piece code) fetch one image from a controller
// behind a tc-shaped link, with and without sharing.
package pieces

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/lab/vm/netns"
	"github.com/machina-metal/machina/ramdisk/agent"
	vnetns "github.com/vishvananda/netns"
)

// Shape of the benchmark: a 16 MiB image (four pieces) and a controller
// uplink shaped to 400 Mbit/s with tc's token bucket filter, as a
// controller on one 1 Gbit/s port shared with everything else.
const (
	imageBytes = 16 << 20
	uplink     = "400mbit"
)

// inNS runs f on a thread switched into network namespace name, so the
// sockets f opens belong to it.
func inNS(name string, f func() error) error {
	runtime.LockOSThread()
	orig, err := vnetns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	h, err := vnetns.GetFromName(name)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer h.Close()
	if err := vnetns.Set(h); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := f()
	if err := vnetns.Set(orig); err == nil {
		runtime.UnlockOSThread() // else the thread dies with the goroutine
	}
	return ferr
}

func run(b *testing.B, args ...string) {
	b.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		b.Fatalf("%v: %v: %s", args, err, out)
	}
}

// lab is the controller's namespace (10.233.0.1, tc-shaped egress) and
// the machines' namespace (10.233.0.2, their piece listeners on its
// loopback), joined by a veth pair.
type lab struct {
	srv, cli *netns.Namespace
	url      string
	sent     atomic.Int64
	image    []byte
	man      v1.PieceManifest
}

func newLab(b *testing.B) *lab {
	ctx := context.Background()
	l := &lab{}
	var err error
	if l.srv, err = netns.Create(ctx, netns.Config{Prefix: "pcs-s"}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.srv.Close() })
	if l.cli, err = netns.Create(ctx, netns.Config{Prefix: "pcs-c"}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.cli.Close() })
	run(b, "ip", "-n", l.srv.Name, "link", "add", "vs0", "type", "veth", "peer", "name", "vc0", "netns", l.cli.Name)
	run(b, "ip", "-n", l.srv.Name, "addr", "add", "10.233.0.1/24", "dev", "vs0")
	run(b, "ip", "-n", l.srv.Name, "link", "set", "vs0", "up")
	run(b, "ip", "-n", l.cli.Name, "addr", "add", "10.233.0.2/24", "dev", "vc0")
	run(b, "ip", "-n", l.cli.Name, "link", "set", "vc0", "up")
	run(b, "ip", "netns", "exec", l.srv.Name, "tc", "qdisc", "add", "dev", "vs0", "root", "tbf", "rate", uplink, "burst", "256kb", "latency", "100ms")

	l.image = make([]byte, imageBytes)
	rand.Read(l.image)
	l.man = v1.PieceManifest{PieceBytes: v1.PieceBytes, SizeBytes: imageBytes, SHA256: sum(l.image)}
	for off := 0; off < imageBytes; off += v1.PieceBytes {
		l.man.Pieces = append(l.man.Pieces, sum(l.image[off:off+v1.PieceBytes]))
	}
	var ln net.Listener
	if err := inNS(l.srv.Name, func() (err error) { ln, err = net.Listen("tcp", "10.233.0.1:0"); return }); err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer img" {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		http.ServeContent(&counting{ResponseWriter: w, n: &l.sent}, r, "", time.Time{}, bytes.NewReader(l.image))
	})}
	go func() { _ = hs.Serve(ln) }()
	b.Cleanup(func() { _ = hs.Close() })
	l.url = "http://" + ln.Addr().String() + "/images/bench"
	return l
}

type counting struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c *counting) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// wave runs n agents at once; with share, each names the (at most four)
// agents before it as peers, as the controller's waves do. It returns the
// time until every agent holds the image (whole digest checked) and the
// bytes the controller sent.
func (l *lab) wave(b *testing.B, n int, share bool) (time.Duration, int64) {
	l.sent.Store(0)
	tr := &http.Transport{MaxIdleConnsPerHost: 8, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNS(l.cli.Name, func() (err error) {
			c, err = (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
			return
		})
		return c, err
	}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Minute}
	fetchers := make([]*agent.PieceFetcher, n)
	var urls []string
	for i := range n {
		set, err := agent.NewPieceSet(l.man)
		if err != nil {
			b.Fatal(err)
		}
		ps := &agent.PeerServer{Hold: time.Minute}
		ps.Offer(set, "wave")
		var ln net.Listener
		if err := inNS(l.cli.Name, func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return }); err != nil {
			b.Fatal(err)
		}
		hs := &http.Server{Handler: ps}
		go func() { _ = hs.Serve(ln) }()
		defer hs.Close()
		f := &agent.PieceFetcher{Set: set, ImageURL: l.url, ImageToken: "img", WaveToken: "wave", HTTP: client}
		if share {
			for j := len(urls) - 1; j >= 0 && len(f.Peers) < v1.MaxWavePeers; j-- {
				f.Peers = append(f.Peers, urls[j])
			}
		}
		urls = append(urls, "http://"+ln.Addr().String())
		fetchers[i] = f
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, f := range fetchers {
		wg.Go(func() {
			rc, _ := f.Open(context.Background())
			h := sha256.New()
			if _, err := io.Copy(h, rc); err != nil {
				errs <- err
				return
			}
			if got := hex.EncodeToString(h.Sum(nil)); got != l.man.SHA256 {
				errs <- fmt.Errorf("digest %s, want %s", got, l.man.SHA256)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return time.Since(start), l.sent.Load()
}

// BenchmarkWave: `go test -run '^$' -bench Wave -benchtime 1x ./bench/pieces/`
// as root (network namespaces, tc). Reports the wave's wall time and the
// controller's bytes in images for N = 1, 10, 100 machines, sharing off
// and on.
func BenchmarkWave(b *testing.B) {
	l := newLab(b)
	for _, n := range []int{1, 10, 100} {
		for _, share := range []bool{false, true} {
			b.Run(fmt.Sprintf("N=%d/share=%v", n, share), func(b *testing.B) {
				var d time.Duration
				var sent int64
				for range b.N {
					d, sent = l.wave(b, n, share)
				}
				b.ReportMetric(d.Seconds(), "s/wave")
				b.ReportMetric(float64(sent)/imageBytes, "images-from-controller")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
