package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/state"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// joinLab is a controller on loopback: state, CA, the TLS join listener
// serving a freshly built machina-node, and the admin API with the join
// routes, plus an admin token in MACHINA_TOKEN.
type joinLab struct {
	store *state.Store
	api   string
	srv   *join.Server
}

var (
	nodeOnce sync.Once
	nodeBin  string
	nodeErr  error
)

func buildNode(t *testing.T) string {
	t.Helper()
	peertest.Command(t, "go")
	nodeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "m11-node-")
		if err != nil {
			nodeErr = err
			return
		}
		nodeBin = filepath.Join(dir, "machina-node")
		out, err := exec.Command("go", "build", "-o", nodeBin, "../machina-node").CombinedOutput()
		if err != nil {
			nodeErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if nodeErr != nil {
		t.Fatal(nodeErr)
	}
	return nodeBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if nodeBin != "" {
		os.RemoveAll(filepath.Dir(nodeBin))
	}
	os.Exit(code)
}

func needShellTools(t *testing.T) {
	t.Helper()
	peertest.Commands(t, "sh", "curl", "openssl", "sha256sum", "tar")
}

func startJoinLab(t *testing.T) *joinLab {
	t.Helper()
	needShellTools(t)
	bin := buildNode(t)
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{NoSync: true, MasterKey: []byte("master-key-for-join-tests")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ca, err := join.LoadOrCreateCA(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := join.New(join.Config{Store: st, CA: ca, URL: "https://" + ln.Addr().String(), NodeBinary: bin,
		JoinRate: 1000, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	a, err := api.New(api.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := join.RegisterAdmin(a, srv, api.Actor); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(a.Handler())
	t.Cleanup(hs.Close)
	tok, _, err := st.CreateAdminToken("ops", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(envToken, tok)
	return &joinLab{store: st, api: hs.URL, srv: srv}
}

// sshHost is an in-process SSH server (golang.org/x/crypto/ssh) that runs
// exec requests with sh, as root would, with MACHINA_PREFIX pointing at a
// private directory and MACHINA_NODE_HOSTNAME naming the "host".
type sshHost struct {
	addr    string
	hostKey ssh.PublicKey
	prefix  string
}

type sshStats struct{ cur, max atomic.Int32 }

func startSSHHost(t *testing.T, name string, clientKey ssh.PublicKey, stats *sshStats) *sshHost {
	t.Helper()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(c ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if c.User() == "root" && bytes.Equal(k.Marshal(), clientKey.Marshal()) {
			return nil, nil
		}
		return nil, errors.New("unknown key")
	}}
	cfg.AddHostKey(signer)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &sshHost{addr: ln.Addr().String(), hostKey: signer.PublicKey(), prefix: t.TempDir()}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				_, chans, reqs, err := ssh.NewServerConn(conn, cfg)
				if err != nil {
					return
				}
				go ssh.DiscardRequests(reqs)
				for nc := range chans {
					if nc.ChannelType() != "session" {
						nc.Reject(ssh.UnknownChannelType, "session only")
						continue
					}
					ch, creqs, err := nc.Accept()
					if err != nil {
						return
					}
					h.session(t, name, ch, creqs, stats)
				}
			}()
		}
	}()
	return h
}

func (h *sshHost) session(t *testing.T, name string, ch ssh.Channel, reqs <-chan *ssh.Request, stats *sshStats) {
	defer ch.Close()
	for req := range reqs {
		if req.Type != "exec" || len(req.Payload) < 4 {
			req.Reply(false, nil)
			continue
		}
		n := binary.BigEndian.Uint32(req.Payload)
		command := string(req.Payload[4 : 4+n])
		req.Reply(true, nil)
		c := stats.cur.Add(1)
		for {
			m := stats.max.Load()
			if c <= m || stats.max.CompareAndSwap(m, c) {
				break
			}
		}
		cmd := exec.Command("sh", "-c", command)
		cmd.Env = append(os.Environ(), "MACHINA_PREFIX="+h.prefix, "MACHINA_NODE_HOSTNAME="+name)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = ch, ch, ch.Stderr()
		status := uint32(0)
		if err := cmd.Run(); err != nil {
			status = 1
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				status = uint32(ee.ExitCode())
			}
		}
		stats.cur.Add(-1)
		ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{status}))
		return
	}
}

func TestHostAddOverSSH(t *testing.T) {
	lab := startJoinLab(t)
	dir := t.TempDir()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, _ := ssh.NewSignerFromKey(priv)
	pemBlock, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	idFile := filepath.Join(dir, "id_ed25519")
	os.WriteFile(idFile, pem.EncodeToMemory(pemBlock), 0o600)
	t.Setenv("SSH_AUTH_SOCK", "")

	var stats sshStats
	var hosts []*sshHost
	var kh, targets strings.Builder
	for i := range 4 {
		h := startSSHHost(t, fmt.Sprintf("hv%d", i), signer.PublicKey(), &stats)
		hosts = append(hosts, h)
		if i != 2 { // host 2's key is not in known_hosts: it must fail
			kh.WriteString(knownhosts.Line([]string{knownhosts.Normalize(h.addr)}, h.hostKey) + "\n")
		}
		fmt.Fprintf(&targets, "root@%s  # hv%d\n", h.addr, i)
	}
	khFile := filepath.Join(dir, "known_hosts")
	os.WriteFile(khFile, []byte(kh.String()), 0o600)
	hostsFile := filepath.Join(dir, "hosts.txt")
	os.WriteFile(hostsFile, []byte("# fleet\n\n"+targets.String()), 0o600)

	var out, errb bytes.Buffer
	code := run(t.Context(), []string{"host", "add", "--api", lab.api, "--file", hostsFile, "--parallel", "2",
		"--identity", idFile, "--known-hosts", khFile, "--site", "lab1", "--rack", "r7", "--tags", "kvm,ssd",
		"--pools", "name=images,type=dir,path=" + filepath.Join(dir, "pool")}, nil, &out, &errb)
	t.Logf("stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	if code != 1 {
		t.Fatalf("exit %d, want 1 (one host failed)", code)
	}
	if !strings.Contains(errb.String(), "1 of 4 hosts failed") {
		t.Errorf("stderr %q lacks the failure count", errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "HOST") {
		t.Fatalf("table = %q, want header and 4 rows", lines)
	}
	for i, h := range hosts {
		row := lines[i+1]
		if !strings.HasPrefix(row, "root@"+h.addr) {
			t.Fatalf("row %d = %q, want root@%s first", i, row, h.addr)
		}
		if i == 2 {
			if !strings.Contains(row, "FAILED") || !strings.Contains(row, "key is unknown") {
				t.Errorf("row for unknown host key = %q, want FAILED ... key is unknown", row)
			}
			if _, err := lab.store.Host("hv2"); !errors.Is(err, state.ErrNotFound) {
				t.Errorf("hv2 joined despite an unknown host key: %v", err)
			}
			continue
		}
		if !strings.Contains(row, " ok ") || !strings.Contains(row, "joined") {
			t.Errorf("row %q, want ok ... joined", row)
		}
		rec, err := lab.store.Host(fmt.Sprintf("hv%d", i))
		if err != nil || rec.Site != "lab1" || rec.Rack != "r7" || strings.Join(rec.Tags, ",") != "kvm,ssd" || rec.JoinStatus != "joined" {
			t.Errorf("hv%d = %+v, %v", i, rec, err)
		}
		if _, err := os.Stat(filepath.Join(h.prefix, "var/lib/machina-node/node.crt")); err != nil {
			t.Errorf("hv%d has no node certificate: %v", i, err)
		}
	}
	if m := stats.max.Load(); m > 2 || m < 1 {
		t.Errorf("max concurrent installs %d, want 1..2 (--parallel 2)", m)
	}
	if strings.Contains(out.String()+errb.String(), "mj_") {
		t.Error("an enrolment token leaked into the output")
	}
	// host list shows the joined hosts online (the join's last report
	// counts as a heartbeat).
	out.Reset()
	if code := run(t.Context(), []string{"host", "list", "--api", lab.api}, nil, &out, &errb); code != 0 {
		t.Fatalf("host list: exit %d %s", code, errb.String())
	}
	rows := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(rows) != 4 {
		t.Fatalf("host list:\n%s\nwant header and 3 hosts", out.String())
	}
	for _, r := range rows[1:] {
		f := strings.Fields(r)
		if len(f) != 7 || f[1] != "lab1" || f[2] != "r7" || f[3] != "joined" || f[4] != "online" || f[6] != "kvm,ssd" {
			t.Errorf("host list row %q", r)
		}
	}
}

func TestTokenCreate(t *testing.T) {
	lab := startJoinLab(t)
	var out, errb bytes.Buffer
	code := run(t.Context(), []string{"token", "create", "--api", lab.api, "--site", "lab1", "--rack", "r1", "--tags", "kvm",
		"--networks", "name=prod,bridge=br-prod,nic=eno1,vlan=20,cidr=10.20.0.5/24", "--pools", "name=vg0,type=lvm,disks=/dev/sdb:/dev/sdc",
		"--require", "kvm,virt", "--ttl", "15m", "--json"}, nil, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var tok v1.EnrolmentToken
	if err := json.Unmarshal(out.Bytes(), &tok); err != nil {
		t.Fatal(err)
	}
	if tok.JoinURL != lab.srv.URL() || len(tok.CAFingerprint) != 64 || tok.ScriptSHA256 != join.ScriptSHA256() {
		t.Fatalf("token = %+v", tok)
	}
	// The payload is what the host gets when it joins.
	rec, err := lab.store.ConsumeEnrolmentToken(tok.Token, "x")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"site":"lab1","rack":"r1","tags":["kvm"],"networks":[{"name":"prod","bridge":"br-prod","nic":"eno1","vlan":20,"cidr":"10.20.0.5/24"}],"pools":[{"name":"vg0","type":"lvm","disks":["/dev/sdb","/dev/sdc"]}],"require":["kvm","virt"]}`
	if string(rec.Payload) != want {
		t.Fatalf("payload = %s\nwant %s", rec.Payload, want)
	}
	for name, args := range map[string][]string{
		"bad network key": {"--networks", "name=a,brdge=b,nic=c"},
		"bad vlan":        {"--networks", "name=a,bridge=b,nic=c,vlan=x"},
	} {
		if code := run(t.Context(), append([]string{"token", "create", "--api", lab.api}, args...), nil, io.Discard, io.Discard); code != 2 {
			t.Errorf("%s: exit %d, want 2", name, code)
		}
	}
	if code := run(t.Context(), []string{"token", "create", "--api", lab.api, "--pools", "name=p,type=dir,path=/etc/x"}, nil, io.Discard, &errb); code != 1 || !strings.Contains(errb.String(), "system directory") {
		t.Errorf("pool under /etc: exit %d %q, want 1 naming the system directory", code, errb.String())
	}
}

func TestBundleInstallsOffline(t *testing.T) {
	lab := startJoinLab(t)
	dir := t.TempDir()
	tarball := filepath.Join(dir, "b.tar.gz")
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"bundle", "--api", lab.api, "--node-binary", buildNode(t), "-o", tarball}, nil, &out, &errb); code != 0 {
		t.Fatalf("bundle: exit %d: %s", code, errb.String())
	}
	if o, err := exec.Command("tar", "-xzf", tarball, "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("untar: %v %s", err, o)
	}
	tok, err := lab.srv.IssueToken(v1.EnrolmentRequest{Site: "lab2", Tags: []string{"offline"}}, "test")
	if err != nil {
		t.Fatal(err)
	}
	prefix := t.TempDir()
	cmd := exec.Command(filepath.Join(dir, "machina-bundle", "install"), "--join", tok.JoinURL, "-")
	cmd.Stdin = strings.NewReader(tok.Token + "\n")
	cmd.Env = append(os.Environ(), "MACHINA_PREFIX="+prefix, "MACHINA_NODE_HOSTNAME=offline1")
	o, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bundle install: %v\n%s", err, o)
	}
	h, err := lab.store.Host("offline1")
	if err != nil || h.Site != "lab2" || h.JoinStatus != "joined" {
		t.Fatalf("offline1 = %+v, %v", h, err)
	}
	// A tampered CA in the bundle is refused before anything is installed.
	os.WriteFile(filepath.Join(dir, "machina-bundle", "ca.sha256"), []byte(strings.Repeat("0", 64)+"\n"), 0o644)
	tok2, _ := lab.srv.IssueToken(v1.EnrolmentRequest{}, "test")
	cmd = exec.Command(filepath.Join(dir, "machina-bundle", "install"), "--join", tok2.JoinURL, tok2.Token)
	cmd.Env = append(os.Environ(), "MACHINA_PREFIX="+t.TempDir(), "MACHINA_NODE_HOSTNAME=offline2")
	if o, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(o), "CA fingerprint mismatch") {
		t.Fatalf("tampered bundle: %v\n%s", err, o)
	}
}
