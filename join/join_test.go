package join_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/join/node"
	"github.com/machina-metal/machina/state"
)

// clock is a settable clock shared by the store and the listener.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	store *state.Store
	ca    *join.CA
	srv   *join.Server
	url   string
	clock *clock
}

// startListener opens a store and serves a real TLS join listener on
// 127.0.0.1:0 until the test ends.
func startListener(t *testing.T, nodeBinary string) *fixture {
	t.Helper()
	return startListenerRate(t, nodeBinary, 1000)
}

func startListenerRate(t *testing.T, nodeBinary string, rate float64) *fixture {
	t.Helper()
	return startListenerWith(t, func(c *join.Config) { c.NodeBinary, c.JoinRate = nodeBinary, rate })
}

// startListenerWith is startListener with edit applied to the Config.
func startListenerWith(t *testing.T, edit func(*join.Config)) *fixture {
	t.Helper()
	clk := &clock{t: time.Now().UTC()}
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{NoSync: true, Now: clk.Now,
		MasterKey: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ca, err := join.LoadOrCreateCA(st, clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + ln.Addr().String()
	cfg := join.Config{Store: st, CA: ca, URL: url, Now: clk.Now, Heartbeat: 10 * time.Second, JoinRate: 1000,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	edit(&cfg)
	srv, err := join.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve = %v, want nil", err)
		}
	})
	return &fixture{store: st, ca: ca, srv: srv, url: url, clock: clk}
}

func (f *fixture) token(t *testing.T, req v1.EnrolmentRequest) v1.EnrolmentToken {
	t.Helper()
	tok, err := f.srv.IssueToken(req, "test")
	if err != nil {
		t.Fatalf("IssueToken: %v", err)
	}
	return tok
}

func facts(name string) v1.HostFacts {
	return v1.HostFacts{Hostname: name, CPUFlags: []string{"vmx"}, KVM: false, MemoryBytes: 8 << 30}
}

func TestCAPersistsAndIsSealed(t *testing.T) {
	dir := t.TempDir()
	key := []byte("0123456789abcdef0123456789abcdef")
	st, err := state.Open(filepath.Join(dir, "s.db"), state.Options{MasterKey: key, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	ca1, err := join.LoadOrCreateCA(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := st.CA()
	if err != nil || !rec.Sealed {
		t.Fatalf("CA() sealed = %v, %v; want sealed", rec.Sealed, err)
	}
	st.Close()
	// Without the master key the sealed CA key cannot be read.
	st2, err := state.Open(filepath.Join(dir, "s.db"), state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := join.LoadOrCreateCA(st2, nil); !errors.Is(err, state.ErrMasterKeyRequired) {
		t.Fatalf("LoadOrCreateCA without key = %v, want ErrMasterKeyRequired", err)
	}
	st2.Close()
	st3, err := state.Open(filepath.Join(dir, "s.db"), state.Options{MasterKey: key, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st3.Close()
	ca2, err := join.LoadOrCreateCA(st3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ca1.Fingerprint() != ca2.Fingerprint() {
		t.Fatalf("CA changed across restarts: %s vs %s", ca1.Fingerprint(), ca2.Fingerprint())
	}
	if ca1.Cert.PublicKeyAlgorithm != x509.ECDSA || !ca1.Cert.IsCA {
		t.Fatalf("CA algorithm %v IsCA %v, want ECDSA CA", ca1.Cert.PublicKeyAlgorithm, ca1.Cert.IsCA)
	}
}

func TestJoinHeartbeatRejoin(t *testing.T) {
	f := startListener(t, "")
	tok := f.token(t, v1.EnrolmentRequest{Site: "lab1", Rack: "r1", Tags: []string{"kvm", "nvme"}, Server: "r1-n01",
		Require: []string{"virt"}})
	dir := t.TempDir()
	resp, err := node.Join(t.Context(), node.JoinConfig{URL: tok.JoinURL, Fingerprint: tok.CAFingerprint, Token: tok.Token, Dir: dir, Facts: facts("hv1")})
	if err != nil {
		t.Fatalf("Join: %v", err)
	}
	if resp.Host != "hv1" || len(resp.Checks) != 4 {
		t.Fatalf("Join = host %q, %d checks; want hv1, 4", resp.Host, len(resp.Checks))
	}
	h, err := f.store.Host("hv1")
	if err != nil {
		t.Fatal(err)
	}
	if h.Site != "lab1" || h.Rack != "r1" || strings.Join(h.Tags, ",") != "kvm,nvme" || h.Server != "r1-n01" || h.JoinStatus != "joined" {
		t.Fatalf("host = %+v, want site lab1 rack r1 tags kvm,nvme server r1-n01 joined", h)
	}
	// The certificate is for the host and chains to the CA.
	blk, _ := pem.Decode([]byte(resp.Certificate))
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: f.ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil || cert.Subject.CommonName != "hv1" {
		t.Fatalf("node cert CN %q verify %v", cert.Subject.CommonName, err)
	}
	if h.CertFingerprint != join.CertFingerprint(cert.Raw) {
		t.Fatalf("recorded fingerprint %s, want %s", h.CertFingerprint, join.CertFingerprint(cert.Raw))
	}
	// Every check is in the join log; kvm failed but was not required.
	log, _ := f.store.JoinLog("hv1")
	var text []string
	for _, e := range log {
		text = append(text, e.Level+" "+e.Message)
	}
	all := strings.Join(text, "\n")
	for _, want := range []string{"check hostname passed", "check virt passed", "warn check kvm failed (not required): /dev/kvm missing", "check memory passed", "node certificate issued"} {
		if !strings.Contains(all, want) {
			t.Errorf("join log lacks %q:\n%s", want, all)
		}
	}
	// Heartbeat over mutual TLS: the host goes online.
	c, err := node.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	c.Version = "v-test"
	if err := c.Beat(t.Context()); err != nil {
		t.Fatalf("Beat: %v", err)
	}
	// The heartbeat carries this host's /proc/uptime and the agent's
	// version and start.
	if hb, _ := f.store.Host("hv1"); hb.AgentVersion != "v-test" || hb.BootedAt.IsZero() || hb.Uptime <= 0 || hb.AgentProcessStart.IsZero() {
		t.Fatalf("after a heartbeat host = %+v, want agent version, boot time, uptime and agent start", hb)
	}
	views := f.srv.HostViews(mustHosts(t, f.store))
	if len(views) != 1 || !views[0].Online {
		t.Fatalf("host views = %+v, want hv1 online", views)
	}
	f.clock.Add(31 * time.Second) // > 3 heartbeats of 10s
	if views := f.srv.HostViews(mustHosts(t, f.store)); views[0].Online {
		t.Fatal("host still online 31s after its last heartbeat (interval 10s)")
	}
	// Without a client certificate the node endpoints refuse.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.ca.Pool()}}}
	r, err := hc.Post(f.url+"/hosts/hv1/heartbeat", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusForbidden {
		t.Fatalf("heartbeat without client cert = %d, want 403", r.StatusCode)
	}
	// Re-join with a fresh token (idempotent): same record, new certificate;
	// the old certificate is retired.
	tok2 := f.token(t, v1.EnrolmentRequest{Site: "lab1", Rack: "r1", Tags: []string{"kvm", "nvme"}})
	dir2 := t.TempDir()
	if _, err := node.Join(t.Context(), node.JoinConfig{URL: tok2.JoinURL, Fingerprint: tok2.CAFingerprint, Token: tok2.Token, Dir: dir2, Facts: facts("hv1")}); err != nil {
		t.Fatalf("re-join: %v", err)
	}
	hosts := mustHosts(t, f.store)
	if len(hosts) != 1 || hosts[0].Server != "r1-n01" || hosts[0].CertFingerprint == h.CertFingerprint {
		t.Fatalf("after re-join hosts = %+v", hosts)
	}
	var re *node.RefusedError
	if err := c.Beat(t.Context()); !errors.As(err, &re) || re.Status != http.StatusForbidden {
		t.Fatalf("heartbeat with retired cert = %v, want 403", err)
	}
	c2, _ := node.Load(dir2)
	if err := c2.Beat(t.Context()); err != nil {
		t.Fatalf("heartbeat with new cert: %v", err)
	}
	// A re-join that fails a required check marks the host failed but
	// keeps the certificate of the last good join.
	tok3 := f.token(t, v1.EnrolmentRequest{Require: []string{"kvm"}})
	_, err = node.Join(t.Context(), node.JoinConfig{URL: tok3.JoinURL, Fingerprint: tok3.CAFingerprint, Token: tok3.Token, Dir: t.TempDir(), Facts: facts("hv1")})
	if !errors.As(err, &re) || re.Body.Code != join.CodeChecksFailed {
		t.Fatalf("re-join without /dev/kvm = %v, want checks_failed", err)
	}
	if h, _ := f.store.Host("hv1"); h.JoinStatus != "failed" || h.CertFingerprint != hosts[0].CertFingerprint {
		t.Fatalf("after failed re-join host = %+v", h)
	}
	if err := c2.Beat(t.Context()); err != nil {
		t.Fatalf("heartbeat after a failed re-join: %v", err)
	}
}

func mustHosts(t *testing.T, st *state.Store) []state.Host {
	t.Helper()
	hs, err := st.Hosts()
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

func csrPEM(t *testing.T, key any) string {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

func postJoin(t *testing.T, f *fixture, req v1.JoinRequest) (int, v1.Error) {
	t.Helper()
	return postJoinFrom(t, f, "127.0.0.1", req)
}

// postJoinFrom posts from the loopback source address src (any of
// 127.0.0.0/8 on Linux).
func postJoinFrom(t *testing.T, f *fixture, src string, req v1.JoinRequest) (int, v1.Error) {
	t.Helper()
	code, e, err := tryJoinFrom(f, src, req)
	if err != nil {
		t.Fatal(err)
	}
	return code, e
}

// tryJoinFrom is postJoinFrom returning a transport error (a connection
// the listener closed at accept) instead of failing the test.
func tryJoinFrom(f *fixture, src string, req v1.JoinRequest) (int, v1.Error, error) {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: node.PinnedTLS(f.ca.Fingerprint(), "127.0.0.1"), DialContext: d.DialContext}}
	data, _ := json.Marshal(req)
	r, err := hc.Post(f.url+"/hosts/join", "application/json", strings.NewReader(string(data)))
	if err != nil {
		return 0, v1.Error{}, err
	}
	defer r.Body.Close()
	var e v1.Error
	_ = json.NewDecoder(r.Body).Decode(&e)
	return r.StatusCode, e, nil
}

func TestJoinRefusals(t *testing.T) {
	f := startListener(t, "")
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)

	t.Run("wrong CA", func(t *testing.T) {
		other := startListener(t, "")
		tok := f.token(t, v1.EnrolmentRequest{})
		_, err := node.Join(t.Context(), node.JoinConfig{URL: f.url, Fingerprint: other.ca.Fingerprint(), Token: tok.Token, Dir: t.TempDir(), Facts: facts("a1")})
		if !errors.Is(err, node.ErrPinMismatch) {
			t.Fatalf("Join with another CA's fingerprint = %v, want ErrPinMismatch", err)
		}
		if !strings.Contains(err.Error(), "does not match the pinned fingerprint") {
			t.Errorf("error %q is not clear", err)
		}
		// The token was never presented, so it still works.
		if _, err := node.Join(t.Context(), node.JoinConfig{URL: f.url, Fingerprint: f.ca.Fingerprint(), Token: tok.Token, Dir: t.TempDir(), Facts: facts("a1")}); err != nil {
			t.Fatalf("Join with the right CA: %v", err)
		}
	})
	t.Run("reused token", func(t *testing.T) {
		tok := f.token(t, v1.EnrolmentRequest{})
		cfg := node.JoinConfig{URL: f.url, Fingerprint: f.ca.Fingerprint(), Token: tok.Token, Dir: t.TempDir(), Facts: facts("a2")}
		if _, err := node.Join(t.Context(), cfg); err != nil {
			t.Fatal(err)
		}
		_, err := node.Join(t.Context(), cfg)
		var re *node.RefusedError
		if !errors.As(err, &re) || re.Body.Code != join.CodeTokenUsed || !strings.Contains(err.Error(), "already used") {
			t.Fatalf("second Join = %v, want 401 token_used", err)
		}
	})
	t.Run("expired token", func(t *testing.T) {
		tok := f.token(t, v1.EnrolmentRequest{TTL: "1m"})
		f.clock.Add(2 * time.Minute)
		_, err := node.Join(t.Context(), node.JoinConfig{URL: f.url, Fingerprint: f.ca.Fingerprint(), Token: tok.Token, Dir: t.TempDir(), Facts: facts("a3")})
		var re *node.RefusedError
		if !errors.As(err, &re) || re.Status != 401 || re.Body.Code != join.CodeTokenExpired {
			t.Fatalf("Join with expired token = %v, want 401 token_expired", err)
		}
	})
	t.Run("unknown token", func(t *testing.T) {
		code, e := postJoin(t, f, v1.JoinRequest{Token: "mj_nope", CSR: csrPEM(t, p256), Facts: facts("a4")})
		if code != 401 || e.Code != join.CodeTokenUnknown {
			t.Fatalf("unknown token = %d %+v", code, e)
		}
	})
	for name, csr := range map[string]string{
		"bad CSR garbage":     "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
		"bad CSR not PEM":     "hello",
		"bad CSR weak curve":  csrPEM(t, p224),
		"bad CSR wrong block": strings.Replace(csrPEM(t, p256), "CERTIFICATE REQUEST", "CERTIFICATE", 2),
	} {
		t.Run(name, func(t *testing.T) {
			tok := f.token(t, v1.EnrolmentRequest{})
			code, e := postJoin(t, f, v1.JoinRequest{Token: tok.Token, CSR: csr, Facts: facts("a5")})
			if code != 400 || e.Code != join.CodeBadCSR || !strings.Contains(e.Message, "bad certificate signing request") {
				t.Fatalf("join with %s = %d %+v, want 400 bad_csr", name, code, e)
			}
			// A bad CSR does not burn the token.
			if code, e := postJoin(t, f, v1.JoinRequest{Token: tok.Token, CSR: csrPEM(t, p256), Facts: facts("a5")}); code != 200 {
				t.Fatalf("join after bad CSR = %d %+v, want 200", code, e)
			}
		})
	}
	t.Run("required check fails", func(t *testing.T) {
		tok := f.token(t, v1.EnrolmentRequest{Require: []string{"kvm", "memory"}, MinMemoryBytes: 16 << 30})
		_, err := node.Join(t.Context(), node.JoinConfig{URL: f.url, Fingerprint: f.ca.Fingerprint(), Token: tok.Token, Dir: t.TempDir(), Facts: facts("a6")})
		var re *node.RefusedError
		if !errors.As(err, &re) || re.Body.Code != join.CodeChecksFailed || !strings.Contains(re.Body.Message, "kvm, memory") {
			t.Fatalf("Join = %v, want 403 checks_failed naming kvm, memory", err)
		}
		h, err := f.store.Host("a6")
		if err != nil || h.JoinStatus != "failed" || h.CertFingerprint != "" {
			t.Fatalf("host a6 = %+v, %v; want failed without certificate", h, err)
		}
	})
	t.Run("token bound to another host", func(t *testing.T) {
		tok := f.token(t, v1.EnrolmentRequest{Host: "b1"})
		_, err := node.Join(t.Context(), node.JoinConfig{URL: f.url, Fingerprint: f.ca.Fingerprint(), Token: tok.Token, Dir: t.TempDir(), Facts: facts("b2")})
		var re *node.RefusedError
		if !errors.As(err, &re) || re.Body.Code != join.CodeTokenHost {
			t.Fatalf("Join = %v, want 403 token_host", err)
		}
	})
}

func TestConcurrentJoinsOneTokenOneWinner(t *testing.T) {
	f := startListener(t, "")
	tok := f.token(t, v1.EnrolmentRequest{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := node.Join(context.Background(), node.JoinConfig{URL: f.url, Fingerprint: f.ca.Fingerprint(), Token: tok.Token,
				Dir: t.TempDir(), Facts: facts("c" + string(rune('0'+i)))})
			if err == nil {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ok != 1 {
		t.Fatalf("%d joins succeeded with one single-use token, want 1", ok)
	}
}

func TestIssueTokenValidation(t *testing.T) {
	f := startListener(t, "")
	for name, req := range map[string]v1.EnrolmentRequest{
		"ttl too long":  {TTL: "200h"},
		"ttl garbage":   {TTL: "soon"},
		"bad site":      {Site: "Lab 1"},
		"bad tag":       {Tags: []string{"a b"}},
		"bad vlan":      {Networks: []v1.JoinNetwork{{Name: "n", Bridge: "br0", NIC: "eth0", VLAN: 4095}}},
		"bad nic":       {Networks: []v1.JoinNetwork{{Name: "n", Bridge: "br0", NIC: "-eth0"}}},
		"long bridge":   {Networks: []v1.JoinNetwork{{Name: "n", Bridge: "bridge-too-long-x", NIC: "eth0"}}},
		"dir in /etc":   {Pools: []v1.JoinPool{{Name: "p", Type: "dir", Path: "/etc/pool"}}},
		"dir relative":  {Pools: []v1.JoinPool{{Name: "p", Type: "dir", Path: "var/pool"}}},
		"dir dotdot":    {Pools: []v1.JoinPool{{Name: "p", Type: "dir", Path: "/srv/../etc"}}},
		"lvm option":    {Pools: []v1.JoinPool{{Name: "-vg", Type: "lvm", Disks: []string{"/dev/sdb"}}}},
		"lvm disk path": {Pools: []v1.JoinPool{{Name: "vg0", Type: "lvm", Disks: []string{"/dev/../etc/passwd"}}}},
		"lvm no disks":  {Pools: []v1.JoinPool{{Name: "vg0", Type: "lvm"}}},
		"require bogus": {Require: []string{"gpu"}},
	} {
		if _, err := f.srv.IssueToken(req, "t"); err == nil {
			t.Errorf("IssueToken(%s) = nil error, want refusal", name)
		}
	}
}

func TestDeployEnrolmentFromProfile(t *testing.T) {
	f := startListener(t, "")
	p := inventory.Profile{Name: "hypervisor", Min: inventory.Min{MemoryGiB: 32}, Join: inventory.Join{Site: "lab1", Tags: []string{"kvm"},
		Require:      []string{"virt", "memory"},
		Networks:     []inventory.Network{{Name: "prod", Bridge: "br-prod", NIC: "eno1", VLAN: 20}},
		StoragePools: []inventory.StoragePool{{Name: "vg0", Type: "lvm", Disks: []string{"/dev/nvme1n1"}}}}}
	s := inventory.Server{Name: "r1-n01", Site: "other", Rack: "r1", Tags: []string{"nvme", "kvm"}}
	req := join.DeployEnrolment(p, s, 45*time.Minute)
	tok := f.token(t, req)
	// Bound to the server's name: another host cannot use it.
	_, err := node.Join(t.Context(), node.JoinConfig{URL: f.url, Fingerprint: tok.CAFingerprint, Token: tok.Token, Dir: t.TempDir(), Facts: facts("r1-n02")})
	var re *node.RefusedError
	if !errors.As(err, &re) || re.Body.Code != join.CodeTokenHost {
		t.Fatalf("other host = %v, want token_host", err)
	}
	tok = f.token(t, req)
	fa := facts("r1-n01")
	fa.MemoryBytes = 31 << 30 // MemTotal of a 32 GiB machine
	dir := t.TempDir()
	resp, err := node.Join(t.Context(), node.JoinConfig{URL: f.url, Fingerprint: tok.CAFingerprint, Token: tok.Token, Dir: dir, Facts: fa})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Networks) != 1 || resp.Networks[0].VLAN != 20 || len(resp.Pools) != 1 || resp.Pools[0].Disks[0] != "/dev/nvme1n1" {
		t.Fatalf("join response networks %+v pools %+v", resp.Networks, resp.Pools)
	}
	h, _ := f.store.Host("r1-n01")
	if h.Site != "lab1" || h.Rack != "r1" || strings.Join(h.Tags, ",") != "nvme,kvm" || h.Server != "r1-n01" || h.JoinStatus != "joining" {
		t.Fatalf("host = %+v", h)
	}
	// The node reports its steps and outcome over mutual TLS; a failed
	// step marks the join failed with the reason.
	c, err := node.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Step(t.Context(), v1.JoinStep{Step: "network prod", OK: true, Message: "created bridge br-prod"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Step(t.Context(), v1.JoinStep{Step: "pool vg0", OK: false, Message: "vgcreate: no such device"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Done(t.Context(), v1.JoinDone{OK: false, Reason: "pool vg0: vgcreate: no such device"}); err != nil {
		t.Fatal(err)
	}
	h, _ = f.store.Host("r1-n01")
	if strings.Join(h.Networks, ",") != "prod" || len(h.StoragePools) != 0 {
		t.Fatalf("applied networks %v pools %v, want [prod] and none", h.Networks, h.StoragePools)
	}
	if h.JoinStatus != "failed" || h.JoinReason != "pool vg0: vgcreate: no such device" || h.LastSeen.IsZero() {
		t.Fatalf("host after failed step = %+v", h)
	}
	log, _ := f.store.JoinLog("r1-n01")
	last := log[len(log)-1]
	if last.Level != "error" || last.Message != "join failed: pool vg0: vgcreate: no such device" || log[len(log)-2].Step != "pool vg0" {
		t.Fatalf("join log tail = %+v", log[len(log)-3:])
	}
}

// TestJoinRateLimitPerSource: callers flooding /hosts/join from other
// addresses do not keep a holder of a valid token at 429 (before the fix
// one bucket was shared by every caller: two clients at about 80
// requests/s kept every legitimate join out).
func TestJoinRateLimitPerSource(t *testing.T) {
	f := startListenerRate(t, "", 0.25)
	for i := range 40 { // a bounded flood from two other addresses
		src := []string{"127.0.0.2", "127.0.0.3"}[i%2]
		if code, _ := postJoinFrom(t, f, src, v1.JoinRequest{Token: "bogus", Facts: facts("x1")}); i >= 2 && code != 429 {
			t.Fatalf("flood request %d from %s = %d, want 429", i, src, code)
		}
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tok := f.token(t, v1.EnrolmentRequest{})
	if code, e := postJoinFrom(t, f, "127.0.0.4", v1.JoinRequest{Token: tok.Token, CSR: csrPEM(t, key), Facts: facts("r1")}); code != 200 {
		t.Fatalf("join from a quiet address during the flood = %d %+v, want 200", code, e)
	}
}

func TestJoinRateLimited(t *testing.T) {
	f := startListenerRate(t, "", 0.25) // burst 1, one more every 4s of the fake clock
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tok := f.token(t, v1.EnrolmentRequest{})
	if code, e := postJoin(t, f, v1.JoinRequest{Token: tok.Token, CSR: csrPEM(t, key), Facts: facts("r1")}); code != 200 {
		t.Fatalf("first join = %d %+v", code, e)
	}
	tok2 := f.token(t, v1.EnrolmentRequest{})
	if code, e := postJoin(t, f, v1.JoinRequest{Token: tok2.Token, CSR: csrPEM(t, key), Facts: facts("r2")}); code != 429 || e.Code != join.CodeRateLimited {
		t.Fatalf("second join at once = %d %+v, want 429 rate_limited", code, e)
	}
	f.clock.Add(4 * time.Second)
	if code, e := postJoin(t, f, v1.JoinRequest{Token: tok2.Token, CSR: csrPEM(t, key), Facts: facts("r2")}); code != 200 {
		t.Fatalf("join after refill = %d %+v (a rate-limited request must not burn the token)", code, e)
	}
}
