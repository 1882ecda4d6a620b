package discover

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/internal/peertest"
)

var creds = []Credential{
	{Name: "bmc-dell", Username: "root", Password: "calvin-secret-1"},
	{Name: "bmc-hpe", Username: "Administrator", Password: "ilo-secret-2"},
	{Name: "bmc-smc", Username: "ADMIN", Password: "smc-secret-3"},
}

var trees bmcsim.Trees

// startSim serves the fixture tree over TLS on 127.0.0.1:0 with one account
// and the given lockout threshold.
func startSim(t *testing.T, tree string, c Credential, threshold int) (*bmcsim.Server, string) {
	t.Helper()
	dir, err := bmcsim.TreeDir("", tree)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := trees.New(dir, bmcsim.Config{Username: c.Username, Password: c.Password, LockoutThreshold: threshold, LockoutDuration: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(sim)
	t.Cleanup(ts.Close)
	return sim, ts.Listener.Addr().String()
}

func byAddr(rep *Report) map[string]Result {
	m := map[string]Result{}
	for _, r := range rep.Results {
		m[strings.TrimPrefix(r.Address, "https://")] = r
	}
	return m
}

func failures401(sim *bmcsim.Server) int {
	n := 0
	for _, r := range sim.Requests() {
		if r.Status == http.StatusUnauthorized {
			n++
		}
	}
	return n
}

func TestScanLoopbackRange(t *testing.T) {
	// Three BMCs, each accepting a different credential of the list, all
	// locking after 3 consecutive failures.
	dell, aDell := startSim(t, "dell-poweredge-r750-idrac9", creds[0], 3)
	hpe, aHPE := startSim(t, "hpe-proliant-dl385gen10plusv2-ilo5", creds[1], 3)
	smc, aSMC := startSim(t, "supermicro-sys821ge-tnhr-x13", creds[2], 3)
	// A fourth BMC whose credential is not in the list at all.
	lenovo, aLenovo := startSim(t, "lenovo-thinksystem-sr670v2-xcc", Credential{Username: "USERID", Password: "nope"}, 3)

	notFound := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(notFound.Close)
	oldTLS := httptest.NewUnstartedServer(http.NotFoundHandler())
	oldTLS.TLS = &tls.Config{MaxVersion: tls.VersionTLS11}
	oldTLS.StartTLS()
	t.Cleanup(oldTLS.Close)
	hang, _ := peertest.SilentListener(t)
	slow, aSlow := startSim(t, "openbmc-bmcweb-stock", creds[0], 3)
	slow.Inject(bmcsim.Fault{Method: "GET", PathSuffix: "/redfish/v1/", Kind: bmcsim.FaultSlow, Delay: time.Minute})
	closed := peertest.ClosedPort(t)

	targets := []string{aDell, aHPE, aSMC, aLenovo, notFound.Listener.Addr().String(), oldTLS.Listener.Addr().String(), hang, aSlow, closed}
	rep, err := Scan(context.Background(), Config{
		Targets: targets, AllowLoopback: true, Credentials: creds, LockoutThreshold: 3,
		InsecureTLS: true, Timeout: 300 * time.Millisecond, Concurrency: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Probed != len(targets) {
		t.Errorf("probed %d, want %d", rep.Probed, len(targets))
	}
	got := byAddr(rep)
	if _, ok := got[closed]; ok || len(rep.Results) != len(targets)-1 {
		t.Errorf("closed port must not be a result; got %d results", len(rep.Results))
	}

	d := got[aDell]
	if d.Status != StatusAuthenticated || d.Credentials != "bmc-dell" || d.Attempts != 1 || d.Failures != 0 {
		t.Errorf("dell: %+v", d)
	}
	if d.Manufacturer != "Dell Inc." || d.SystemID != "System.Embedded.1" || d.Serial == "" || d.UUID == "" || len(d.MACs) == 0 {
		t.Errorf("dell identity: %+v", d)
	}
	h := got[aHPE]
	if h.Status != StatusAuthenticated || h.Credentials != "bmc-hpe" || h.Attempts != 2 || h.Failures != 1 || h.Manufacturer != "HPE" {
		t.Errorf("hpe: %+v", h)
	}
	// The right credential is third, but a lockout of 3 leaves only two
	// failures to spend: the scan stops before the third attempt.
	s := got[aSMC]
	if s.Status != StatusAuthFailed || s.Attempts != 2 || s.Failures != 2 || !strings.Contains(s.Error, "lockout") {
		t.Errorf("supermicro: %+v", s)
	}
	l := got[aLenovo]
	if l.Status != StatusAuthFailed || l.Failures != 2 {
		t.Errorf("lenovo: %+v", l)
	}
	for name, sim := range map[string]*bmcsim.Server{"dell": dell, "hpe": hpe, "supermicro": smc, "lenovo": lenovo} {
		if sim.Locked() {
			t.Errorf("%s: account locked by the scan", name)
		}
		if n := failures401(sim); n > 2 {
			t.Errorf("%s: %d refused logins, want at most 2", name, n)
		}
	}
	if r := got[notFound.Listener.Addr().String()]; r.Status != StatusNotRedfish || !strings.Contains(r.Error, "404") {
		t.Errorf("404 server: %+v", r)
	}
	if r := got[oldTLS.Listener.Addr().String()]; r.Status != StatusError || !strings.Contains(r.Error, "service root") {
		t.Errorf("tls server: %+v", r)
	}
	if r := got[hang]; r.Status != StatusError || !strings.Contains(r.Error, "timeout") {
		t.Errorf("hanging port: %+v", r)
	}
	if r := got[aSlow]; r.Status != StatusError || !strings.Contains(r.Error, "timeout") || r.Attempts != 0 {
		t.Errorf("slow bmc: %+v", r)
	}

	// No password in the JSON report.
	b, _ := json.Marshal(rep)
	for _, c := range creds {
		if strings.Contains(string(b), c.Password) {
			t.Fatalf("report leaks %s's password", c.Name)
		}
	}
}

func TestScanThirdCredentialWithHigherThreshold(t *testing.T) {
	smc, a := startSim(t, "supermicro-sys821ge-tnhr-x13", creds[2], 5)
	rep, err := Scan(context.Background(), Config{Targets: []string{a}, AllowLoopback: true, Credentials: creds, LockoutThreshold: 5, InsecureTLS: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 1 {
		t.Fatalf("results: %+v", rep.Results)
	}
	r := rep.Results[0]
	if r.Status != StatusAuthenticated || r.Credentials != "bmc-smc" || r.Attempts != 3 || r.Failures != 2 || r.Manufacturer != "Supermicro" {
		t.Errorf("supermicro: %+v", r)
	}
	if smc.Locked() {
		t.Error("locked")
	}
}

func TestScanRefusesUnverifiedTLSByDefault(t *testing.T) {
	sim, a := startSim(t, "dell-poweredge-r750-idrac9", creds[0], 3)
	rep, err := Scan(context.Background(), Config{Targets: []string{a}, AllowLoopback: true, Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 1 || rep.Results[0].Status != StatusError || !strings.Contains(rep.Results[0].Error, "certificate") {
		t.Fatalf("results: %+v", rep.Results)
	}
	if n := len(sim.Requests()); n != 0 {
		t.Errorf("the BMC got %d requests over an unverified connection", n)
	}
}

func TestScanCIDRLoopbackWithPort(t *testing.T) {
	_, a := startSim(t, "dmtf-public-rackmount1", creds[1], 3)
	_, port, _ := net.SplitHostPort(a)
	var p int
	for _, c := range port {
		p = p*10 + int(c-'0')
	}
	rep, err := Scan(context.Background(), Config{CIDR: "127.0.0.1/32", Port: p, AllowLoopback: true, Credentials: creds, InsecureTLS: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Probed != 1 || len(rep.Results) != 1 || rep.Results[0].Status != StatusAuthenticated || rep.Results[0].Credentials != "bmc-hpe" {
		t.Fatalf("report: %+v", rep)
	}
	if _, err := Scan(context.Background(), Config{CIDR: "127.0.0.1/32", Port: p, Credentials: creds}); !errors.Is(err, ErrRange) {
		t.Fatalf("loopback without override: %v", err)
	}
}

func TestAddresses(t *testing.T) {
	for _, tc := range []struct {
		cidr     string
		loopback bool
		n        int
		err      error
	}{
		{"10.0.0.0/24", false, 254, nil},
		{"10.255.255.0/23", false, 510, nil},
		{"172.16.4.0/30", false, 2, nil},
		{"172.31.255.254/31", false, 2, nil},
		{"192.168.1.7/32", false, 1, nil},
		{"192.168.1.7", false, 1, nil},
		{" 192.168.1.0/28 ", false, 14, nil},
		{"192.168.1.99/24", false, 254, nil}, // host bits masked (see TestRange)
		{"10.0.0.0/22", false, 0, ErrTooLarge},
		{"10.0.0.0/8", false, 0, ErrTooLarge},
		{"172.15.255.0/24", false, 0, ErrRange},
		{"172.32.0.0/24", false, 0, ErrRange},
		{"172.0.0.0/8", false, 0, ErrRange}, // covers 172.16/12 and public space
		{"192.169.0.0/24", false, 0, ErrRange},
		{"8.8.8.0/24", false, 0, ErrRange},
		{"0.0.0.0/0", false, 0, ErrRange},
		{"169.254.0.0/24", false, 0, ErrRange},
		{"100.64.0.0/24", false, 0, ErrRange},
		{"224.0.0.0/24", false, 0, ErrRange},
		{"127.0.0.0/24", false, 0, ErrRange},
		{"127.0.0.0/24", true, 254, nil},
		{"127.0.0.0/8", true, 0, ErrTooLarge},
		{"::1/128", true, 0, ErrRange},
		{"fd00::/120", false, 0, ErrRange},
		{"::ffff:10.0.0.1/128", false, 0, ErrRange},
		{"10.0.0.0/33", false, 0, ErrRange},
		{"10.0.0.0-10.0.0.9", false, 0, ErrRange},
		{"", false, 0, ErrRange},
		{"bmc.example.com", false, 0, ErrRange},
	} {
		got, err := Addresses(tc.cidr, tc.loopback)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("%q: err %v, want %v", tc.cidr, err, tc.err)
			}
			continue
		}
		if err != nil || len(got) != tc.n {
			t.Errorf("%q: %d addresses, err %v; want %d", tc.cidr, len(got), err, tc.n)
		}
	}
}

func TestRange(t *testing.T) {
	for in, want := range map[string]string{
		"192.168.1.99/24": "192.168.1.0/24",
		"10.1.2.3/23":     "10.1.2.0/23",
		"10.1.2.3":        "10.1.2.3/32",
		" 172.16.0.9/30 ": "172.16.0.8/30",
	} {
		if got, err := Range(in, false); err != nil || got != want {
			t.Errorf("Range(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"10.0.0.0/8", "8.8.8.8/32", "127.0.0.1/32", "fd00::1/128"} {
		if got, err := Range(in, false); err == nil {
			t.Errorf("Range(%q) = %q, want an error", in, got)
		}
	}
}

// TestScanReportsCanonicalRange: a CIDR with host bits set scans the whole
// masked range, and the report says which.
func TestScanReportsCanonicalRange(t *testing.T) {
	_, a := startSim(t, "dmtf-public-rackmount1", creds[1], 3)
	_, port, _ := net.SplitHostPort(a)
	p, _ := strconv.Atoi(port)
	// 127.0.0.2/30 is 127.0.0.0/30: 127.0.0.1 (the BMC) and 127.0.0.2
	// (nothing listens there) are probed.
	rep, err := Scan(context.Background(), Config{CIDR: "127.0.0.2/30", Port: p, AllowLoopback: true, Credentials: creds, InsecureTLS: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Range != "127.0.0.0/30" || rep.Probed != 2 || len(rep.Results) != 1 || rep.Results[0].Address != "https://127.0.0.1:"+port {
		t.Fatalf("report: %+v", rep)
	}
}

// TestScanConcurrencyBound: no more than Config.Concurrency addresses are
// probed at once, and the bound is reached. The responder holds every
// request until three are in flight; a slot is freed only after its
// handler returned, so the server's in-flight count is exact.
func TestScanConcurrencyBound(t *testing.T) {
	const limit = 3
	var mu sync.Mutex
	inflight, most := 0, 0
	arrived := make(chan struct{}, 16)
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		inflight++
		most = max(most, inflight)
		mu.Unlock()
		defer func() { mu.Lock(); inflight--; mu.Unlock() }()
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(ts.Close)
	a := ts.Listener.Addr().String()
	targets := make([]string, 8)
	for i := range targets {
		targets[i] = a
	}
	done := make(chan struct{})
	var rep *Report
	var err error
	go func() {
		defer close(done)
		rep, err = Scan(context.Background(), Config{Targets: targets, AllowLoopback: true, Credentials: creds, Scheme: "http",
			Concurrency: limit, Timeout: time.Minute})
	}()
	for range limit {
		<-arrived
	}
	// A fourth request while the first three are held would be a fourth
	// probe at once. Proving that none comes takes a wait; the passing case
	// does not depend on it (the bound is a channel's capacity), it only
	// gives a broken bound time to show.
	select {
	case <-arrived:
		t.Errorf("a probe beyond the %d allowed started while %d were in flight", limit, limit)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	if most != limit {
		t.Errorf("%d probes at once, want %d", most, limit)
	}
	if rep.Probed != 8 || len(rep.Results) != 8 {
		t.Fatalf("report: %+v", rep)
	}
	for _, r := range rep.Results {
		if r.Status != StatusNotRedfish {
			t.Errorf("result: %+v", r)
		}
	}
}

func TestScanConfigRefusals(t *testing.T) {
	ctx := context.Background()
	for name, cfg := range map[string]Config{
		"no credentials":       {CIDR: "10.0.0.0/30"},
		"four credentials":     {CIDR: "10.0.0.0/30", Credentials: append(creds, Credential{Name: "x"})},
		"threshold 1":          {CIDR: "10.0.0.0/30", Credentials: creds, LockoutThreshold: 1},
		"targets without test": {Targets: []string{"127.0.0.1:1"}, Credentials: creds},
		"non-loopback target":  {Targets: []string{"10.0.0.1:443"}, AllowLoopback: true, Credentials: creds},
		"public range":         {CIDR: "1.1.1.0/24", Credentials: creds},
		"bad scheme":           {CIDR: "10.0.0.0/30", Credentials: creds, Scheme: "ftp"},
	} {
		if _, err := Scan(ctx, cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestScanCancelled(t *testing.T) {
	hang, _ := peertest.SilentListener(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var rep *Report
	var err error
	go func() {
		defer close(done)
		rep, err = Scan(ctx, Config{Targets: []string{hang, hang, hang}, AllowLoopback: true, Credentials: creds, Timeout: time.Hour, Concurrency: 1})
	}()
	cancel()
	<-done
	if !errors.Is(err, context.Canceled) || rep == nil {
		t.Fatalf("rep %+v err %v", rep, err)
	}
	if !strings.Contains(rep.Incomplete, "stopped") {
		t.Errorf("a cancelled scan's report is not marked incomplete: %+v", rep)
	}
	for _, r := range rep.Results {
		if r.Status == StatusAuthenticated {
			t.Errorf("result after cancel: %+v", r)
		}
	}
}

// TestScanBoundsNICs: a responder that lists thousands of
// EthernetInterfaces gets at most maxNICs of them read.
func TestScanBoundsNICs(t *testing.T) {
	var mu sync.Mutex
	nicReads := 0
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		p := r.URL.Path
		switch {
		case p == "/redfish/v1/":
			_, _ = w.Write([]byte(`{"RedfishVersion":"1.6.0","Systems":{"@odata.id":"/redfish/v1/Systems"}}`))
		case r.Header.Get("Authorization") == "":
			w.WriteHeader(http.StatusUnauthorized)
		case p == "/redfish/v1/Systems":
			_, _ = w.Write([]byte(`{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}]}`))
		case p == "/redfish/v1/Systems/1":
			_, _ = w.Write([]byte(`{"Id":"1","Manufacturer":"Many NICs","EthernetInterfaces":{"@odata.id":"/redfish/v1/Systems/1/EthernetInterfaces"}}`))
		case p == "/redfish/v1/Systems/1/EthernetInterfaces":
			var b strings.Builder
			b.WriteString(`{"Members":[`)
			for i := range 5000 {
				if i > 0 {
					b.WriteString(",")
				}
				b.WriteString(`{"@odata.id":"/redfish/v1/Systems/1/EthernetInterfaces/` + strconv.Itoa(i) + `"}`)
			}
			b.WriteString(`]}`)
			_, _ = w.Write([]byte(b.String()))
		case strings.HasPrefix(p, "/redfish/v1/Systems/1/EthernetInterfaces/"):
			i, _ := strconv.Atoi(strings.TrimPrefix(p, "/redfish/v1/Systems/1/EthernetInterfaces/"))
			mu.Lock()
			nicReads++
			mu.Unlock()
			_, _ = w.Write([]byte(`{"MACAddress":"02:00:00:00:` + fmt.Sprintf("%02x:%02x", i/256, i%256) + `"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(ts.Close)
	rep, err := Scan(context.Background(), Config{Targets: []string{ts.Listener.Addr().String()}, AllowLoopback: true, Credentials: creds[:1], Scheme: "http"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 1 || rep.Results[0].Status != StatusAuthenticated {
		t.Fatalf("report: %+v", rep)
	}
	if got := len(rep.Results[0].MACs); got != maxNICs || nicReads != maxNICs {
		t.Errorf("%d MACs from %d NIC reads, want %d", got, nicReads, maxNICs)
	}
}
