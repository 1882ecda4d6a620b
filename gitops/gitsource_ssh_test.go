package gitops

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// sshGitServer is an in-process SSH server on loopback that runs the real
// git-upload-pack for one repository, like a forge's SSH endpoint.
type sshGitServer struct {
	addr     string
	repoPath string
	execs    atomic.Int32
}

func newSigner(t *testing.T, kind string) ssh.Signer {
	t.Helper()
	var key any
	var err error
	switch kind {
	case "ed25519":
		_, key, err = ed25519.GenerateKey(rand.Reader)
	case "ecdsa":
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "rsa":
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	}
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startSSHGitServer serves repoPath with the given host keys, accepting only
// clientKey.
func startSSHGitServer(t *testing.T, repoPath string, clientKey ssh.PublicKey, hostKeys ...ssh.Signer) *sshGitServer {
	t.Helper()
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
			if string(k.Marshal()) == string(clientKey.Marshal()) {
				return nil, nil
			}
			return nil, errors.New("unknown client key")
		},
	}
	for _, k := range hostKeys {
		cfg.AddHostKey(k)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &sshGitServer{addr: ln.Addr().String(), repoPath: repoPath}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				srv.handle(t, c, cfg)
			}()
		}
	}()
	return srv
}

func (s *sshGitServer) handle(t *testing.T, c net.Conn, cfg *ssh.ServerConfig) {
	defer c.Close()
	_, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return // refused by the client or auth failure
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
		go func() {
			defer ch.Close()
			for req := range creqs {
				if req.Type != "exec" || len(req.Payload) < 4 {
					req.Reply(false, nil)
					continue
				}
				n := binary.BigEndian.Uint32(req.Payload)
				cmdline := string(req.Payload[4 : 4+n])
				verb, arg, _ := strings.Cut(cmdline, " ")
				arg = strings.Trim(arg, "'")
				if verb != "git-upload-pack" && verb != "git-receive-pack" || filepath.Clean(arg) != s.repoPath {
					req.Reply(false, nil)
					return
				}
				req.Reply(true, nil)
				s.execs.Add(1)
				cmd := exec.Command(verb, s.repoPath)
				cmd.Stdin, cmd.Stdout, cmd.Stderr = ch, ch, ch.Stderr()
				status := uint32(0)
				if err := cmd.Run(); err != nil {
					t.Logf("ssh server: %s: %v", verb, err)
					status = 1
				}
				ch.CloseWrite()
				ch.SendRequest("exit-status", false, binary.BigEndian.AppendUint32(nil, status))
				return
			}
		}()
	}
}

// sshFixture writes the client key and a known_hosts file.
func sshFixture(t *testing.T, hostsLine string) (keyFile, knownHosts string, client ssh.Signer) {
	t.Helper()
	dir := t.TempDir()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "machina test")
	if err != nil {
		t.Fatal(err)
	}
	keyFile = filepath.Join(dir, "id_ed25519")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	client, err = ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	knownHosts = filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(knownHosts, []byte(hostsLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return keyFile, knownHosts, client
}

func TestSourceSSHHostKeys(t *testing.T) {
	r := newTestRepo(t)
	signers := map[string]ssh.Signer{"ed25519": newSigner(t, "ed25519"), "ecdsa": newSigner(t, "ecdsa"), "rsa": newSigner(t, "rsa")}
	other := newSigner(t, "ed25519")
	for _, tc := range []struct {
		name     string
		serve    []string // host key kinds the server offers
		known    string   // kind listed in known_hosts for the server ("other": a different key)
		hashed   bool
		knownFor string // "" the server's address, else another host
		wantErr  error
	}{
		{name: "ed25519", serve: []string{"ed25519"}, known: "ed25519"},
		{name: "ecdsa", serve: []string{"ecdsa"}, known: "ecdsa"},
		{name: "rsa", serve: []string{"rsa"}, known: "rsa"},
		{name: "hashed entry", serve: []string{"ed25519"}, known: "ed25519", hashed: true},
		{name: "server offers all, known_hosts has rsa", serve: []string{"ed25519", "ecdsa", "rsa"}, known: "rsa"},
		{name: "server offers all, known_hosts has ecdsa", serve: []string{"ed25519", "ecdsa", "rsa"}, known: "ecdsa"},
		{name: "wrong key", serve: []string{"ed25519"}, known: "other", wantErr: ErrHostKeyMismatch},
		{name: "wrong key type only", serve: []string{"ed25519"}, known: "rsa", wantErr: nil /* set below */},
		{name: "unknown host", serve: []string{"ed25519"}, known: "ed25519", knownFor: "[127.0.0.1]:1", wantErr: ErrUnknownHostKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hostKeys []ssh.Signer
			for _, k := range tc.serve {
				hostKeys = append(hostKeys, signers[k])
			}
			// The server's address is known only once it listens, so
			// known_hosts is written after it starts.
			keyFile, khFile, client := sshFixture(t, "")
			srv := startSSHGitServer(t, r.bare, client.PublicKey(), hostKeys...)
			host := tc.knownFor
			if host == "" {
				host = knownhosts.Normalize(srv.addr)
			}
			var listed ssh.PublicKey
			switch tc.known {
			case "other":
				listed = other.PublicKey()
			default:
				listed = signers[tc.known].PublicKey()
			}
			if tc.hashed {
				host = knownhosts.HashHostname(host)
			}
			if err := os.WriteFile(khFile, []byte(knownhosts.Line([]string{host}, listed)+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			want := tc.wantErr
			if tc.name == "wrong key type only" {
				// The client offers only rsa algorithms; the server
				// has none, so the handshake fails before any key is
				// accepted.
				want = errNoCommonAlgo
			}
			s, err := NewSource(SourceConfig{
				Remote:   Remote{URL: "ssh://git@" + srv.addr + r.bare, SSHKeyFile: keyFile, KnownHostsFile: khFile},
				StateDir: t.TempDir(), Logger: testLogger(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			err = s.Poll(t.Context())
			switch {
			case want == nil:
				if err != nil {
					t.Fatalf("Poll over ssh = %v", err)
				}
				if good, _ := s.Latest(); good.Inventory == nil || len(good.Inventory.Servers) != 12 {
					t.Errorf("Latest over ssh = %+v, want 12 servers", good)
				}
				if srv.execs.Load() < 2 {
					t.Errorf("server ran git %d times, want ls-remote and fetch", srv.execs.Load())
				}
			case want == errNoCommonAlgo:
				if err == nil || !strings.Contains(err.Error(), "no common algorithm") {
					t.Fatalf("Poll = %v, want a handshake failure (no common host key algorithm)", err)
				}
				if srv.execs.Load() != 0 {
					t.Error("server ran git although the handshake should have failed")
				}
			default:
				if !errors.Is(err, want) {
					t.Fatalf("Poll = %v, want %v", err, want)
				}
				if srv.execs.Load() != 0 {
					t.Error("server ran git for a refused client")
				}
				if good, _ := s.Latest(); good.Commit != "" {
					t.Error("a revision was accepted over a refused connection")
				}
				t.Logf("refused with: %v", err)
			}
		})
	}
}

var errNoCommonAlgo = errors.New("no common algorithm")

func TestHostKeyCallbackAlgorithms(t *testing.T) {
	dir := t.TempDir()
	ed, ec, rs := newSigner(t, "ed25519"), newSigner(t, "ecdsa"), newSigner(t, "rsa")
	lines := knownhosts.Line([]string{"git.example.org"}, ed.PublicKey()) + "\n" +
		knownhosts.Line([]string{"git.example.org"}, rs.PublicKey()) + "\n" +
		knownhosts.Line([]string{"[git.example.org]:2222"}, ec.PublicKey()) + "\n"
	kh := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(kh, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	_, algos, err := hostKeyCallback(kh, "git.example.org:22")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{ssh.KeyAlgoED25519: true, ssh.KeyAlgoRSASHA512: true, ssh.KeyAlgoRSASHA256: true, ssh.KeyAlgoRSA: true}
	if len(algos) != len(want) {
		t.Errorf("algorithms for port 22 = %v, want %v", algos, want)
	}
	for _, a := range algos {
		if !want[a] {
			t.Errorf("unexpected algorithm %s", a)
		}
	}
	cb, algos, err := hostKeyCallback(kh, "git.example.org:2222")
	if err != nil {
		t.Fatal(err)
	}
	if len(algos) != 1 || algos[0] != ssh.KeyAlgoECDSA256 {
		t.Errorf("algorithms for port 2222 = %v, want [%s]", algos, ssh.KeyAlgoECDSA256)
	}
	addr := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 2222}
	if err := cb("git.example.org:2222", addr, ec.PublicKey()); err != nil {
		t.Errorf("callback(listed key) = %v", err)
	}
	if err := cb("git.example.org:2222", addr, ed.PublicKey()); !errors.Is(err, ErrHostKeyMismatch) {
		t.Errorf("callback(other key) = %v, want ErrHostKeyMismatch", err)
	}
	if err := cb("other.example.org:22", addr, ed.PublicKey()); !errors.Is(err, ErrUnknownHostKey) {
		t.Errorf("callback(unknown host) = %v, want ErrUnknownHostKey", err)
	}
	if _, _, err := hostKeyCallback(filepath.Join(dir, "missing"), "h:22"); !errors.Is(err, ErrRemoteConfig) {
		t.Errorf("missing known_hosts = %v, want ErrRemoteConfig", err)
	}
}

// TestStatusWriterSSH pushes a status commit over SSH (git-receive-pack
// behind the in-process server) and refuses a server with the wrong key.
func TestStatusWriterSSH(t *testing.T) {
	r := newTestRepo(t)
	host := newSigner(t, "ed25519")
	keyFile, khFile, client := sshFixture(t, "")
	srv := startSSHGitServer(t, r.bare, client.PublicKey(), host)
	write := func(listed ssh.PublicKey) (WriteResult, error) {
		t.Helper()
		if err := os.WriteFile(khFile, []byte(knownhosts.Line([]string{knownhosts.Normalize(srv.addr)}, listed)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		w, err := NewStatusWriter(StatusConfig{
			Remote:   Remote{URL: "ssh://git@" + srv.addr + r.bare, SSHKeyFile: keyFile, KnownHostsFile: khFile},
			StateDir: t.TempDir(), Attempts: 1, Logger: testLogger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		return w.Write(t.Context(), sampleSnapshot())
	}
	before := r.remoteHead("main")
	if _, err := write(newSigner(t, "ed25519").PublicKey()); !errors.Is(err, ErrHostKeyMismatch) {
		t.Fatalf("Write to a server with another key = %v, want ErrHostKeyMismatch", err)
	}
	if r.remoteHead("main") != before || srv.execs.Load() != 0 {
		t.Fatal("refused server received something")
	}
	res, err := write(host.PublicKey())
	if err != nil {
		t.Fatalf("Write over ssh = %v", err)
	}
	if got := r.remoteHead("main").String(); got != res.Commit {
		t.Errorf("remote main = %s, want %s", got, res.Commit)
	}
}
