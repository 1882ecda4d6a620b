// Package pieces benchmarks deploy waves that share image pieces: N agents
// (the real ramdisk/agent piece code), each in its own network namespace,
// fetch one image from a controller in another, every link shaped to the
// same rate with tc, with and without sharing; each agent verifies every
// piece and the whole image, writes it to its own target file and reads
// it back.
package pieces

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/lab/vm/netns"
	"github.com/machina-metal/machina/ramdisk/agent"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The benchmark's shape, set after -args:
//
//	go test -run '^$' -bench Wave -benchtime 1x -timeout 60m ./bench/pieces/ \
//	    -args -wave.image-mib 1024 -wave.n 1,10,100 -wave.rate 1gbit -wave.baseline-max 10
var (
	imageMiB = flag.Int("wave.image-mib", 64, "image size in MiB (a multiple of 4)")
	// dataEvery: one piece in dataEvery holds random data, the rest are
	// zeros (see sparseImage).
	dataEvery   = flag.Int("wave.data-every", 16, "one piece in this many holds random data, the others zeros")
	waveSizes   = flag.String("wave.n", "1,10,100", "wave sizes (machines), comma-separated")
	linkRate    = flag.String("wave.rate", "1gbit", "rate of every link, each direction (tc tbf rate)")
	baselineMax = flag.Int("wave.baseline-max", 100, "largest wave also run without sharing (the controller sends every image)")
	workDir     = flag.String("wave.dir", "", "folder for the agents' target files (created if missing; default: a temporary folder)")
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

// batch runs tool (ip or tc) in namespace ns on the commands in lines,
// one exec for all of them.
func batch(b *testing.B, tool, ns string, lines []string) {
	b.Helper()
	cmd := exec.Command(tool, "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("%s -n %s -batch: %v: %s", tool, ns, err, out)
	}
}

// shape is the tc token bucket on one direction of a link.
func shape(dev string) string {
	return "qdisc add dev " + dev + " root tbf rate " + *linkRate + " burst 256kb latency 100ms"
}

// node is a namespace on the lab's switch: its address and, for an
// agent, its HTTP client (dialing from inside it).
type node struct {
	ns   *netns.Namespace
	addr string
	http *http.Client
}

// lab is a switch namespace with a bridge, the controller's namespace
// (10.233.0.1) and one namespace per agent (10.233.1.x), each joined to
// the bridge by a veth pair shaped to linkRate in both directions: the
// controller's uplink is no faster than any machine's port.
type lab struct {
	sw, ctrl *netns.Namespace
	agents   []*node
	url      string
	sent     atomic.Int64
	image    []byte
	man      v1.PieceManifest
	dir      string
}

func newLab(b *testing.B, agents int) *lab {
	ctx := context.Background()
	l := &lab{dir: *workDir}
	if l.dir == "" {
		l.dir = b.TempDir()
	} else if err := os.MkdirAll(l.dir, 0o700); err != nil {
		b.Fatalf("-wave.dir: %v", err)
	}
	mk := func(prefix string) *netns.Namespace {
		n, err := netns.Create(ctx, netns.Config{Prefix: prefix})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = n.Close() })
		return n
	}
	l.sw, l.ctrl = mk("pcs-sw"), mk("pcs-c")
	var swIP, swTC []string
	join := func(n *netns.Namespace, port, addr string) {
		swIP = append(swIP, "link add "+port+" type veth peer name e0 netns "+n.Name,
			"link set "+port+" master "+l.sw.Bridge, "link set "+port+" up")
		swTC = append(swTC, shape(port))
		batch(b, "ip", l.sw.Name, swIP)
		swIP = swIP[:0]
		batch(b, "ip", n.Name, []string{"addr add " + addr + "/16 dev e0", "link set e0 up"})
		batch(b, "tc", n.Name, []string{shape("e0")})
	}
	join(l.ctrl, "pc", "10.233.0.1")
	for i := range agents {
		n := mk("pcs-a")
		addr := fmt.Sprintf("10.233.%d.%d", 1+i/250, 1+i%250)
		join(n, "pa"+strconv.Itoa(i), addr)
		tr := &http.Transport{MaxIdleConnsPerHost: 8, DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			var c net.Conn
			err := inNS(n.Name, func() (err error) {
				c, err = (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, a)
				return
			})
			return c, err
		}}
		b.Cleanup(tr.CloseIdleConnections)
		l.agents = append(l.agents, &node{ns: n, addr: addr, http: &http.Client{Transport: tr, Timeout: 30 * time.Minute}})
	}
	batch(b, "tc", l.sw.Name, swTC)

	l.image, l.man = sparseImage(int64(*imageMiB) << 20)
	var ln net.Listener
	if err := inNS(l.ctrl.Name, func() (err error) { ln, err = net.Listen("tcp", "10.233.0.1:0"); return }); err != nil {
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

// sparseImage is an image of size bytes in which piece i holds random
// data when i%dataEvery == 0 and zeros otherwise, as a raw OS image's
// free space is zeros. Every byte, zero or not, crosses the links and
// is hashed; the zeros only spare the bench host's memory (the agent's
// piece set holds all-zero pieces as one shared buffer) and disk (the
// targets skip all-zero writes; see target).
func sparseImage(size int64) ([]byte, v1.PieceManifest) {
	img := make([]byte, size)
	for off, i := int64(0), 0; off < size; off, i = off+v1.PieceBytes, i+1 {
		if i%*dataEvery == 0 {
			rand.Read(img[off:min(off+v1.PieceBytes, size)])
		}
	}
	m := v1.PieceManifest{PieceBytes: v1.PieceBytes, SizeBytes: size, SHA256: sum(img)}
	for off := int64(0); off < size; off += v1.PieceBytes {
		m.Pieces = append(m.Pieces, sum(img[off:min(off+v1.PieceBytes, size)]))
	}
	return img, m
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

// target is an agent's disk: a sparse file that skips all-zero writes, as
// thin-provisioned storage with zero detection does (its fresh blocks
// read as zeros). The data pieces are written and read back for real.
type target struct{ f *os.File }

var zeros = make([]byte, v1.PieceBytes)

func (t target) WriteAt(p []byte, off int64) (int, error) {
	if len(p) <= len(zeros) && bytes.Equal(p, zeros[:len(p)]) {
		return len(p), nil
	}
	return t.f.WriteAt(p, off)
}

// deploy is one agent's deploy with the work of the ramdisk agent's
// memory mode, the mode it shares pieces in (usePieces needs the image
// to fit its memory limit): the image streamed through the fetcher
// (every piece checked against the manifest) and its whole digest
// checked, then written from the held pieces, then read back from the
// target and its digest checked. The pieces held by the fetcher's set
// stand in for memory mode's image buffer.
func (l *lab) deploy(ctx context.Context, f *agent.PieceFetcher, path string) error {
	h := sha256.New()
	rc, _ := f.Open(ctx)
	if _, err := io.CopyBuffer(h, rc, make([]byte, 1<<20)); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != l.man.SHA256 {
		return fmt.Errorf("digest %s, want %s", got, l.man.SHA256)
	}
	fl, err := os.Create(path)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	defer fl.Close()
	if err := fl.Truncate(l.man.SizeBytes); err != nil {
		return err
	}
	rc, _ = f.Open(ctx)
	buf := make([]byte, v1.PieceBytes)
	t := target{fl}
	for off := int64(0); off < l.man.SizeBytes; off += v1.PieceBytes {
		n, err := io.ReadFull(rc, buf[:min(v1.PieceBytes, l.man.SizeBytes-off)])
		if err != nil {
			return err
		}
		if _, err := t.WriteAt(buf[:n], off); err != nil {
			return err
		}
	}
	if err := fl.Sync(); err != nil {
		return err
	}
	// As the agent's read-back: from the disk, not the page cache.
	if err := unix.Fadvise(int(fl.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return err
	}
	h.Reset()
	if _, err := io.Copy(h, io.NewSectionReader(fl, 0, l.man.SizeBytes)); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != l.man.SHA256 {
		return fmt.Errorf("read back %s, want %s", got, l.man.SHA256)
	}
	return nil
}

// wave runs the first n agents at once; with share, each names the (at
// most four) agents before it as peers, as the controller's waves do,
// and serves its pieces with the ramdisk agent's defaults. It returns the
// time until every agent verified its read-back image, the bytes the
// controller sent and the agents' reports of bytes from peers.
func (l *lab) wave(b *testing.B, n int, share bool) (time.Duration, int64, int64) {
	l.sent.Store(0)
	fetchers := make([]*agent.PieceFetcher, n)
	var urls []string
	for i, a := range l.agents[:n] {
		set, err := agent.NewPieceSet(l.man)
		if err != nil {
			b.Fatal(err)
		}
		f := &agent.PieceFetcher{Set: set, ImageURL: l.url, ImageToken: "img", WaveToken: "wave", HTTP: a.http}
		if share {
			ps := &agent.PeerServer{} // cmd/machina-agent's: default hold
			ps.Offer(set, "wave")
			var ln net.Listener
			if err := inNS(a.ns.Name, func() (err error) { ln, err = net.Listen("tcp", a.addr+":0"); return }); err != nil {
				b.Fatal(err)
			}
			hs := &http.Server{Handler: ps, ReadHeaderTimeout: 10 * time.Second}
			go func() { _ = hs.Serve(ln) }()
			defer hs.Close()
			for j := len(urls) - 1; j >= 0 && len(f.Peers) < v1.MaxWavePeers; j-- {
				f.Peers = append(f.Peers, urls[j])
			}
			urls = append(urls, "http://"+ln.Addr().String())
		}
		fetchers[i] = f
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, f := range fetchers {
		wg.Go(func() {
			if err := l.deploy(b.Context(), f, filepath.Join(l.dir, "target-"+strconv.Itoa(i))); err != nil {
				errs <- fmt.Errorf("agent %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	var peer int64
	for _, f := range fetchers {
		peer += f.Stats().PeerBytes
	}
	runtime.GC() // the held pieces of this wave
	return d, l.sent.Load(), peer
}

type result struct {
	wall        time.Duration
	images      float64 // controller bytes in images
	peerImages  float64
	ran, shared bool
}

// BenchmarkWave: see the flags above; as root (network namespaces, tc).
// Reports each wave's wall time and the controller's bytes in images for
// every wave size, sharing off (up to wave.baseline-max) and on, then the
// goal: with sharing, the largest wave within 3× the time of one machine
// and the controller sending at most 3 images.
func BenchmarkWave(b *testing.B) {
	var sizes []int
	for _, s := range strings.Split(*waveSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			b.Fatalf("-wave.n %q: %q is not a machine count", *waveSizes, s)
		}
		sizes = append(sizes, n)
	}
	if *imageMiB < 4 || *imageMiB%4 != 0 || *dataEvery < 1 {
		b.Fatalf("-wave.image-mib %d (a multiple of 4) or -wave.data-every %d", *imageMiB, *dataEvery)
	}
	// The bench host's SHA-256 rate on one core now (the same load as the
	// waves): each agent hashes the image three times (its pieces, the
	// whole stream, the read-back), so a wave of N machines on this host
	// needs at least 3·N·image / (cores · rate) of hashing alone.
	hashRate := shaRate()
	b.Logf("SHA-256 on one core now: %.0f MB/s", hashRate/1e6)
	l := newLab(b, sizes[len(sizes)-1])
	imageBytes := float64(l.man.SizeBytes)
	results := map[string]result{}
	for _, n := range sizes {
		for _, share := range []bool{false, true} {
			if !share && n > *baselineMax {
				continue
			}
			name := fmt.Sprintf("N=%d/share=%v", n, share)
			b.Run(name, func(b *testing.B) {
				var r result
				for range b.N {
					d, sent, peer := l.wave(b, n, share)
					r = result{wall: d, images: float64(sent) / imageBytes, peerImages: float64(peer) / imageBytes, ran: true, shared: share}
				}
				b.ReportMetric(r.wall.Seconds(), "s/wave")
				b.ReportMetric(r.images, "images-from-controller")
				b.ReportMetric(r.peerImages, "images-from-peers")
				b.ReportMetric(0, "ns/op")
				results[name] = r
			})
		}
	}
	one, big := results["N=1/share=true"], results[fmt.Sprintf("N=%d/share=true", sizes[len(sizes)-1])]
	if !one.ran || !big.ran {
		return
	}
	ratio := big.wall.Seconds() / one.wall.Seconds()
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	N := float64(sizes[len(sizes)-1])
	b.Logf("hashing bound at N=%.0f: 3 × %.0f × %d MiB at %.0f MB/s per core × %d cores = %.1f s; at N=1: %.1f s",
		N, N, *imageMiB, hashRate/1e6, runtime.GOMAXPROCS(0), 3*N*imageBytes/(hashRate*float64(runtime.GOMAXPROCS(0))), 3*imageBytes/hashRate)
	b.Logf("image %d MiB (one piece in %d holds data), every link %s; goal at N=%d with sharing: wall %.1f s = %.1f× N=1 (%.1f s), want ≤ 3×: %s; controller sent %.2f images, want ≤ 3: %s",
		*imageMiB, *dataEvery, *linkRate, sizes[len(sizes)-1], big.wall.Seconds(), ratio, one.wall.Seconds(), verdict(ratio <= 3),
		big.images, verdict(big.images <= 3))
}

// shaRate is SHA-256 bytes per second on one core, hashing 256 MiB.
func shaRate() float64 {
	buf := make([]byte, 4<<20)
	rand.Read(buf)
	h := sha256.New()
	t := time.Now()
	for range 64 {
		h.Write(buf)
	}
	return float64(64*len(buf)) / time.Since(t).Seconds()
}
