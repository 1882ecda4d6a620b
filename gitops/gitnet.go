package gitops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-git/go-git/v5/plumbing/transport"
	"golang.org/x/net/proxy"

	"github.com/machina-metal/machina/redact"
)

// ErrGitTimeout means a Git network operation (ls-remote, fetch, push) did
// not finish within its deadline; its connections were closed. Compare
// with errors.Is; the error also wraps context.DeadlineExceeded.
var ErrGitTimeout = errors.New("git operation timed out")

// Errors a Git server answers that retrying cannot fix: they need a
// person (a new token or key, a granted permission). A write stops at
// the first one instead of retrying; the source keeps polling at its
// capped backoff, so a fixed credential is picked up. Compare with
// errors.Is. The server's response body (often a whole HTML page) is
// never part of the error.
var (
	// ErrGitAuth: the server refused the credentials (HTTP 401, or the
	// SSH server accepted none of the keys offered).
	ErrGitAuth = errors.New("git remote refused the credentials")
	// ErrGitPermission: the server knows the user but denies the
	// operation (HTTP 403, e.g. a read-only token pushing).
	ErrGitPermission = errors.New("git remote denied permission")
)

// needsPerson reports whether err is an answer retrying cannot change
// (ErrGitAuth, ErrGitPermission, ErrRemoteConfig).
func needsPerson(err error) bool {
	return errors.Is(err, ErrGitAuth) || errors.Is(err, ErrGitPermission) || errors.Is(err, ErrRemoteConfig)
}

// classify turns go-git's authentication and permission errors into
// ErrGitAuth and ErrGitPermission, dropping the response body go-git
// appends to them (the 401 page of nginx or a forge), and strips the body
// from "repository not found" too.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, transport.ErrAuthenticationRequired):
		return fmt.Errorf("%w: %w", ErrGitAuth, transport.ErrAuthenticationRequired)
	case errors.Is(err, transport.ErrAuthorizationFailed):
		return fmt.Errorf("%w: %w", ErrGitPermission, transport.ErrAuthorizationFailed)
	case errors.Is(err, transport.ErrRepositoryNotFound):
		return transport.ErrRepositoryNotFound
	case strings.Contains(err.Error(), "ssh: unable to authenticate"):
		// x/crypto/ssh: the server accepted none of the methods offered.
		return fmt.Errorf("%w: %w", ErrGitAuth, err)
	}
	return err
}

// sidebandLines keeps the last lines a server sent on the sideband's
// progress channel during a push (git prints them as "remote: ..."):
// where a pre-receive hook or a forge's branch protection says why it
// refused. At most maxSidebandLines lines of at most 200 bytes each, in
// order, redacted. Safe for one writer.
type sidebandLines struct {
	partial []byte
	lines   []string
}

const maxSidebandLines = 8

func (s *sidebandLines) Write(p []byte) (int, error) {
	for _, b := range p {
		if b == '\n' || b == '\r' {
			s.flush()
			continue
		}
		if len(s.partial) < 200 {
			s.partial = append(s.partial, b)
		}
	}
	return len(p), nil
}

func (s *sidebandLines) flush() {
	l := strings.TrimSpace(string(s.partial))
	s.partial = s.partial[:0]
	if l == "" {
		return
	}
	if len(s.lines) == maxSidebandLines {
		s.lines = s.lines[1:]
	}
	s.lines = append(s.lines, redact.String(l))
}

// String is the lines as git shows them: "remote: LINE" joined by "; ".
func (s *sidebandLines) String() string {
	s.flush()
	out := make([]string, len(s.lines))
	for i, l := range s.lines {
		out[i] = "remote: " + l
	}
	return strings.Join(out, "; ")
}

// A Git network operation must end at its deadline, but go-git does not
// always honour the context: over SSH it dials with no deadline of ours,
// runs the SSH handshake with none at all (a server that accepts and never
// answers holds it forever), and its context readers return while the
// read beneath them stays blocked on the connection. So every SSH
// connection is dialed by opDialer, which closes it when its operation's
// context ends: a blocked handshake or read then fails at once, and the
// next operation dials afresh. go-git reaches opDialer through the one
// hook it has for the SSH dial, the proxy option (ProxyOptions.URL, read
// by golang.org/x/net/proxy.FromURL): the URL opScheme://ID names the
// operation. Over HTTPS go-git sends every request with the operation's
// context, and net/http closes the connection when it ends.

// opScheme is the proxy URL scheme that names an operation's dialer.
const opScheme = "machina-gitop"

var (
	registerOnce sync.Once
	opSeq        atomic.Uint64
	opCtxs       sync.Map // operation id (string) → context.Context
)

// registerOpDialer installs opDialer's proxy scheme with x/net/proxy. The
// constructors of Source, StatusWriter and Proposer call it, before any
// network operation.
func registerOpDialer() {
	registerOnce.Do(func() {
		proxy.RegisterDialerType(opScheme, func(u *url.URL, _ proxy.Dialer) (proxy.Dialer, error) {
			v, ok := opCtxs.Load(u.Host)
			if !ok {
				return nil, fmt.Errorf("git dial: operation %s is over", u.Host)
			}
			return opDialer{ctx: v.(context.Context)}, nil
		})
	})
}

// opDialer dials for one operation and closes each connection when the
// operation's context ends. It honours ALL_PROXY and NO_PROXY as go-git's
// own SSH dial does.
type opDialer struct{ ctx context.Context }

func (d opDialer) Dial(network, addr string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, addr)
}

func (d opDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(d.ctx, cancel)
	defer stop()
	c, err := proxy.Dial(ctx, network, addr)
	if err != nil {
		if d.ctx.Err() != nil {
			return nil, fmt.Errorf("dial %s: %w", addr, context.Cause(d.ctx))
		}
		return nil, err
	}
	context.AfterFunc(d.ctx, func() { c.Close() })
	return c, nil
}

// gitOp is one network operation in flight; see startOp.
type gitOp struct {
	name    string
	url     string
	ctx     context.Context
	cancel  context.CancelFunc
	id      string
	start   time.Time
	log     *slog.Logger
	timeout time.Duration
}

// startOp starts the network operation name ("ls-remote", "fetch",
// "push") against o's remote: the returned options carry a dialer whose
// connections close when ctx ends (SSH; HTTPS honours ctx itself), and the
// operation's context is ctx. Call op.done with the operation's error:
// it closes the operation's connections and, when ctx's deadline ended
// it, logs the operation, the remote (without credentials) and the
// elapsed time at Warn and returns an error wrapping ErrGitTimeout and
// context.DeadlineExceeded.
func startOp(ctx context.Context, o transportOptions, name string) (*gitOp, transportOptions) {
	op := &gitOp{name: name, url: redact.String(o.url), start: time.Now(), log: o.logger()}
	if d, ok := ctx.Deadline(); ok {
		op.timeout = time.Until(d)
	}
	op.ctx, op.cancel = context.WithCancel(ctx)
	if o.ssh {
		op.id = strconv.FormatUint(opSeq.Add(1), 10)
		opCtxs.Store(op.id, op.ctx)
		o.proxy = transport.ProxyOptions{URL: opScheme + "://" + op.id}
	}
	return op, o
}

// done ends the operation (closing its connections) and returns err,
// turned into a timeout error when the deadline ended the operation.
func (op *gitOp) done(err error) error {
	deadline := errors.Is(op.ctx.Err(), context.DeadlineExceeded)
	op.cancel()
	if op.id != "" {
		opCtxs.Delete(op.id)
	}
	if err == nil {
		return nil
	}
	if !deadline {
		return classify(err)
	}
	elapsed := time.Since(op.start).Round(time.Millisecond)
	op.log.Warn("git operation timed out, connection closed", "op", op.name, "remote", op.url,
		"elapsed", elapsed.String(), "timeout", op.timeout.Round(time.Millisecond).String())
	return fmt.Errorf("no answer within %s: %w (%w)", elapsed, ErrGitTimeout, context.DeadlineExceeded)
}
