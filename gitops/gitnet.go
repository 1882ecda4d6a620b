package gitops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
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
	if err == nil || !deadline {
		return err
	}
	elapsed := time.Since(op.start).Round(time.Millisecond)
	op.log.Warn("git operation timed out, connection closed", "op", op.name, "remote", op.url,
		"elapsed", elapsed.String(), "timeout", op.timeout.Round(time.Millisecond).String())
	return fmt.Errorf("no answer within %s: %w (%w)", elapsed, ErrGitTimeout, context.DeadlineExceeded)
}
