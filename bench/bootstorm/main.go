// Command bootstorm measures a PXE boot storm against Machina's boot servers
// and against dnsmasq, driven by bench/bootstorm.sh (which creates the
// network namespaces and runs each mode inside one).
//
//	bootstorm serve  -iface vs0 -http 10.66.0.1:8080 -root /usr/lib/ipxe -clients 1000 [-ramdisk DIR]
//	    Machina's DHCP (full mode), TFTP and iPXE handler over a state store holding
//	    the N storm servers (commissioning; api.BootIndex mints their tokens in the
//	    store, with fsync), the HTTP side mounted on the api server as controller.Run
//	    mounts it (api.Server, HandlePublic), with DIR served at /boot/ramdisk/ by the
//	    iPXE handler (RamdiskDir), every limit at its production default.
//	bootstorm static -http 10.66.0.1:8080 -script URL
//	    a plain HTTP server returning the chain script (the HTTP side next to dnsmasq).
//	bootstorm storm  -server 10.66.0.1 -relay 10.66.0.2 -clients 1000 -http URL -file undionly.kpxe -label NAME
//	        [-ramdisk URL -ramdisk-clients M] [-pool 10.66.1.0] [-server-pids "PID..."]
//	    N concurrent clients, each: DHCP DISCOVER/OFFER/REQUEST/ACK (as a relay agent,
//	    so one socket carries every client; option 93 is 7, EFI x64, when -file ends
//	    in .efi, else 0, BIOS), a TFTP download of -file (blksize 1428, tsize), a GET
//	    of the per-MAC script and, for the first M clients, GETs of URL+vmlinuz and
//	    URL+initrd.cpio.gz over one keep-alive connection, every step after DHCP from
//	    the address the client leased (bound; the pool must be on the interface). Prints p50/p99 per step
//	    and the ramdisk step's aggregate throughput as JSON. With -stepwise, every
//	    client finishes a step before any starts the next, so each step is measured
//	    under the full concurrency of N (or M) clients.
//	bootstorm table MACHINA.json PEER.json [MACHINA-STEP.json PEER-STEP.json ...]
//	    prints the results side by side, with Machina/peer ratios.
//	bootstorm rounds M1.json,M2.json,... P1.json,P2.json,... [...]
//	    prints, for repeated stepwise storms (bootstorm.sh -n), each round's
//	    Machina/peer ratios and their median over the rounds.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/dhcp"
	"github.com/machina-metal/machina/boot/ipxe"
	"github.com/machina-metal/machina/boot/tftp"
	"github.com/machina-metal/machina/state"
	ptftp "github.com/pin/tftp/v3"
	"golang.org/x/sys/unix"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bootstorm:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: bootstorm serve|static|storm|table [flags]")
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:])
	case "static":
		return static(ctx, args[1:])
	case "storm":
		return storm(ctx, args[1:])
	case "table":
		return table(os.Stdout, args[1:])
	case "rounds":
		return rounds(os.Stdout, args[1:])
	}
	return fmt.Errorf("unknown mode %q", args[0])
}

// stormMAC is the deterministic MAC of client i (locally administered).
func stormMAC(i int) net.HardwareAddr {
	return net.HardwareAddr{0x52, 0x54, 0x01, byte(i >> 16), byte(i >> 8), byte(i)}
}

func serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	iface := fs.String("iface", "vs0", "interface to serve DHCP on")
	httpAddr := fs.String("http", "10.66.0.1:8080", "HTTP listen address")
	root := fs.String("root", "/usr/lib/ipxe", "TFTP root")
	n := fs.Int("clients", 1000, "storm clients (known MACs)")
	prof := fs.String("cpuprofile", "", "write a CPU profile of the server to this file")
	uefi := fs.String("uefi-file", "ipxe.efi", "TFTP file offered to EFI x64 clients (option 93 = 7)")
	ramdisk := fs.String("ramdisk", "", "folder served at /boot/ramdisk/ (make ramdisk writes out/ramdisk)")
	memTokens := fs.Bool("mem-tokens", false, "look servers up and mint tokens in memory (boot.MemLookup, boot.MemTokens: the storm's first shape), not in the state store: the store's cost in the same run")
	noPrepare := fs.Bool("no-prepare", false, "do not prepare the script tokens before the storm (as after a controller restart: every script request mints its token, a write); by default each server's token is prepared as the executor's netboot prepares it (ipxe.Handler.Prepare)")
	direct := fs.Bool("direct", false, "serve the iPXE handler on a bare http.Server (the storm's first shape), not through the api server")
	staticScript := fs.Bool("static-script", false, "a diagnostic: answer the script route with the static server's fixed chain script (bootstorm static) instead of the iPXE handler, in this process and behind the same HTTP side, so that a run tells the handler's cost from the process's (its DHCP, TFTP and store beside it) and the HTTP side's")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	// The production shape (controller.Run): servers in the state store
	// (commissioning, so every script carries a token), api.BootIndex as
	// the boot servers' Lookup and Tokens (a token is a bbolt write with
	// its fsync, as in production), the ramdisk folder served by the iPXE
	// handler (boot.Files over an os.Root), and every limit at its
	// production default: each simulated client uses its
	// own leased address, as machines in a real storm do (bootstorm.md).
	base := "http://" + *httpAddr
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	side, err := newStormSide(ctx, *n, ipxe.Config{ControllerURL: base, RamdiskDir: *ramdisk, Logger: log}, *memTokens, !*noPrepare && !*memTokens)
	if err != nil {
		return err
	}
	var retired []*stormSide // sides replaced between storms (SIGUSR1), closed at the end
	var retiredMu sync.Mutex
	st, look := side.st, side.look
	leases := &dhcp.MemLeases{} // as controller.Run: also what api.Machine binds reports and plans to
	lc := &leaseCheck{leases: leases, seen: make([]seenScript, 1<<16)}
	lc.next.Store(side)
	defer func() {
		lc.next.Load().close()
		retiredMu.Lock()
		for _, s := range retired {
			s.close()
		}
		retiredMu.Unlock()
	}()
	var h http.Handler = lc
	if *staticScript {
		body, err := boot.ChainScript(base + ipxe.ScriptPath)
		if err != nil {
			return err
		}
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != ipxe.ScriptPath {
				lc.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write(body)
		})
	}
	d, err := dhcp.New(dhcp.Config{Interfaces: []string{*iface}, Subnet: netip.MustParsePrefix("10.66.0.0/21"),
		PoolStart: netip.MustParseAddr("10.66.1.0"), PoolEnd: netip.MustParseAddr("10.66.7.250"), Lookup: look, Leases: leases, Logger: log,
		Boot: dhcp.BootFiles{ScriptURL: base + ipxe.ScriptPath, UEFI: *uefi}})
	if err != nil {
		return err
	}
	host, _, _ := net.SplitHostPort(*httpAddr)
	t, err := tftp.New(tftp.Config{Root: *root, Addr: host + ":69", ScriptURL: base + ipxe.ScriptPath, Logger: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp4", *httpAddr)
	if err != nil {
		return err
	}
	serveHTTP, err := httpSide(h, st, *ramdisk != "", *direct, log)
	if err != nil {
		return err
	}
	hctx, hcancel := context.WithCancel(ctx)
	defer hcancel()
	errc := make(chan error, 3)
	go func() { errc <- d.Serve(ctx) }()
	go func() { errc <- t.Serve(ctx) }()
	httpDone := make(chan struct{})
	go func() {
		defer close(httpDone)
		if err := serveHTTP(hctx, ln); err != nil {
			errc <- err
		}
	}()
	if !*noPrepare && !*memTokens {
		// SIGUSR1 between two storms: the fleet netbooted again, as the
		// executor does it (a new state store whose servers' tokens are
		// prepared, the script requests' handler swapped to it; the DHCP
		// side keeps its leases): the second storm's script requests find
		// their tokens prepared like the first's. Prints "prepared".
		usr1 := make(chan os.Signal, 1)
		signal.Notify(usr1, syscall.SIGUSR1)
		defer signal.Stop(usr1)
		go func() {
			for range usr1 {
				next, err := newStormSide(ctx, *n, ipxe.Config{ControllerURL: base, RamdiskDir: *ramdisk, Logger: log}, false, true)
				if err != nil {
					errc <- err
					return
				}
				old := lc.next.Swap(next)
				retiredMu.Lock()
				retired = append(retired, old)
				retiredMu.Unlock()
				runtime.GC() // the set-up's garbage, not the storm's
				fmt.Println("prepared")
			}
		}()
	}
	fmt.Println("ready")
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	hcancel()
	<-httpDone
	ds := d.Stats()
	lc.count()
	fmt.Fprintf(os.Stderr, "machina dhcp stats: %+v tftp stats: %+v\n", ds, t.Stats())
	fmt.Fprintf(os.Stderr, "machina script requests by source address: %d from the MAC's lease, %d from another address, %d without a lease\n",
		lc.leased.Load(), lc.other.Load(), lc.none.Load())
	fmt.Fprintf(os.Stderr, "machina server CPU: %.2f s for both runs\n", cpuSeconds())
	return nil
}

// prepareAll prepares the script token of the n storm servers with 16
// concurrent callers (reconciler.Config's default worker count is 8;
// concurrency shares commits).
func prepareAll(ctx context.Context, ih *ipxe.Handler, n int) error {
	var next atomic.Int64
	errs := make(chan error, 16)
	for range 16 {
		go func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					errs <- nil
					return
				}
				if ok, err := ih.Prepare(ctx, stormMAC(i)); err != nil || !ok {
					errs <- fmt.Errorf("prepare storm-%04d: prepared %v, %v", i, ok, err)
					return
				}
			}
		}()
	}
	var first error
	for range 16 {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// stormSide is one fleet of the storm's servers: n commissioning servers
// in a state store of their own, the boot index over it and the iPXE
// handler over that (or, with mem, a MemLookup and MemTokens).
type stormSide struct {
	st   *state.Store
	dir  string
	look boot.Lookup
	ih   *ipxe.Handler
}

// newStormSide builds a stormSide from cfg (its Lookup and Tokens set
// here) and, with prepare, prepares every server's script token as the
// executor's netboot does.
func newStormSide(ctx context.Context, n int, cfg ipxe.Config, mem, prepare bool) (*stormSide, error) {
	st, dir, err := stormStore(n)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	side := &stormSide{st: st, dir: dir}
	bi, err := api.NewBootIndex(st)
	if err != nil {
		side.close()
		return nil, err
	}
	side.look, cfg.Tokens = bi, bi
	if mem {
		var ml boot.MemLookup
		for i := range n {
			if err := ml.Set(boot.Assignment{MAC: stormMAC(i), Name: fmt.Sprintf("storm-%04d", i), Lifecycle: boot.LifecycleCommissioning, Mode: boot.ModeBIOS}); err != nil {
				side.close()
				return nil, err
			}
		}
		side.look, cfg.Tokens = &ml, boot.NewMemTokens()
	}
	cfg.Lookup = side.look
	if side.ih, err = ipxe.New(cfg); err != nil {
		side.close()
		return nil, err
	}
	if prepare {
		// The production order: the executor netboots a commissioning
		// server (reconciler.Config.BeforeNetboot -> ih.Prepare) seconds
		// before its firmware sends DHCP, so its token is minted before
		// the storm's script step.
		if err := prepareAll(ctx, side.ih, n); err != nil {
			side.close()
			return nil, err
		}
	}
	return side, nil
}

func (s *stormSide) close() {
	if s.ih != nil {
		_ = s.ih.Close()
	}
	_ = s.st.Close()
	_ = os.RemoveAll(s.dir)
}

// leaseCheck passes requests to next and counts, for script requests
// (?mac=), whether they come from the address the DHCP server leased to
// that MAC: the binding api.Machine applies to the requests
// that follow the script (report, plan), which the storm does not make.
// A request only records its MAC and source address (an atomic slot in
// seen); count compares them with the leases when the server stops, so the
// check costs the measured script path no lease lookup, mutex or parse
// (the lookup inline was about 1.5 us of each script request in
// the storm's profile). Beyond len(seen) requests it checks inline.
type leaseCheck struct {
	next                atomic.Pointer[stormSide]
	leases              *dhcp.MemLeases
	leased, other, none atomic.Int64
	n                   atomic.Int64
	seen                []seenScript
}

// seenScript is one script request's MAC and source address (r.RemoteAddr).
type seenScript struct{ mac, addr string }

func (c *leaseCheck) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == ipxe.ScriptPath {
		if mac := queryMAC(r.URL.RawQuery); mac != "" {
			if i := c.n.Add(1) - 1; i < int64(len(c.seen)) {
				c.seen[i] = seenScript{mac, r.RemoteAddr}
			} else {
				c.check(mac, r.RemoteAddr)
			}
		}
	}
	c.next.Load().ih.ServeHTTP(w, r)
}

// check counts one script request from addr (host:port) for mac.
func (c *leaseCheck) check(mac, addr string) {
	ap, _ := netip.ParseAddrPort(addr)
	switch ip, ok := c.leases.LeasedIP(mac); {
	case !ok:
		c.none.Add(1)
	case ip == ap.Addr().Unmap():
		c.leased.Add(1)
	default:
		c.other.Add(1)
	}
}

// count checks the recorded requests; call it once, when no request runs.
func (c *leaseCheck) count() {
	for _, s := range c.seen[:min(c.n.Load(), int64(len(c.seen)))] {
		c.check(s.mac, s.addr)
	}
}

// queryMAC is the first mac= parameter of the raw query q, unescaped only
// as far as the storm's MACs need (none): the counter above costs the
// measured server a scan, not url.ParseQuery's map.
func queryMAC(q string) string {
	for q != "" {
		var kv string
		kv, q, _ = strings.Cut(q, "&")
		if v, ok := strings.CutPrefix(kv, "mac="); ok {
			return v
		}
	}
	return ""
}

// stormStore creates a state store in a new temporary folder (on disk, as
// the controller's) holding n servers in commissioning, storm-NNNN with
// boot MAC stormMAC(i), and returns it reopened with the production
// options (an fsync per commit). The servers are created without fsync.
func stormStore(n int) (*state.Store, string, error) {
	dir, err := os.MkdirTemp("", "bootstorm-state-")
	if err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, "state.db")
	st, err := state.Open(path, state.Options{NoSync: true})
	if err != nil {
		return nil, dir, err
	}
	for i := range n {
		if _, err := st.CreateServer(state.Server{Name: fmt.Sprintf("storm-%04d", i), BootMAC: stormMAC(i).String(),
			Lifecycle: state.LifecycleCommissioning, BootMode: "bios"}); err != nil {
			st.Close()
			return nil, dir, err
		}
	}
	if err := st.Close(); err != nil {
		return nil, dir, err
	}
	st, err = state.Open(path, state.Options{})
	return st, dir, err
}

// httpSide returns the function serving Machina's HTTP side: by default
// an api.Server over st (the production middleware: connection limit per
// source address, metrics, request log, JSON errors) with the iPXE handler
// h at ipxe.ScriptPath and, with ramdisk, at /boot/ramdisk/, as
// controller.Run mounts them; with direct, h on a bare http.Server (no api
// middleware).
func httpSide(h http.Handler, st *state.Store, ramdisk, direct bool, log *slog.Logger) (func(context.Context, net.Listener) error, error) {
	if direct {
		return func(ctx context.Context, ln net.Listener) error {
			hs := &http.Server{Handler: h}
			go func() { <-ctx.Done(); _ = hs.Close() }()
			if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		}, nil
	}
	srv, err := api.New(api.Config{Store: st, Logger: log})
	if err != nil {
		return nil, err
	}
	if err := srv.HandlePublic(ipxe.ScriptPath, h); err != nil {
		return nil, err
	}
	if ramdisk {
		// The route controller.Run mounts for cmd/machina's -ramdisk-dir
		// (controller/stages.go); keep the two the same.
		if err := srv.HandlePublic("/boot/ramdisk/", h); err != nil {
			return nil, err
		}
	}
	return func(ctx context.Context, ln net.Listener) error { return srv.Serve(ctx, ln) }, nil
}

func static(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("static", flag.ContinueOnError)
	httpAddr := fs.String("http", "10.66.0.1:8080", "HTTP listen address")
	script := fs.String("script", "http://10.66.0.1:8080/boot/ipxe", "script URL the chain script points at")
	if err := fs.Parse(args); err != nil {
		return err
	}
	body, err := boot.ChainScript(*script)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp4", *httpAddr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(body)
	})}
	go func() { <-ctx.Done(); _ = hs.Close() }()
	fmt.Println("ready")
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// relay carries every client's DHCP exchange over one UDP socket, as a relay
// agent (giaddr) would; replies are routed to the waiting client by xid.
type relay struct {
	conn   *net.UDPConn
	server *net.UDPAddr
	gi     net.IP
	mu     sync.Mutex
	wait   map[dhcpv4.TransactionID]chan *dhcpv4.DHCPv4
}

func (r *relay) loop() {
	buf := make([]byte, 1500)
	for {
		n, _, err := r.conn.ReadFromUDP(buf)
		if err != nil {
			return
		}
		m, err := dhcpv4.FromBytes(buf[:n])
		if err != nil {
			continue
		}
		r.mu.Lock()
		ch := r.wait[m.TransactionID]
		r.mu.Unlock()
		if ch != nil {
			select {
			case ch <- m:
			default:
			}
		}
	}
}

// exchange sends m and waits for a reply of type want, retransmitting after
// 2 s up to 4 times (RFC 2131 §4.1 backoff, simplified).
func (r *relay) exchange(m *dhcpv4.DHCPv4, want dhcpv4.MessageType) (*dhcpv4.DHCPv4, error) {
	ch := make(chan *dhcpv4.DHCPv4, 4)
	r.mu.Lock()
	r.wait[m.TransactionID] = ch
	r.mu.Unlock()
	defer func() { r.mu.Lock(); delete(r.wait, m.TransactionID); r.mu.Unlock() }()
	b := m.ToBytes()
	for range 4 {
		if _, err := r.conn.WriteToUDP(b, r.server); err != nil {
			return nil, err
		}
		t := time.NewTimer(2 * time.Second)
	wait:
		for {
			select {
			case rep := <-ch:
				if rep.MessageType() == want {
					t.Stop()
					return rep, nil
				}
				if rep.MessageType() == dhcpv4.MessageTypeNak {
					t.Stop()
					return nil, errors.New("nak")
				}
			case <-t.C:
				break wait
			}
		}
	}
	return nil, fmt.Errorf("no %s", want)
}

type result struct {
	dhcp, tftp, script, total time.Duration
	connect                   time.Duration // the script step's TCP connect, part of script
	window                    int           // the TFTP windowsize the server granted (1: lockstep)
	ramdisk                   time.Duration // both ramdisk GETs; zero when the client skipped them
	addr                      netip.Addr    // the address its DHCP exchange leased, or its fallback (clientAddr)
	rdBytes, rdReads          int64
	rdBuf                     []byte // the ramdisk step's read buffer (rdBufs), nil: allocate one
	rdStart, rdEnd            time.Time
	ok                        [4]bool  // dhcp, tftp, script, ramdisk succeeded (or, ramdisk, was skipped)
	errs                      [4]error // the step's failure
	err                       error    // the first failure
}

// Step indexes into result.ok.
const (
	stepDHCP = iota
	stepTFTP
	stepScript
	stepRamdisk
)

// stepNames are the steps' names in the -marks file, by step index.
var stepNames = [...]string{stepDHCP: "dhcp", stepTFTP: "tftp", stepScript: "script", stepRamdisk: "ramdisk"}

// monotonic is CLOCK_MONOTONIC in seconds (the clock of perf record -k
// CLOCK_MONOTONIC; Go's time.Time keeps its monotonic reading private).
func monotonic() float64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}

// appendMark appends "LABEL STEP START END" (seconds of CLOCK_MONOTONIC)
// to the file at path (-marks).
func appendMark(path, label, step string, start, end float64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(f, "%s %s %.6f %.6f\n", label, step, start, end); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// note records the outcome of step: ok, or the client's first error.
func (r *result) note(step int, err error) {
	r.ok[step], r.errs[step] = err == nil, err
	if err != nil && r.err == nil {
		r.err = err
	}
}

// warmFiles reads every file named in list (comma-separated; a folder
// stands for the regular files in it, not below it) to its end, so that
// the next step finds them in the page cache. The machines this bench runs
// on page out page cache unused for about a minute (DAMON's paddr pageout
// scheme, /sys/kernel/mm/damon/admin: unmapped file pages 12 aggregation
// intervals of 5 s old), and in one measured run the first server of a round to
// serve the ramdisk, Machina, then read it from disk (5.1 s of idle CPU
// in its ramdisk step, 0.40x nginx's throughput): a step of the storm
// measures serving from memory, for both sides alike.
func warmFiles(list string) error {
	if list == "" {
		return nil
	}
	var files []string
	for _, p := range strings.Split(list, ",") {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("warm: %w", err)
		}
		if !fi.IsDir() {
			files = append(files, p)
			continue
		}
		ents, err := os.ReadDir(p)
		if err != nil {
			return fmt.Errorf("warm: %w", err)
		}
		for _, e := range ents {
			if e.Type().IsRegular() {
				files = append(files, filepath.Join(p, e.Name()))
			}
		}
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return fmt.Errorf("warm: %w", err)
		}
		_, err = io.Copy(io.Discard, fh)
		fh.Close()
		if err != nil {
			return fmt.Errorf("warm: %s: %w", f, err)
		}
	}
	return nil
}

func storm(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("storm", flag.ContinueOnError)
	server := fs.String("server", "10.66.0.1", "DHCP/TFTP server address")
	relayIP := fs.String("relay", "10.66.0.2", "our address (giaddr)")
	n := fs.Int("clients", 1000, "concurrent clients")
	httpURL := fs.String("http", "http://10.66.0.1:8080/boot/ipxe", "script URL")
	file := fs.String("file", "undionly.kpxe", "TFTP file")
	label := fs.String("label", "machina", "label for the output")
	stepwise := fs.Bool("stepwise", false, "run each step for all clients before the next (per-step latency under full concurrency)")
	rdURL := fs.String("ramdisk", "", "base URL of the ramdisk files (ends in /boot/ramdisk/); empty skips the ramdisk step")
	rdN := fs.Int("ramdisk-clients", 1000, "clients (the first M) that run the ramdisk step; capped at -clients")
	pool := fs.String("pool", "10.66.1.0", "first address of the DHCP pool: client i without a lease uses this + i (stepwise)")
	pids := fs.String("server-pids", "", "space-separated PIDs of the server processes: their CPU time per step is reported (stepwise)")
	warm := fs.String("warm", "", "comma-separated files and folders (their regular files, not recursive) read, untimed, before the free run and before every stepwise step: the servers' files are in the page cache whoever serves them first (see warmFiles)")
	marks := fs.String("marks", "", "a diagnostic: append a line per stepwise step to this file, \"LABEL STEP START END\" in seconds of CLOCK_MONOTONIC, the clock of perf record -k CLOCK_MONOTONIC, so that a system-wide profile can be cut into the steps of each server")
	tftpClient := fs.String("tftp-client", "auto", "TFTP client: pxe (iPXE/BIOS PXE: blksize 1428, tsize), edk2 (OVMF's: size probe, blksize 1468, windowsize 4), or auto (edk2 for ipxe.efi, the UEFI round; pxe otherwise)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch *tftpClient {
	case "auto":
		*tftpClient = "pxe"
		if *file == "ipxe.efi" {
			*tftpClient = "edk2"
		}
	case "pxe", "edk2":
	default:
		return fmt.Errorf("storm: -tftp-client %q: want pxe, edk2 or auto", *tftpClient)
	}
	tftpStep := func(server, file string, local netip.Addr) (time.Duration, int, error) {
		if *tftpClient == "edk2" {
			return edk2Step(server, file, local)
		}
		d, err := pxeStep(server, file, local)
		return d, 1, err
	}
	if *rdURL == "" {
		*rdN = 0
	}
	*rdN = min(*rdN, *n)
	poolStart, err := netip.ParseAddr(*pool)
	if err != nil || !poolStart.Is4() {
		return fmt.Errorf("storm: -pool %q: not an IPv4 address", *pool)
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(*relayIP), Port: 67})
	if err != nil {
		return err
	}
	defer conn.Close()
	if rc, err := conn.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) })
	}
	r := &relay{conn: conn, server: &net.UDPAddr{IP: net.ParseIP(*server), Port: 67}, gi: net.ParseIP(*relayIP), wait: map[dhcpv4.TransactionID]chan *dhcpv4.DHCPv4{}}
	go r.loop()
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: *n, MaxConnsPerHost: 0}}

	results := make([]result, *n)
	var stepCPU [4]float64           // the server processes' CPU seconds per step (stepwise, -server-pids)
	var stepIdle, stepGen [4]float64 // idle CPU seconds of the machine, and this process's CPU seconds, per step (stepwise)
	var stepSoft [4]float64          // the ksoftirqd threads' CPU seconds per step (stepwise)
	var stepRx, stepTx [4][2]int64   // packets and bytes received and sent on this namespace's interfaces per step (stepwise)
	softPIDs := ksoftirqdPIDs()
	var wg sync.WaitGroup
	start := make(chan struct{})
	t0 := time.Now()
	if *stepwise {
		close(start) // nobody waits on it; the phases below replace the free run
		// Every client runs every step, also after a failed one (each
		// step's request does not depend on the previous answer), so that
		// each step runs at the full concurrency on both sides: dnsmasq
		// loses a third of the DHCP burst, and its TFTP would otherwise
		// be measured with two thirds of the clients.
		step := 0
		phase := func(f func(i int)) {
			// Between steps (not timed): the load generator collects the
			// previous step's garbage (the TFTP step allocates per block)
			// and lets the servers finish closing its sockets, so that a
			// step is not charged for the one before it.
			runtime.GC()
			if err := warmFiles(*warm); err != nil {
				fmt.Fprintln(os.Stderr, "storm:", err)
			}
			time.Sleep(200 * time.Millisecond)
			c0, i0, g0, k0 := procCPU(*pids), idleSeconds(), cpuSeconds(), procCPU(softPIDs)
			rx0, tx0 := netCounters()
			m0 := monotonic()
			var pw sync.WaitGroup
			for i := range *n {
				pw.Go(func() { f(i) })
			}
			pw.Wait()
			if *marks != "" {
				if err := appendMark(*marks, *label, stepNames[step], m0, monotonic()); err != nil {
					fmt.Fprintln(os.Stderr, "storm:", err)
				}
			}
			stepCPU[step] = procCPU(*pids) - c0
			stepIdle[step], stepGen[step], stepSoft[step] = idleSeconds()-i0, cpuSeconds()-g0, procCPU(softPIDs)-k0
			rx1, tx1 := netCounters()
			stepRx[step] = [2]int64{rx1[0] - rx0[0], rx1[1] - rx0[1]}
			stepTx[step] = [2]int64{tx1[0] - tx0[0], tx1[1] - tx0[1]}
			step++
		}
		phase(func(i int) {
			var err error
			results[i].dhcp, results[i].addr, err = dhcpStep(r, stormMAC(i), *file)
			results[i].note(stepDHCP, err)
			if err != nil {
				results[i].addr = clientAddr(poolStart, i)
			}
		})
		phase(func(i int) {
			var err error
			results[i].tftp, results[i].window, err = tftpStep(*server, *file, results[i].addr)
			results[i].note(stepTFTP, err)
		})
		phase(func(i int) {
			var err error
			results[i].script, results[i].connect, err = scriptStep(ctx, hc, stormMAC(i), *httpURL, results[i].addr)
			results[i].note(stepScript, err)
		})
		for i, b := range rdBufs(*rdN) {
			results[i].rdBuf = b
		}
		phase(func(i int) {
			if i < *rdN {
				results[i].note(stepRamdisk, ramdiskStep(ctx, *rdURL, &results[i]))
				results[i].rdBuf = nil
			} else {
				results[i].ok[stepRamdisk] = true
			}
		})
		for i := range results {
			results[i].total = results[i].dhcp + results[i].tftp + results[i].script + results[i].ramdisk
		}
	} else {
		if err := warmFiles(*warm); err != nil {
			fmt.Fprintln(os.Stderr, "storm:", err)
		}
		bufs := rdBufs(*rdN)
		for i := range *n {
			wg.Go(func() {
				<-start
				rd, buf := "", []byte(nil)
				if i < *rdN {
					rd, buf = *rdURL, bufs[i]
				}
				results[i] = client(ctx, r, hc, stormMAC(i), *server, *httpURL, *file, rd, buf, tftpStep)
			})
		}
		close(start)
		wg.Wait()
	}
	wall := time.Since(t0)

	var dh, tf, sc, tot, cn, rd []time.Duration
	failed := 0
	var stepFailed [4]int
	var firstErr error
	var rdBytes, rdReads int64 // body bytes and reads of the ramdisk step
	var rdFirst, rdLast time.Time
	windowed := 0 // TFTP transfers the server ran with a window over 1 block
	for _, res := range results {
		if res.err != nil {
			failed++
			if firstErr == nil {
				firstErr = res.err
			}
		}
		for st, err := range res.errs {
			if err != nil {
				stepFailed[st]++
			}
		}
		// A step's figures include every client that completed it (in a
		// free run, a client stops at its first failure); the total only
		// clients that completed all.
		if res.ok[stepDHCP] {
			dh = append(dh, res.dhcp)
		}
		if res.ok[stepTFTP] {
			tf = append(tf, res.tftp)
			if res.window > 1 {
				windowed++
			}
		}
		if res.ok[stepScript] {
			sc, cn = append(sc, res.script), append(cn, res.connect)
		}
		if res.err == nil {
			tot = append(tot, res.total)
		}
		if res.ok[stepRamdisk] && res.rdBytes > 0 {
			rd = append(rd, res.ramdisk)
			rdBytes += res.rdBytes
			rdReads += res.rdReads
			if rdFirst.IsZero() || res.rdStart.Before(rdFirst) {
				rdFirst = res.rdStart
			}
			if res.rdEnd.After(rdLast) {
				rdLast = res.rdEnd
			}
		}
	}
	out := map[string]any{
		"client_cpu_s": cpuSeconds(), "file": *file,
		"label": *label, "stepwise": *stepwise, "clients": *n, "failed": failed, "wall_ms": ms(wall),
		"failed_dhcp": stepFailed[stepDHCP], "failed_tftp": stepFailed[stepTFTP], "failed_script": stepFailed[stepScript], "failed_ramdisk": stepFailed[stepRamdisk],
		"dhcp_p50_ms": ms(pct(dh, 50)), "dhcp_p99_ms": ms(pct(dh, 99)),
		"tftp_p50_ms": ms(pct(tf, 50)), "tftp_p99_ms": ms(pct(tf, 99)),
		"script_p50_ms": ms(pct(sc, 50)), "script_p99_ms": ms(pct(sc, 99)),
		"connect_p50_ms": ms(pct(cn, 50)), "connect_p99_ms": ms(pct(cn, 99)),
		"total_p50_ms": ms(pct(tot, 50)), "total_p99_ms": ms(pct(tot, 99)),
		"ramdisk_p50_ms": ms(pct(rd, 50)), "ramdisk_p99_ms": ms(pct(rd, 99)), "ramdisk_reads": rdReads, "ramdisk_kb_per_read": kbPerRead(rdBytes, rdReads),
		"ramdisk_clients": len(rd), "ramdisk_bytes": rdBytes,
		"tftp_client": *tftpClient, "tftp_windowed": windowed,
	}
	if *stepwise && *pids != "" {
		out["server_cpu_dhcp_s"], out["server_cpu_tftp_s"], out["server_cpu_script_s"], out["server_cpu_ramdisk_s"] = stepCPU[0], stepCPU[1], stepCPU[2], stepCPU[3]
	}
	if *stepwise {
		out["idle_cpu_dhcp_s"], out["idle_cpu_tftp_s"], out["idle_cpu_script_s"], out["idle_cpu_ramdisk_s"] = stepIdle[0], stepIdle[1], stepIdle[2], stepIdle[3]
		out["client_cpu_dhcp_s"], out["client_cpu_tftp_s"], out["client_cpu_script_s"], out["client_cpu_ramdisk_s"] = stepGen[0], stepGen[1], stepGen[2], stepGen[3]
		if stepRx[stepRamdisk][0] > 0 && stepTx[stepRamdisk][0] > 0 {
			out["ramdisk_rx_kb_per_packet"] = float64(stepRx[stepRamdisk][1]) / float64(stepRx[stepRamdisk][0]) / 1e3
			out["ramdisk_tx_packets_per_mb"] = float64(stepTx[stepRamdisk][0]) / (float64(stepRx[stepRamdisk][1]) / 1e6)
		}
		out["softirqd_cpu_dhcp_s"], out["softirqd_cpu_tftp_s"], out["softirqd_cpu_script_s"], out["softirqd_cpu_ramdisk_s"] = stepSoft[0], stepSoft[1], stepSoft[2], stepSoft[3]
	}
	if len(rd) > 0 {
		// Aggregate throughput: all ramdisk bytes over the span from the
		// first client's connect to the last client's final byte.
		span := rdLast.Sub(rdFirst)
		out["ramdisk_span_ms"] = ms(span)
		out["ramdisk_mb_s"] = float64(rdBytes) / 1e6 / span.Seconds()
	}
	if firstErr != nil {
		out["first_error"] = firstErr.Error()
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

func client(ctx context.Context, r *relay, hc *http.Client, mac net.HardwareAddr, server, scriptURL, file, ramdiskURL string, rdBuf []byte, tftpStep func(string, string, netip.Addr) (time.Duration, int, error)) (res result) {
	t0 := time.Now()
	var err error
	if res.dhcp, res.addr, err = dhcpStep(r, mac, file); err != nil {
		res.note(stepDHCP, err)
		return res
	}
	res.note(stepDHCP, nil)
	if res.tftp, res.window, err = tftpStep(server, file, res.addr); err != nil {
		res.note(stepTFTP, err)
		return res
	}
	res.note(stepTFTP, nil)
	if res.script, res.connect, err = scriptStep(ctx, hc, mac, scriptURL, res.addr); err != nil {
		res.note(stepScript, err)
		return res
	}
	res.note(stepScript, nil)
	if ramdiskURL != "" {
		res.rdBuf = rdBuf
		if err = ramdiskStep(ctx, ramdiskURL, &res); err != nil {
			res.note(stepRamdisk, err)
			return res
		}
	}
	res.note(stepRamdisk, nil)
	res.total = time.Since(t0)
	return res
}

// clientAddr is the address client i uses when its DHCP exchange leased
// none (stepwise runs every step for every client): the pool's i-th, which
// bootstorm.sh has put on the client namespace's interface with the rest
// of the pool. It may be another client's lease; two clients then share an
// address, as real machines do (a single shared address would hit the per-address connection limit).
func clientAddr(pool netip.Addr, i int) netip.Addr {
	b := pool.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// dhcpStep runs DISCOVER/OFFER/REQUEST/ACK for mac, shaped like a BIOS PXE
// ROM (option 60 PXEClient, option 93 arch 0) or, when file ends in .efi,
// like OVMF's (arch 7, EFI x64), checks the boot file and returns the
// leased address (yiaddr of the ACK), which the client's later steps use
// as their source address, as a booting machine does.
func dhcpStep(r *relay, mac net.HardwareAddr, file string) (time.Duration, netip.Addr, error) {
	t0 := time.Now()
	class, arch := "PXEClient:Arch:00000:UNDI:002001", iana.INTEL_X86PC
	if strings.HasSuffix(file, ".efi") {
		class, arch = "PXEClient:Arch:00007:UNDI:003016", iana.EFI_BC
	}
	pxe := []dhcpv4.Modifier{
		dhcpv4.WithHwAddr(mac), dhcpv4.WithGatewayIP(r.gi), dhcpv4.WithOption(dhcpv4.OptClassIdentifier(class)),
		dhcpv4.WithOption(dhcpv4.OptClientArch(arch)),
	}
	disc, err := dhcpv4.New(append(pxe, dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover))...)
	if err != nil {
		return 0, netip.Addr{}, err
	}
	disc.HopCount = 1
	offer, err := r.exchange(disc, dhcpv4.MessageTypeOffer)
	if err != nil {
		return 0, netip.Addr{}, fmt.Errorf("dhcp discover: %w", err)
	}
	req, err := dhcpv4.New(append(pxe, dhcpv4.WithTransactionID(disc.TransactionID), dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(offer.ServerIdentifier())))...)
	if err != nil {
		return 0, netip.Addr{}, err
	}
	req.HopCount = 1
	ack, err := r.exchange(req, dhcpv4.MessageTypeAck)
	if err != nil {
		return 0, netip.Addr{}, fmt.Errorf("dhcp request: %w", err)
	}
	if ack.BootFileName != file {
		return 0, netip.Addr{}, fmt.Errorf("boot file %q, want %q", ack.BootFileName, file)
	}
	leased, ok := netip.AddrFromSlice(ack.YourIPAddr.To4())
	if !ok || leased.IsUnspecified() {
		return 0, netip.Addr{}, fmt.Errorf("dhcp: ACK leases no address (yiaddr %v)", ack.YourIPAddr)
	}
	return time.Since(t0), leased, nil
}

// edk2Step downloads file as EDK2's PXE does (edk2Get: size probe, then
// blksize 1468 and windowsize 4) from the address local; it returns the
// time taken and the windowsize the server granted.
func edk2Step(server, file string, local netip.Addr) (time.Duration, int, error) {
	t0 := time.Now()
	srv, err := netip.ParseAddr(server)
	if err != nil {
		return 0, 0, fmt.Errorf("tftp: server %q: %w", server, err)
	}
	res, err := edk2Get(netip.AddrPortFrom(srv, 69), file, local, time.Second, 5)
	if err != nil {
		return 0, 0, fmt.Errorf("tftp: %w", err)
	}
	if res.tsize >= 0 && res.tsize != res.size {
		return 0, 0, fmt.Errorf("tftp: %s: received %d bytes, the size probe announced %d", file, res.size, res.tsize)
	}
	return time.Since(t0), res.window, nil
}

// pxeStep downloads file with blksize 1428 and tsize, as iPXE's PXE
// chainload does, from the address local.
func pxeStep(server, file string, local netip.Addr) (time.Duration, error) {
	t0 := time.Now()
	c, err := ptftp.NewClient(net.JoinHostPort(server, "69"))
	if err != nil {
		return 0, err
	}
	if err := c.SetLocalAddr(local.String()); err != nil {
		return 0, err
	}
	c.SetBlockSize(1428)
	c.RequestTSize(true)
	c.SetTimeout(time.Second)
	c.SetRetries(5)
	wt, err := c.Receive(file, "octet")
	if err != nil {
		return 0, fmt.Errorf("tftp: %w", err)
	}
	if _, err := wt.WriteTo(io.Discard); err != nil {
		return 0, fmt.Errorf("tftp: %w", err)
	}
	return time.Since(t0), nil
}

// scriptStep GETs the per-MAC iPXE script the way iPXE does: one new TCP
// connection, a minimal HTTP/1.1 request, the whole response read. It uses
// no http.Transport (connection pool, per-request goroutines): the load
// generator shares the server's two vCPUs, and a heavier client would be
// measured instead of the server.
func scriptStep(ctx context.Context, _ *http.Client, mac net.HardwareAddr, scriptURL string, local netip.Addr) (total, connect time.Duration, err error) {
	u, err := url.Parse(scriptURL)
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	connect, err = getScript(ctx, u.Host, u.Path, mac, local)
	if err != nil {
		return 0, 0, err
	}
	return time.Since(t0), connect, nil
}

// getScript GETs mac's script at path from host as iPXE does (one
// request, Connection: close), from local, checks the answer is a 200
// iPXE script, and returns how long the TCP connect took.
func getScript(ctx context.Context, host, path string, mac net.HardwareAddr, local netip.Addr) (connect time.Duration, err error) {
	t0 := time.Now()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0))}
	conn, err := d.DialContext(ctx, "tcp4", host)
	if err != nil {
		return 0, fmt.Errorf("script: %w", err)
	}
	connect = time.Since(t0)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET %s?mac=%s&platform=pcbios&arch=i386 HTTP/1.1\r\nHost: %s\r\nUser-Agent: iPXE/1.21.1\r\nConnection: close\r\n\r\n",
		path, hyphen(mac), host); err != nil {
		return 0, fmt.Errorf("script: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 1024), nil)
	if err != nil {
		return 0, fmt.Errorf("script: %w", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, fmt.Errorf("script: %w", err)
	}
	if resp.StatusCode != 200 || !bytes.HasPrefix(body, []byte("#!ipxe")) {
		return 0, fmt.Errorf("script: status %d", resp.StatusCode)
	}
	return connect, nil
}

// ramdiskFiles are what the iPXE script boots (boot/ipxe: KernelURL,
// InitrdURL under /boot/ramdisk/), fetched in this order.
var ramdiskFiles = []string{"vmlinuz", "initrd.cpio.gz"}

// rdBufSize is the ramdisk step's read buffer per client.
const rdBufSize = 256 << 10

// rdBufs returns n read buffers for the ramdisk step, each page already
// written, made before the step's clock starts: 1,000 clients' buffers are
// 256 MB, and faulting them in during the step cost the load generator
// 0.3-0.5 s of CPU (clear_page in the kernel's read into a fresh page),
// more for a server whose reads fill more of each buffer (measured:
// Machina's reads averaged 235 KB, nginx's 207-211 KB, and the load
// generator spent 8-21 % more CPU on Machina's step), CPU taken from the
// server on this 2-CPU machine. Real machines each have their own memory.
func rdBufs(n int) [][]byte {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, rdBufSize)
		for j := 0; j < rdBufSize; j += 4096 {
			bufs[i][j] = 1
		}
	}
	return bufs
}

// ramdiskStep GETs the kernel and the initrd from base (a URL ending in
// /), as iPXE does: one TCP connection kept alive for both, each body read
// whole and checked against its Content-Length (not hashed: a thousand
// clients hashing tens of MB would measure the load generator), from the
// address res.addr, reading into res.rdBuf when set. It fills res.ramdisk,
// rdBytes, rdReads, rdStart and rdEnd.
func ramdiskStep(ctx context.Context, base string, res *result) error {
	u, err := url.Parse(base)
	if err != nil {
		return err
	}
	res.rdStart = time.Now()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(res.addr, 0))}
	conn, err := d.DialContext(ctx, "tcp4", u.Host)
	if err != nil {
		return fmt.Errorf("ramdisk: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Minute))
	br := bufio.NewReaderSize(conn, 4096)
	buf := res.rdBuf // larger than br: bodies are read straight from the socket
	if buf == nil {
		buf = make([]byte, rdBufSize)
	}
	for _, f := range ramdiskFiles {
		if _, err := fmt.Fprintf(conn, "GET %s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: iPXE/1.21.1\r\n\r\n", u.Path, f, u.Host); err != nil {
			return fmt.Errorf("ramdisk %s: %w", f, err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return fmt.Errorf("ramdisk %s: %w", f, err)
		}
		n, err := io.CopyBuffer(plainWriter{&res.rdReads}, resp.Body, buf)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("ramdisk %s: %w", f, err)
		}
		if resp.StatusCode != 200 || resp.ContentLength <= 0 || n != resp.ContentLength {
			return fmt.Errorf("ramdisk %s: status %d, %d of %d bytes", f, resp.StatusCode, n, resp.ContentLength)
		}
		res.rdBytes += n
	}
	res.rdEnd = time.Now()
	res.ramdisk = res.rdEnd.Sub(res.rdStart)
	return nil
}

// kbPerRead is the mean KB (1,000 bytes) a read of the ramdisk step
// returned, 0 without reads: the load generator's cost per byte grows as
// a server's data arrives in smaller pieces.
func kbPerRead(bytes, reads int64) float64 {
	if reads == 0 {
		return 0
	}
	return float64(bytes) / float64(reads) / 1e3
}

// plainWriter discards like io.Discard but without its ReadFrom, whose
// 8 KiB reads would cost the load generator 32 times the syscalls of
// ramdiskStep's buffer; it counts its writes (one per read of the body).
type plainWriter struct{ n *int64 }

func (w plainWriter) Write(p []byte) (int, error) { *w.n++; return len(p), nil }

func hyphen(mac net.HardwareAddr) string {
	s := []byte(mac.String())
	for i := range s {
		if s[i] == ':' {
			s[i] = '-'
		}
	}
	return string(s)
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)-1)*p/100]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// table prints storm results pairwise: (machina, peer) per shape, with the
// ratio Machina/peer per column (below 1.0: Machina is faster).
func table(w io.Writer, files []string) error {
	if len(files) == 0 || len(files)%2 != 0 {
		return errors.New("table: want pairs of result files")
	}
	load := func(p string) (map[string]any, error) {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		m := map[string]any{}
		return m, json.Unmarshal(b, &m)
	}
	num := func(m map[string]any, k string) float64 { f, _ := m[k].(float64); return f }
	ratio := func(a, b float64) string {
		if b == 0 {
			return "-"
		}
		return strconv.FormatFloat(a/b, 'f', 2, 64)
	}
	for i := 0; i < len(files); i += 2 {
		a, err := load(files[i])
		if err != nil {
			return err
		}
		b, err := load(files[i+1])
		if err != nil {
			return err
		}
		shape := "free run: each client runs its steps back to back"
		if a["stepwise"] == true {
			shape = "stepwise: all clients finish a step before the next starts"
		}
		fmt.Fprintf(w, "boot storm, %v concurrent clients, TFTP file %v, %s (ms)\n", a["clients"], orEmpty(a["file"]), shape)
		fmt.Fprintf(w, "%-8s %12s %9s %12s %9s %8s %8s\n", "step", a["label"].(string)+" p50", "p99", b["label"].(string)+" p50", "p99", "ratio50", "ratio99")
		steps := []string{"dhcp", "tftp", "script", "connect"}
		if num(a, "ramdisk_clients") > 0 || num(b, "ramdisk_clients") > 0 {
			steps = append(steps, "ramdisk")
		}
		for _, s := range append(steps, "total") {
			a50, a99, b50, b99 := num(a, s+"_p50_ms"), num(a, s+"_p99_ms"), num(b, s+"_p50_ms"), num(b, s+"_p99_ms")
			fmt.Fprintf(w, "%-8s %12.1f %9.1f %12.1f %9.1f %8s %8s\n", s, a50, a99, b50, b99, ratio(a50, b50), ratio(a99, b99))
		}
		fmt.Fprintf(w, "%-8s %12.1f %9s %12.1f\n", "wall", a["wall_ms"], "", b["wall_ms"])
		if len(steps) > 4 {
			fmt.Fprintf(w, "ramdisk: %v | %v clients, %.0f | %.0f MB each side, aggregate %.1f | %.1f MB/s (Machina/peer %s), %.1f | %.1f KB per read\n",
				a["ramdisk_clients"], b["ramdisk_clients"], num(a, "ramdisk_bytes")/1e6, num(b, "ramdisk_bytes")/1e6,
				num(a, "ramdisk_mb_s"), num(b, "ramdisk_mb_s"), ratio(num(a, "ramdisk_mb_s"), num(b, "ramdisk_mb_s")),
				num(a, "ramdisk_kb_per_read"), num(b, "ramdisk_kb_per_read"))
		}
		if c := orEmpty(a["tftp_client"]); c != "" {
			fmt.Fprintf(w, "tftp client %v: transfers with a window over 1 block: %v %v | %v %v\n", c, a["label"], a["tftp_windowed"], b["label"], b["tftp_windowed"])
		}
		fmt.Fprintf(w, "load generator CPU: %.2f s (%s run) | %.2f s (%s run)\n", a["client_cpu_s"], a["label"], b["client_cpu_s"], b["label"])
		if _, ok := a["server_cpu_script_s"]; ok {
			fmt.Fprintf(w, "server CPU per step (dhcp tftp script ramdisk), s: %s %.3f %.3f %.3f %.2f | %s %.3f %.3f %.3f %.2f\n",
				a["label"], num(a, "server_cpu_dhcp_s"), num(a, "server_cpu_tftp_s"), num(a, "server_cpu_script_s"), num(a, "server_cpu_ramdisk_s"),
				b["label"], num(b, "server_cpu_dhcp_s"), num(b, "server_cpu_tftp_s"), num(b, "server_cpu_script_s"), num(b, "server_cpu_ramdisk_s"))
		}
		if _, ok := a["idle_cpu_script_s"]; ok {
			for _, k := range []struct{ key, what string }{{"client_cpu", "load generator CPU"}, {"idle_cpu", "idle CPU (the machine's)"}, {"softirqd_cpu", "ksoftirqd CPU"}} {
				fmt.Fprintf(w, "%s per step (dhcp tftp script ramdisk), s: %s %.3f %.3f %.3f %.2f | %s %.3f %.3f %.3f %.2f\n", k.what,
					a["label"], num(a, k.key+"_dhcp_s"), num(a, k.key+"_tftp_s"), num(a, k.key+"_script_s"), num(a, k.key+"_ramdisk_s"),
					b["label"], num(b, k.key+"_dhcp_s"), num(b, k.key+"_tftp_s"), num(b, k.key+"_script_s"), num(b, k.key+"_ramdisk_s"))
			}
		}
		fmt.Fprintf(w, "failed clients: %s %v %v | %s %v %v\n", a["label"], a["failed"], orEmpty(a["first_error"]), b["label"], b["failed"], orEmpty(b["first_error"]))
		fmt.Fprintf(w, "failed per step (dhcp tftp script ramdisk): %s %v %v %v %v | %s %v %v %v %v\n\n",
			a["label"], a["failed_dhcp"], a["failed_tftp"], a["failed_script"], a["failed_ramdisk"],
			b["label"], b["failed_dhcp"], b["failed_tftp"], b["failed_script"], b["failed_ramdisk"])
	}
	return nil
}

// short formats a figure of the rounds table: one decimal from 10 up,
// three below (CPU seconds of a step).
func short(f float64) string {
	if f >= 10 {
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	return strconv.FormatFloat(f, 'f', 3, 64)
}

// rounds prints, per pair of comma-separated lists of stepwise result
// files (round i of Machina's list was run next to round i of the peer's,
// bootstorm.sh -n), every round's Machina/peer ratios of the judged
// figures (TFTP p50 and p99, script p50 and p99, the ramdisk
// step's aggregate MB/s) and their median over the rounds. A round's ratio
// pairs figures measured minutes apart on the same machine, so the median
// of the rounds' ratios is the comparison's estimate and the rounds' spread
// its noise; both are printed.
func rounds(w io.Writer, args []string) error {
	if len(args) == 0 || len(args)%2 != 0 {
		return errors.New("rounds: want pairs of comma-separated lists of result files")
	}
	type metric struct {
		name, key string
		higher    bool // a throughput: Machina/peer above 1 is better
	}
	metrics := []metric{{"tftp p50", "tftp_p50_ms", false}, {"tftp p99", "tftp_p99_ms", false},
		{"script p50", "script_p50_ms", false}, {"script p99", "script_p99_ms", false},
		{"connect p99", "connect_p99_ms", false}, {"ramdisk MB/s", "ramdisk_mb_s", true},
		// Where a step's time went (CPU seconds of the step; the mean read):
		// the diagnostics beside the goals, not goals.
		{"script srv s", "server_cpu_script_s", false}, {"script gen s", "client_cpu_script_s", false},
		{"ramdisk srv s", "server_cpu_ramdisk_s", false}, {"ramdisk gen s", "client_cpu_ramdisk_s", false},
		{"ramdisk idle s", "idle_cpu_ramdisk_s", false}, {"ramdisk sirq s", "softirqd_cpu_ramdisk_s", false},
		{"ramdisk KB/pkt", "ramdisk_rx_kb_per_packet", true}, {"ramdisk ack/MB", "ramdisk_tx_packets_per_mb", false}, {"ramdisk KB/rd", "ramdisk_kb_per_read", true}}
	for i := 0; i < len(args); i += 2 {
		ma, pa := strings.Split(args[i], ","), strings.Split(args[i+1], ",")
		if len(ma) != len(pa) {
			return fmt.Errorf("rounds: %d Machina files against %d peer files", len(ma), len(pa))
		}
		var res [][2]map[string]any
		for r := range ma {
			var pair [2]map[string]any
			for j, p := range []string{ma[r], pa[r]} {
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				if err := json.Unmarshal(b, &pair[j]); err != nil {
					return fmt.Errorf("rounds: %s: %w", p, err)
				}
			}
			res = append(res, pair)
		}
		num := func(m map[string]any, k string) float64 { f, _ := m[k].(float64); return f }
		fmt.Fprintf(w, "stepwise storm, %d rounds (peers first in the even ones), TFTP file %v: Machina/peer ratio per round and the median\n",
			len(res), orEmpty(res[0][0]["file"]))
		fmt.Fprintf(w, "%-13s", "figure")
		for r := range res {
			fmt.Fprintf(w, " %20s", fmt.Sprintf("round %d", r+1))
		}
		fmt.Fprintf(w, " %8s\n", "median")
		for _, m := range metrics {
			var ratios []float64
			cells := make([]string, len(res))
			for r, pair := range res {
				a, b := num(pair[0], m.key), num(pair[1], m.key)
				if a == 0 || b == 0 {
					cells[r] = "-"
					continue
				}
				ratios = append(ratios, a/b)
				cells[r] = fmt.Sprintf("%s/%s=%.2f", short(a), short(b), a/b)
			}
			if len(ratios) == 0 {
				continue
			}
			fmt.Fprintf(w, "%-13s", m.name)
			for _, c := range cells {
				fmt.Fprintf(w, " %20s", c)
			}
			fmt.Fprintf(w, " %8.3f\n", median(ratios))
		}
		fmt.Fprintln(w)
	}
	return nil
}

// median is the middle of v (the mean of the two middle values for an even
// count); v is sorted in place. 0 for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func orEmpty(v any) any {
	if v == nil {
		return ""
	}
	return v
}

// procCPU is the CPU time in seconds the processes pids (space-separated)
// have run so far, every thread of each: the sum of the first field of
// /proc/PID/task/TID/schedstat (time on the CPU, in ns: sched_info, CONFIG_SCHEDSTATS
// or CONFIG_TASK_DELAY_ACCT), which resolves the script step's tens of
// milliseconds where /proc/PID/stat's 10 ms clock ticks do not. A thread
// that has exited no longer counts (Go's threads live as long as the
// process); a process that is gone counts 0.
func procCPU(pids string) float64 {
	var ns int64
	for _, p := range strings.Fields(pids) {
		tasks, err := os.ReadDir("/proc/" + p + "/task")
		if err != nil {
			continue
		}
		for _, t := range tasks {
			b, err := os.ReadFile("/proc/" + p + "/task/" + t.Name() + "/schedstat")
			if err != nil {
				continue
			}
			f := strings.Fields(string(b))
			if len(f) == 0 {
				continue
			}
			v, _ := strconv.ParseInt(f[0], 10, 64)
			ns += v
		}
	}
	return float64(ns) / 1e9
}

// netCounters sums the packets and bytes received ([0]) and sent ([1]) on
// this network namespace's interfaces other than lo (sysfs, which
// `ip netns exec` mounts for the namespace); zeros when unreadable. A
// veth carries a TSO/GSO packet whole, so received bytes per packet show
// how the server cut its data, and sent packets per MB how often the
// clients acknowledged.
func netCounters() (rx, tx [2]int64) {
	ents, _ := os.ReadDir("/sys/class/net")
	read := func(dev, f string) int64 {
		b, _ := os.ReadFile("/sys/class/net/" + dev + "/statistics/" + f)
		v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return v
	}
	for _, e := range ents {
		if e.Name() == "lo" {
			continue
		}
		rx[0] += read(e.Name(), "rx_packets")
		rx[1] += read(e.Name(), "rx_bytes")
		tx[0] += read(e.Name(), "tx_packets")
		tx[1] += read(e.Name(), "tx_bytes")
	}
	return rx, tx
}

// ksoftirqdPIDs lists the kernel's ksoftirqd/N threads (space-separated):
// the network receive work a softirq defers to them is charged to neither
// the servers nor the load generator (this kernel has no IRQ time
// accounting: softirq work done on a task's way out of a system call is
// the task's).
func ksoftirqdPIDs() string {
	ents, _ := os.ReadDir("/proc")
	var pids []string
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/comm"); err == nil && bytes.HasPrefix(b, []byte("ksoftirqd/")) {
			pids = append(pids, e.Name())
		}
	}
	return strings.Join(pids, " ")
}

// idleSeconds is the machine's idle and iowait CPU time so far, summed over
// its CPUs: the first line of /proc/stat (fields 4 and 5, USER_HZ ticks of
// 100 Hz); 0 when it cannot be read. Network namespaces share the CPUs, so
// this is the time neither the servers nor the load generator ran.
func idleSeconds() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 6 || f[0] != "cpu" {
		return 0
	}
	idle, _ := strconv.ParseInt(f[4], 10, 64)
	iow, _ := strconv.ParseInt(f[5], 10, 64)
	return float64(idle+iow) / 100
}

// cpuSeconds is this process's user+system CPU time so far (getrusage(2)).
func cpuSeconds() float64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
