package gitops

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/machina-metal/machina/redact"
)

// Errors of the Git transport set-up. Compare with errors.Is.
var (
	// ErrUnknownHostKey means the SSH server's host is not in the
	// configured known_hosts file; the connection is refused (no
	// trust-on-first-use).
	ErrUnknownHostKey = errors.New("ssh host key unknown")
	// ErrHostKeyMismatch means known_hosts lists the host with other keys
	// than the one the server presented (a changed key or an attacker).
	ErrHostKeyMismatch = errors.New("ssh host key mismatch")
	// ErrRemoteConfig is a Remote that cannot be used as given (bad URL,
	// password in the URL, missing key or known_hosts file, token over
	// plain HTTP).
	ErrRemoteConfig = errors.New("invalid git remote")
)

// Remote says where the inventory repository lives and how to reach it.
// Secrets are read from files or the environment at each connection, never
// from the URL or a command line, so a rotated token is picked up without a
// restart.
type Remote struct {
	// URL is file:///abs/path (or an absolute path), https://host/path,
	// ssh://user@host[:port]/path or the scp-like user@host:path. A
	// password in the URL is refused (ErrRemoteConfig). http:// is only
	// accepted without a token.
	URL string
	// Branch is the inventory branch; "" means "main".
	Branch string

	// TokenFile is a file holding an HTTPS access token (surrounding
	// white space trimmed). It is sent as the password of HTTP basic auth.
	TokenFile string
	// TokenEnv names an environment variable holding the token, used when
	// TokenFile is "".
	TokenEnv string
	// Username goes with the token; "" means "x-access-token" (GitHub's
	// convention; Gitea and GitLab accept any user with a token).
	Username string
	// CAFile is a PEM bundle trusted for HTTPS in addition to the system
	// roots; "" means system roots only.
	CAFile string

	// SSHKeyFile is the private key (OpenSSH or PEM, unencrypted) for ssh
	// URLs. Required for ssh.
	SSHKeyFile string
	// KnownHostsFile is an OpenSSH known_hosts file (plain or hashed
	// entries; ed25519, ECDSA and RSA keys). Required for ssh: a host not
	// listed is refused with ErrUnknownHostKey, a different key with
	// ErrHostKeyMismatch.
	KnownHostsFile string
}

func (r Remote) branch() string {
	if r.Branch == "" {
		return "main"
	}
	return r.Branch
}

type remoteKind int

const (
	kindFile remoteKind = iota
	kindHTTP
	kindSSH
)

// parse validates the remote and returns its kind and the URL go-git is
// given. It never returns an error that quotes a password.
func (r Remote) parse() (remoteKind, string, error) {
	raw := strings.TrimSpace(r.URL)
	if raw == "" {
		return 0, "", fmt.Errorf("%w: empty url", ErrRemoteConfig)
	}
	if filepath.IsAbs(raw) {
		return kindFile, "file://" + filepath.ToSlash(filepath.Clean(raw)), nil
	}
	if !strings.Contains(raw, "://") {
		// scp-like user@host:path
		at := strings.Index(raw, "@")
		colon := strings.Index(raw, ":")
		if colon <= 0 || (at >= 0 && at > colon) {
			return 0, "", fmt.Errorf("%w: %q is neither a URL nor user@host:path", ErrRemoteConfig, redact.String(raw))
		}
		return kindSSH, raw, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return 0, "", fmt.Errorf("%w: unparsable url", ErrRemoteConfig)
	}
	if _, has := u.User.Password(); has {
		return 0, "", fmt.Errorf("%w: password in url %s; use TokenFile or TokenEnv", ErrRemoteConfig, redact.String(raw))
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return 0, "", fmt.Errorf("%w: file url with host %q", ErrRemoteConfig, u.Host)
		}
		return kindFile, raw, nil
	case "https":
		return kindHTTP, raw, nil
	case "http":
		if r.TokenFile != "" || r.TokenEnv != "" {
			return 0, "", fmt.Errorf("%w: refusing to send a token over plain http (%s)", ErrRemoteConfig, u.Host)
		}
		return kindHTTP, raw, nil
	case "ssh":
		return kindSSH, raw, nil
	default:
		return 0, "", fmt.Errorf("%w: unsupported scheme %q", ErrRemoteConfig, u.Scheme)
	}
}

// transportOptions are what every go-git network call takes.
type transportOptions struct {
	url      string
	auth     transport.AuthMethod
	caBundle []byte
	// ssh is true for ssh remotes, whose connections startOp's dialer
	// makes; proxy names that dialer (set by startOp).
	ssh   bool
	proxy transport.ProxyOptions
	// log receives the operations' timeouts; nil discards.
	log *slog.Logger
}

// withLogger returns o logging to l.
func (o transportOptions) withLogger(l *slog.Logger) transportOptions {
	o.log = l
	return o
}

func (o transportOptions) logger() *slog.Logger {
	if o.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.log
}

// options builds the auth method for one connection, reading the token or
// key afresh.
func (r Remote) options() (transportOptions, error) {
	kind, u, err := r.parse()
	if err != nil {
		return transportOptions{}, err
	}
	o := transportOptions{url: u}
	switch kind {
	case kindHTTP:
		tok, err := r.token()
		if err != nil {
			return o, err
		}
		if tok != "" {
			user := r.Username
			if user == "" {
				user = "x-access-token"
			}
			o.auth = &githttp.BasicAuth{Username: user, Password: tok}
		}
		if r.CAFile != "" {
			b, err := os.ReadFile(r.CAFile)
			if err != nil {
				return o, fmt.Errorf("%w: read ca file: %w", ErrRemoteConfig, err)
			}
			o.caBundle = b
		}
	case kindSSH:
		a, err := r.sshAuth(u)
		if err != nil {
			return o, err
		}
		o.auth = a
		o.ssh = true
	}
	return o, nil
}

func (r Remote) token() (string, error) {
	if r.TokenFile != "" {
		b, err := os.ReadFile(r.TokenFile)
		if err != nil {
			return "", fmt.Errorf("%w: read token file: %w", ErrRemoteConfig, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	if r.TokenEnv != "" {
		return strings.TrimSpace(os.Getenv(r.TokenEnv)), nil
	}
	return "", nil
}

func (r Remote) sshAuth(rawURL string) (*gitssh.PublicKeys, error) {
	if r.SSHKeyFile == "" {
		return nil, fmt.Errorf("%w: ssh url needs SSHKeyFile", ErrRemoteConfig)
	}
	if r.KnownHostsFile == "" {
		return nil, fmt.Errorf("%w: ssh url needs KnownHostsFile", ErrRemoteConfig)
	}
	ep, err := transport.NewEndpoint(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: parse ssh url", ErrRemoteConfig)
	}
	user := ep.User
	if user == "" {
		user = "git"
	}
	port := ep.Port
	if port == 0 {
		port = 22
	}
	hostPort := net.JoinHostPort(ep.Host, fmt.Sprint(port))
	pem, err := os.ReadFile(r.SSHKeyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: read ssh key: %w", ErrRemoteConfig, err)
	}
	signer, err := ssh.ParsePrivateKey(pem)
	if err != nil {
		return nil, fmt.Errorf("%w: parse ssh key %s: %w", ErrRemoteConfig, r.SSHKeyFile, err)
	}
	cb, algos, err := hostKeyCallback(r.KnownHostsFile, hostPort)
	if err != nil {
		return nil, err
	}
	return &gitssh.PublicKeys{
		User:   user,
		Signer: signer,
		HostKeyCallbackHelper: gitssh.HostKeyCallbackHelper{
			HostKeyCallback:   cb,
			HostKeyAlgorithms: algos,
		},
	}, nil
}

// hostKeyCallback returns an ssh.HostKeyCallback that accepts only the keys
// knownHostsFile lists for the server, and the host key algorithms to offer
// for hostPort ("host:port") so that the server presents a key of a type
// known_hosts has (ed25519, ECDSA nistp256/384/521, RSA with rsa-sha2-512,
// rsa-sha2-256 or ssh-rsa). A host with no entry gets a callback that always
// fails with ErrUnknownHostKey; a presented key that differs from the listed
// ones fails with ErrHostKeyMismatch. Lookup follows OpenSSH: port 22 is
// matched as "host", any other as "[host]:port"; hashed entries work.
func hostKeyCallback(knownHostsFile, hostPort string) (ssh.HostKeyCallback, []string, error) {
	base, err := knownhosts.New(knownHostsFile)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: read known_hosts: %w", ErrRemoteConfig, err)
	}
	wrapped := func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		err := base(hostname, remote, key)
		var ke *knownhosts.KeyError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ke) && len(ke.Want) == 0:
			return fmt.Errorf("%w: %s is not in %s; refusing (add its key with ssh-keyscan and check the fingerprint %s)",
				ErrUnknownHostKey, hostname, knownHostsFile, ssh.FingerprintSHA256(key))
		case errors.As(err, &ke):
			return fmt.Errorf("%w: %s presented %s %s, known_hosts %s lists another key; refusing",
				ErrHostKeyMismatch, hostname, key.Type(), ssh.FingerprintSHA256(key), knownHostsFile)
		default:
			return fmt.Errorf("ssh: check host key of %s: %w", hostname, err)
		}
	}
	// Ask the database which key types it holds for the host by presenting
	// a fresh key that cannot match: the KeyError lists the wanted keys.
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("ssh: probe known_hosts: %w", err)
	}
	probe, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil, nil, fmt.Errorf("ssh: probe known_hosts: %w", err)
	}
	var algos []string
	var ke *knownhosts.KeyError
	if err := base(hostPort, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, probe); errors.As(err, &ke) {
		seen := map[string]bool{}
		for _, k := range ke.Want {
			for _, a := range algorithmsForKeyType(k.Key.Type()) {
				if !seen[a] {
					seen[a] = true
					algos = append(algos, a)
				}
			}
		}
	}
	return wrapped, algos, nil
}

func algorithmsForKeyType(t string) []string {
	if t == ssh.KeyAlgoRSA {
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
	}
	return []string{t}
}
