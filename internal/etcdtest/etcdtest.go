// Package etcdtest starts a real etcd cluster for tests: Debian's
// etcd-server (the `etcd` binary, 3.4 on Debian 12), one or three members on
// loopback TCP ports, each with its data directory under t.TempDir(), plain
// or with TLS and client certificates (a throwaway CA made in the test).
// Start waits until every member answers and the cluster has a leader, and
// returns the client endpoints; each Member can be stopped (SIGTERM),
// killed (SIGKILL) and restarted on the same ports and data, always by its
// own PID. t.Cleanup kills every member still running, by PID.
//
// A missing etcd binary fails the test through internal/peertest, naming the
// Debian package etcd-server (skips only in the quick mode).
//
// Every member listens on 127.0.0.1 (TCP, not unix sockets: the product
// talks TCP to etcd, so the tests do too), on ports picked free just before
// the start; a port taken in between (another test on the shared machine)
// makes the start fail, and Start retries with new ports and folders.
//
// Test helper only: no product package may import it.
package etcdtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/machina-metal/machina/internal/peertest"
)

// Options says what cluster Start makes. The zero value is one plain member.
type Options struct {
	// Members is 1 or 3 (0 means 1). Other counts work too but tests use these.
	Members int
	// TLS serves clients and peers over TLS with a CA made for the test;
	// clients must present a certificate signed by it (--client-cert-auth).
	TLS bool
	// StartTimeout bounds the wait for a healthy cluster (0: 60 s, etcd on a
	// loaded 2-core machine needs a few seconds per member).
	StartTimeout time.Duration
}

// TLSFiles are the PEM files of a TLS cluster, under the test's temporary
// folder: the CA that signed every certificate, and a client certificate
// with its key (ExtKeyUsageClientAuth) that the members accept.
type TLSFiles struct {
	CAFile, CertFile, KeyFile string
}

// Cluster is a running etcd cluster.
type Cluster struct {
	fatalf  func(format string, args ...any)
	bin     string
	root    string
	tls     *TLSFiles
	members []*Member
}

// Member is one etcd process of a Cluster.
type Member struct {
	c         *Cluster
	Name      string
	ClientURL string // e.g. http://127.0.0.1:41234 (https:// with TLS)
	PeerURL   string
	DataDir   string
	LogFile   string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// Start starts a cluster and waits until it is healthy; it ends t on failure
// (with the tail of each member's log).
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	bin := peertest.Command(t, "etcd")
	n := opts.Members
	if n <= 0 {
		n = 1
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	c := &Cluster{fatalf: t.Fatalf, bin: bin, root: t.TempDir()}
	t.Cleanup(c.killAll)
	if err := c.start(n, opts.TLS, timeout); err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	return c
}

// start makes the TLS files and starts n members, retrying on a port clash.
func (c *Cluster) start(n int, withTLS bool, timeout time.Duration) error {
	if withTLS {
		files, err := writeTLS(filepath.Join(c.root, "tls"))
		if err != nil {
			return fmt.Errorf("make TLS files: %v", err)
		}
		c.tls = files
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		c.killAll()
		if err := c.layout(n, attempt); err != nil {
			return err
		}
		for _, m := range c.members {
			if err := m.start("new"); err != nil {
				return fmt.Errorf("start %s: %v", m.Name, err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		lastErr = c.waitHealthy(ctx, c.members)
		cancel()
		if lastErr == nil {
			return nil
		}
		if !c.portClash() {
			break
		}
	}
	c.killAll()
	return fmt.Errorf("cluster of %d not healthy: %v\n%s", n, lastErr, c.logTails())
}

var shared struct {
	mu     sync.Mutex
	inMain bool // Main is running the tests: it will end the clusters
	c      map[Options]*Cluster
	errs   map[Options]error
	dirs   []string
}

// Shared returns a cluster started once per test binary for opts (the
// first caller starts it; later callers with the same opts share it), for
// packages whose tests each use their own key prefix. It lives until Main's
// m.Run returns; tests must not stop or restart its members (use Start
// for that). A missing etcd fails t through peertest.
func Shared(t testing.TB, opts Options) *Cluster {
	t.Helper()
	bin := peertest.Command(t, "etcd")
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.inMain {
		t.Fatalf("etcdtest: Shared needs the package's TestMain to call os.Exit(etcdtest.Main(m)), which ends the shared clusters")
	}
	if c, ok := shared.c[opts]; ok {
		return c
	}
	if err, ok := shared.errs[opts]; ok {
		t.Fatalf("etcdtest: shared cluster: %v", err)
	}
	if shared.c == nil {
		shared.c, shared.errs = map[Options]*Cluster{}, map[Options]error{}
	}
	root, err := os.MkdirTemp("", "etcdtest-shared-")
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	shared.dirs = append(shared.dirs, root)
	n, timeout := opts.Members, opts.StartTimeout
	if n <= 0 {
		n = 1
	}
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	c := &Cluster{fatalf: func(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }, bin: bin, root: root}
	if err := c.start(n, opts.TLS, timeout); err != nil {
		shared.errs[opts] = err
		t.Fatalf("etcdtest: shared cluster: %v", err)
	}
	shared.c[opts] = c
	return c
}

// Main runs m and then kills every Shared cluster (by PID) and removes its
// folder; a package that uses Shared calls it from TestMain:
// os.Exit(etcdtest.Main(m)).
func Main(m *testing.M) int {
	shared.mu.Lock()
	shared.inMain = true
	shared.mu.Unlock()
	code := m.Run()
	shared.mu.Lock()
	shared.inMain = false
	defer shared.mu.Unlock()
	for _, c := range shared.c {
		c.killAll()
	}
	for _, d := range shared.dirs {
		_ = os.RemoveAll(d)
	}
	shared.c, shared.errs, shared.dirs = nil, nil, nil
	return code
}

// layout picks ports and folders for n members (a new data folder per attempt).
func (c *Cluster) layout(n, attempt int) error {
	scheme := "http"
	if c.tls != nil {
		scheme = "https"
	}
	c.members = nil
	// Every port is held open until all are picked: a port closed at
	// once can be handed out again by the next pick (the kernel reuses a
	// just-freed ephemeral port), and two members on one port never start.
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	pick := func() (int, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		held = append(held, l)
		return l.Addr().(*net.TCPAddr).Port, nil
	}
	for i := 0; i < n; i++ {
		cp, err := pick()
		if err != nil {
			return err
		}
		pp, err := pick()
		if err != nil {
			return err
		}
		name := fmt.Sprintf("m%d", i)
		dir := filepath.Join(c.root, fmt.Sprintf("%s-%d", name, attempt))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		c.members = append(c.members, &Member{
			c:         c,
			Name:      name,
			ClientURL: fmt.Sprintf("%s://127.0.0.1:%d", scheme, cp),
			PeerURL:   fmt.Sprintf("%s://127.0.0.1:%d", scheme, pp),
			DataDir:   filepath.Join(dir, "data"),
			LogFile:   filepath.Join(dir, "etcd.log"),
		})
	}
	return nil
}

func (c *Cluster) initialCluster() string {
	var parts []string
	for _, m := range c.members {
		parts = append(parts, m.Name+"="+m.PeerURL)
	}
	return strings.Join(parts, ",")
}

// args returns the command line of m (no secret in it: TLS keys are files).
func (m *Member) args(state string) []string {
	a := []string{
		"--name", m.Name,
		"--data-dir", m.DataDir,
		"--listen-client-urls", m.ClientURL,
		"--advertise-client-urls", m.ClientURL,
		"--listen-peer-urls", m.PeerURL,
		"--initial-advertise-peer-urls", m.PeerURL,
		"--initial-cluster", m.c.initialCluster(),
		"--initial-cluster-state", state,
		"--initial-cluster-token", "etcdtest",
		"--logger", "zap",
		"--log-outputs", m.LogFile,
		"--heartbeat-interval", "100",
		"--election-timeout", "1000",
		"--snapshot-count", "10000",
	}
	if tf := m.c.tls; tf != nil {
		a = append(a,
			"--cert-file", filepath.Join(filepath.Dir(tf.CAFile), "server.pem"),
			"--key-file", filepath.Join(filepath.Dir(tf.CAFile), "server-key.pem"),
			"--trusted-ca-file", tf.CAFile,
			"--client-cert-auth",
			"--peer-cert-file", filepath.Join(filepath.Dir(tf.CAFile), "server.pem"),
			"--peer-key-file", filepath.Join(filepath.Dir(tf.CAFile), "server-key.pem"),
			"--peer-trusted-ca-file", tf.CAFile,
			"--peer-client-cert-auth",
		)
	}
	return a
}

func (m *Member) start(state string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return fmt.Errorf("already running (pid %d)", m.cmd.Process.Pid)
	}
	cmd := exec.Command(m.c.bin, m.args(state)...)
	// etcd writes its log to LogFile; stderr catches what comes before
	// the logger is set up (bad flags).
	errf, err := os.OpenFile(m.LogFile+".stderr", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = errf, errf
	// A test binary killed by its -timeout leaves no etcd behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Env = os.Environ()
	if runtime.GOARCH != "amd64" {
		// etcd 3.4 refuses to start on an architecture it does not
		// support officially (arm64 came in 3.5) unless told so.
		cmd.Env = append(cmd.Env, "ETCD_UNSUPPORTED_ARCH="+runtime.GOARCH)
	}
	if err := cmd.Start(); err != nil {
		errf.Close()
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		errf.Close()
		close(done)
	}()
	m.cmd, m.done = cmd, done
	return nil
}

// PID returns the process id of m, or 0 when it is not running.
func (m *Member) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

// Running reports whether m's process is alive.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return false
	}
	select {
	case <-m.done:
		return false
	default:
		return true
	}
}

// Stop ends m with SIGTERM (a clean shutdown) and waits for it, up to 10 s,
// then SIGKILLs it. Stopping a stopped member is a no-op.
func (m *Member) Stop() { m.signal(syscall.SIGTERM, 10*time.Second) }

// Kill ends m with SIGKILL (a crash) and waits for it.
func (m *Member) Kill() { m.signal(syscall.SIGKILL, 10*time.Second) }

// Pause stops m with SIGSTOP (a frozen process: its ports stay open but it
// answers nothing); Resume continues it.
func (m *Member) Pause() error { return m.sendOnly(syscall.SIGSTOP) }

// Resume continues a member paused with Pause.
func (m *Member) Resume() error { return m.sendOnly(syscall.SIGCONT) }

func (m *Member) sendOnly(sig syscall.Signal) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return errors.New("etcdtest: member not running")
	}
	return syscall.Kill(m.cmd.Process.Pid, sig)
}

func (m *Member) signal(sig syscall.Signal, wait time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return
	}
	pid := m.cmd.Process.Pid
	select {
	case <-m.done:
	default:
		_ = syscall.Kill(pid, syscall.SIGCONT) // a paused member must see the signal
		_ = syscall.Kill(pid, sig)
		select {
		case <-m.done:
		case <-time.After(wait):
			_ = syscall.Kill(pid, syscall.SIGKILL)
			<-m.done
		}
	}
	m.cmd, m.done = nil, nil
}

// Restart starts a stopped or killed m again on the same ports and data
// folder and waits until the cluster is healthy with it (up to 60 s). It
// ends the test on failure.
func (m *Member) Restart() {
	m.Kill() // no-op when not running
	if err := m.start("existing"); err != nil {
		m.c.fatalf("etcdtest: restart %s: %v", m.Name, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := m.c.waitHealthy(ctx, []*Member{m}); err != nil {
		m.c.fatalf("etcdtest: restarted %s not healthy: %v\n%s", m.Name, err, m.c.logTails())
	}
}

// Members returns the members, in start order.
func (c *Cluster) Members() []*Member { return c.members }

// Member returns member i.
func (c *Cluster) Member(i int) *Member { return c.members[i] }

// Endpoints returns every member's client URL.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.members {
		out = append(out, m.ClientURL)
	}
	return out
}

// TLS returns the PEM files of a TLS cluster, or nil for a plain one.
func (c *Cluster) TLS() *TLSFiles { return c.tls }

// TLSConfig returns the client TLS configuration of a TLS cluster (the CA as
// root, the client certificate), or nil for a plain one.
func (c *Cluster) TLSConfig() *tls.Config {
	if c.tls == nil {
		return nil
	}
	cfg, err := c.tls.ClientConfig()
	if err != nil {
		c.fatalf("etcdtest: %v", err)
		return nil
	}
	return cfg
}

// ClientConfig loads the files as a client tls.Config.
func (f *TLSFiles) ClientConfig() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		return nil, err
	}
	pemCA, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemCA) {
		return nil, fmt.Errorf("no certificate in %s", f.CAFile)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// Config returns a clientv3.Config for the cluster's endpoints (with TLS
// when the cluster has it) and a 5 s dial timeout.
func (c *Cluster) Config() clientv3.Config {
	return clientv3.Config{
		Endpoints:   c.Endpoints(),
		TLS:         c.TLSConfig(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	}
}

// Client returns a client of the cluster, closed by t.Cleanup.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(c.Config())
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// waitHealthy waits until every member of ms answers a status request and
// sees a leader, and a linearizable read through the cluster succeeds.
func (c *Cluster) waitHealthy(ctx context.Context, ms []*Member) error {
	cfg := c.Config()
	var lastErr error
	for {
		lastErr = c.checkOnce(ctx, cfg, ms)
		if lastErr == nil {
			return nil
		}
		for _, m := range ms {
			if !m.Running() {
				return fmt.Errorf("%s exited: %v", m.Name, lastErr)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), lastErr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) checkOnce(ctx context.Context, cfg clientv3.Config, ms []*Member) error {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	cfg.Context = cctx
	cli, err := clientv3.New(cfg)
	if err != nil {
		return err
	}
	defer cli.Close()
	for _, m := range ms {
		st, err := cli.Status(cctx, m.ClientURL)
		if err != nil {
			return fmt.Errorf("status %s: %w", m.Name, err)
		}
		if st.Leader == 0 {
			return fmt.Errorf("%s sees no leader", m.Name)
		}
	}
	if _, err := cli.Get(cctx, "etcdtest-health"); err != nil {
		return fmt.Errorf("linearizable read: %w", err)
	}
	return nil
}

// portClash reports whether a member's log says a port was taken.
func (c *Cluster) portClash() bool {
	for _, m := range c.members {
		for _, f := range []string{m.LogFile, m.LogFile + ".stderr"} {
			b, _ := os.ReadFile(f)
			if strings.Contains(string(b), "address already in use") {
				return true
			}
		}
	}
	return false
}

func (c *Cluster) logTails() string {
	var b strings.Builder
	for _, m := range c.members {
		for _, f := range []string{m.LogFile + ".stderr", m.LogFile} {
			data, _ := os.ReadFile(f)
			s := string(data)
			if len(s) > 3000 {
				s = "..." + s[len(s)-3000:]
			}
			fmt.Fprintf(&b, "--- %s %s:\n%s\n", m.Name, filepath.Base(f), s)
		}
	}
	return b.String()
}

func (c *Cluster) killAll() {
	for _, m := range c.members {
		m.Kill()
	}
}

// writeTLS makes a CA, a server certificate for 127.0.0.1 and localhost
// (server and client auth: members are each other's clients) and a client
// certificate, as PEM files under dir.
func writeTLS(dir string) (*TLSFiles, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "etcdtest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	issue := func(serial int64, cn string, usage []x509.ExtKeyUsage, certFile, keyFile string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  usage,
			IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
			DNSNames:     []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			return err
		}
		return os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	}
	files := &TLSFiles{
		CAFile:   filepath.Join(dir, "ca.pem"),
		CertFile: filepath.Join(dir, "client.pem"),
		KeyFile:  filepath.Join(dir, "client-key.pem"),
	}
	if err := os.WriteFile(files.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		return nil, err
	}
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	if err := issue(2, "etcdtest member", both, filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")); err != nil {
		return nil, err
	}
	if err := issue(3, "etcdtest client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, files.CertFile, files.KeyFile); err != nil {
		return nil, err
	}
	return files, nil
}
