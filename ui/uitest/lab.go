// Package uitest builds an in-process controller for the web console's
// tests and demos: a real state store, the real admin API, the real console
// handler and the UI, with a small simulated feed (servers in three zones,
// a BMC read model, image imports, an inventory with a held plan, a joined
// host and an echoing serial console). It is the UI's stand-in for
// `machina sim` until the simulated lab exists: the browser tests reach it
// only through [Target], which a `machina sim` process can implement with
// its URL, an admin token and the admin API's transitions route.
//
// uitest is for tests and demos; nothing in the controller imports it.
package uitest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/console"
	"github.com/machina-metal/machina/state"
	"github.com/machina-metal/machina/ui"
)

// Target is what the browser tests need from a running controller.
type Target interface {
	// URL is the controller's base URL, e.g. "http://127.0.0.1:41234".
	URL() string
	// Token is an admin token to log in with.
	Token() string
	// Transition moves a server's lifecycle from→to as the controller's
	// reconciler would (the test's stand-in for a machine reporting in).
	Transition(ctx context.Context, server, from, to, reason string) error
}

// HeldDigest is the inventory digest of the lab's acting revision, whose
// plan the safety brake holds until approved.
const HeldDigest = "sha256:3f9a1c0d2b7e4f5a6c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"

// Lab is the in-process controller. Create it with New; Close it.
type Lab struct {
	Store   *state.Store     // the real store, in the directory given to New
	API     *api.Server      // the real admin API; the UI and console are mounted on it
	UI      *ui.UI           // the UI under test
	Console *console.Handler // the console handler shared by the API route and the UI
	Server  *httptest.Server // serves API.Handler() on 127.0.0.1
	token   string

	mu      sync.Mutex
	audit   []console.Event
	streams int
}

// Options tune New. The zero value is usable.
type Options struct {
	// Logger receives every component's logs; nil discards.
	Logger *slog.Logger
	// SessionTTL is passed to ui.Config; zero means its default.
	SessionTTL time.Duration
	// Now is the UI's clock; nil means time.Now.
	Now func() time.Time
}

// New opens a store in dir, seeds it and starts the HTTP server on
// 127.0.0.1 (an ephemeral port). Errors name the step that failed.
func New(dir string, opts Options) (*Lab, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	st, err := state.Open(filepath.Join(dir, "state.db"), state.Options{NoSync: true, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("uitest: open store: %w", err)
	}
	l := &Lab{Store: st}
	ok := false
	defer func() {
		if !ok {
			l.Close()
		}
	}()
	tok, _, err := st.CreateAdminToken("operator", state.ActorLocal)
	if err != nil {
		return nil, fmt.Errorf("uitest: admin token: %w", err)
	}
	l.token = tok
	if err := seed(st); err != nil {
		return nil, fmt.Errorf("uitest: seed: %w", err)
	}
	l.API, err = api.New(api.Config{Store: st, Logger: log, Heartbeat: time.Second})
	if err != nil {
		return nil, fmt.Errorf("uitest: api: %w", err)
	}
	bearer := func(r *http.Request) (string, error) {
		scheme, v, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") {
			return "", ui.ErrNoSession
		}
		at, err := st.AuthenticateAdmin(strings.TrimSpace(v))
		if err != nil {
			return "", err
		}
		return at.Name, nil
	}
	l.Console, err = console.New(console.Config{
		Opener:       console.OpenerFunc(l.openConsole),
		Authenticate: ui.ConsoleAuthenticate(bearer),
		Audit:        l.recordAudit,
		Logger:       log,
	})
	if err != nil {
		return nil, fmt.Errorf("uitest: console: %w", err)
	}
	if err := l.API.HandlePublic(console.Pattern, l.Console); err != nil {
		return nil, fmt.Errorf("uitest: mount console: %w", err)
	}
	h, err := ui.New(ui.Config{
		Store: st, API: l.API.Handler(), Console: l.Console,
		RouteRole: func(p string) state.Role { r, _ := api.RouteRole(p); return r },
		BMC:       fakeBMC{}, Images: &fakeImages{}, Inventory: &fakeInventory{store: st},
		Logger: log, SessionTTL: opts.SessionTTL, Now: opts.Now,
	})
	if err != nil {
		return nil, fmt.Errorf("uitest: ui: %w", err)
	}
	l.UI = h.(*ui.UI)
	if err := l.API.HandlePublic(ui.Prefix, h); err != nil {
		return nil, fmt.Errorf("uitest: mount ui: %w", err)
	}
	l.Server = httptest.NewServer(l.API.Handler())
	ok = true
	return l, nil
}

// URL implements Target.
func (l *Lab) URL() string { return l.Server.URL }

// Token implements Target.
func (l *Lab) Token() string { return l.token }

// Transition implements Target through the store, as the reconciler does.
func (l *Lab) Transition(_ context.Context, server, from, to, reason string) error {
	_, err := l.Store.Transition(server, state.Lifecycle(from), state.Lifecycle(to), reason)
	return err
}

// Close stops the server and closes the store.
func (l *Lab) Close() {
	if l.Server != nil {
		l.Server.CloseClientConnections()
		l.Server.Close()
	}
	if l.Store != nil {
		l.Store.Close()
	}
}

// ConsoleStreams returns how many console streams the lab's opener has
// opened (one per console session, shared by its clients).
func (l *Lab) ConsoleStreams() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.streams
}

// Audit returns the console audit events so far.
func (l *Lab) Audit() []console.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]console.Event(nil), l.audit...)
}

// recordAudit keeps the console's audit event and writes it as a state
// event, as cmd/machina's wiring does for the API's changes.
func (l *Lab) recordAudit(_ context.Context, e console.Event) {
	l.mu.Lock()
	l.audit = append(l.audit, e)
	l.mu.Unlock()
	_, _ = l.Store.AppendEvent(state.Event{Server: e.Server, Actor: e.Principal,
		Message: fmt.Sprintf("%s (%s)", e.Action, e.Role)})
}

// openConsole is the stand-in serial console: it echoes what is typed, as
// a getty does; the first input also brings the login banner (a serial
// line shows nothing until someone presses Enter). r2-n02's BMC has no
// console.
func (l *Lab) openConsole(_ context.Context, server string) (io.ReadWriteCloser, error) {
	if _, err := l.Store.Server(server); err != nil {
		return nil, console.ErrServerNotFound
	}
	if server == "r2-n02" {
		return nil, fmt.Errorf("uitest: %s: %w", server, bmc.ErrUnsupported)
	}
	l.mu.Lock()
	l.streams++
	l.mu.Unlock()
	return newEcho("Debian GNU/Linux 12 " + server + " ttyS0\r\n\r\n" + server + " login: "), nil
}

// echo is an in-memory serial line: reads return everything written, and
// the banner after the first write. Close ends pending reads with io.EOF.
type echo struct {
	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	banner string
	closed bool
}

func newEcho(banner string) *echo {
	e := &echo{banner: banner}
	e.cond = sync.NewCond(&e.mu)
	return e
}

func (e *echo) Read(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for len(e.buf) == 0 && !e.closed {
		e.cond.Wait()
	}
	if len(e.buf) == 0 {
		return 0, io.EOF
	}
	n := copy(p, e.buf)
	e.buf = e.buf[n:]
	return n, nil
}

func (e *echo) Write(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, io.ErrClosedPipe
	}
	e.buf = append(e.buf, p...)
	if e.banner != "" {
		e.buf = append(e.buf, e.banner...)
		e.banner = ""
	}
	e.cond.Broadcast()
	return len(p), nil
}

func (e *echo) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	e.cond.Broadcast()
	return nil
}
