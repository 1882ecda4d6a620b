// Package console bridges a server's serial console (IPMI Serial-over-LAN,
// or any stream behind [Opener]) to WebSocket clients at
// /api/v1/servers/{name}/console.
//
// One console session (one SOL activation) exists per server while at least
// one client is attached. The first client is the writer: its binary or text
// messages are typed on the console. Later clients are read-only: they see
// the same output and their input is dropped. When the writer leaves, the
// next client to connect becomes the writer. A client idle (no input, no
// output) for Config.IdleTimeout is disconnected; when the last client goes,
// the console stream is closed, which ends the SOL session on the BMC.
// Every attach and detach is reported to Config.Audit.
//
// console imports only the bmc package of this project; the API server
// mounts [Handler] and supplies authentication and the Opener.
package console

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/machina-metal/machina/bmc"
)

// Pattern is the net/http ServeMux pattern the handler is meant for.
const Pattern = "GET /api/v1/servers/{name}/console"

// RoleHeader is the response header of the WebSocket handshake that tells the
// client its role: "writer" or "reader".
const RoleHeader = "X-Machina-Console-Role"

// Roles.
const (
	RoleWriter = "writer"
	RoleReader = "reader"
)

// ErrServerNotFound is returned by an Opener for an unknown server name; the
// handler answers 404.
var ErrServerNotFound = errors.New("console: server not found")

// Opener opens the serial console of a server by name. It returns an error
// wrapping bmc.ErrUnsupported when the server's BMC has no console (the
// handler answers 501 "not supported by this BMC"), ErrServerNotFound for an
// unknown name, or another error (502). The stream's Close MUST end the BMC's
// console session.
type Opener interface {
	OpenConsole(ctx context.Context, server string) (io.ReadWriteCloser, error)
}

// OpenerFunc adapts a function to Opener.
type OpenerFunc func(ctx context.Context, server string) (io.ReadWriteCloser, error)

// OpenConsole calls f.
func (f OpenerFunc) OpenConsole(ctx context.Context, server string) (io.ReadWriteCloser, error) {
	return f(ctx, server)
}

// DriverOpener returns an Opener over bmc drivers: lookup returns the driver
// of a server (or an error wrapping ErrServerNotFound), and drivers that do
// not implement bmc.Console (Redfish BMCs without SOL) yield
// bmc.ErrUnsupported.
func DriverOpener(lookup func(ctx context.Context, server string) (bmc.Driver, error)) Opener {
	return OpenerFunc(func(ctx context.Context, server string) (io.ReadWriteCloser, error) {
		d, err := lookup(ctx, server)
		if err != nil {
			return nil, err
		}
		c, ok := d.(bmc.Console)
		if !ok {
			return nil, fmt.Errorf("console: server %s: %w", server, bmc.ErrUnsupported)
		}
		return c.OpenConsole(ctx)
	})
}

// Event is one audit record.
type Event struct {
	// Action is "console.open" or "console.close".
	Action string `json:"action"`
	Server string `json:"server"`
	// Principal is who the Authenticate callback said the client is.
	Principal string `json:"principal"`
	// Remote is the client's address (http.Request.RemoteAddr).
	Remote string `json:"remote"`
	// Role is RoleWriter or RoleReader.
	Role string `json:"role"`
	// Reason says why the client left (close events only): "client closed",
	// "idle timeout", "console ended", "server shutdown".
	Reason string    `json:"reason,omitempty"`
	Time   time.Time `json:"time"`
}

// Config configures the handler.
type Config struct {
	// Opener opens consoles; required.
	Opener Opener
	// Authenticate checks the request's admin token and returns the
	// principal's name. nil refuses every request with 401 (fail closed).
	Authenticate func(r *http.Request) (principal string, err error)
	// Audit receives an Event on every attach and detach; nil drops them.
	// It is called synchronously and must not block for long.
	Audit func(ctx context.Context, e Event)
	// IdleTimeout disconnects a client with no input and no output for this
	// long; zero means 15 minutes.
	IdleTimeout time.Duration
	// OriginPatterns are the allowed Origin hosts for browser clients
	// (websocket.AcceptOptions); nil allows only same-origin and non-browser clients.
	OriginPatterns []string
	// Logger gets Info lines per attach/detach; nil discards.
	Logger *slog.Logger
}

// Handler serves console WebSockets. Create it with New.
type Handler struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	sessions map[string]*session
}

// New returns a handler, or an error if cfg.Opener is nil.
func New(cfg Config) (*Handler, error) {
	if cfg.Opener == nil {
		return nil, errors.New("console: Config.Opener is nil")
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 15 * time.Minute
	}
	if cfg.Audit == nil {
		cfg.Audit = func(context.Context, Event) {}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{cfg: cfg, log: log, sessions: map[string]*session{}}, nil
}

var validName = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)

// serverName returns {name} from the mux, or parses it from the path when
// the handler is mounted without a pattern.
func serverName(r *http.Request) string {
	if n := r.PathValue("name"); n != "" {
		return n
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/api/v1/servers/")
	if !ok {
		return ""
	}
	n, ok := strings.CutSuffix(rest, "/console")
	if !ok {
		return ""
	}
	return n
}

// ServeHTTP authenticates, validates the server name, attaches the client to
// the server's console session (opening it if needed) and upgrades to a
// WebSocket. Errors before the upgrade are plain-text HTTP answers: 401, 400,
// 404, 501 ("console: not supported by this BMC"), 502.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Authenticate == nil {
		http.Error(w, "console: unauthorized", http.StatusUnauthorized)
		return
	}
	principal, err := h.cfg.Authenticate(r)
	if err != nil {
		http.Error(w, "console: unauthorized", http.StatusUnauthorized)
		return
	}
	name := serverName(r)
	if !validName.MatchString(name) {
		http.Error(w, "console: invalid server name", http.StatusBadRequest)
		return
	}
	sess, role, err := h.attach(r.Context(), name)
	if err != nil {
		switch {
		case errors.Is(err, bmc.ErrUnsupported):
			http.Error(w, "console: not supported by this BMC", http.StatusNotImplemented)
		case errors.Is(err, ErrServerNotFound):
			http.Error(w, "console: server not found", http.StatusNotFound)
		default:
			h.log.Error("console open failed", "server", name, "err", err)
			http.Error(w, "console: cannot open console: "+err.Error(), http.StatusBadGateway)
		}
		return
	}
	w.Header().Set(RoleHeader, role)
	// The client joins the session's fan-out before the 101 answer goes
	// out: output that follows the answer (a writer's echo the moment this
	// client's Dial returns) waits in its buffer instead of being missed.
	c := &client{role: role, out: make(chan []byte, 64)}
	sess.add(c)
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{OriginPatterns: h.cfg.OriginPatterns})
	if err != nil {
		h.detach(sess, c, role)
		return
	}
	c.conn = conn
	c.touch()
	ev := Event{Server: name, Principal: principal, Remote: r.RemoteAddr, Role: role}
	ev.Action, ev.Time = "console.open", time.Now()
	h.cfg.Audit(r.Context(), ev)
	h.log.Info("console attached", "server", name, "principal", principal, "role", role)

	reason := h.serve(r.Context(), sess, c)

	h.detach(sess, c, role)
	ev.Action, ev.Reason, ev.Time = "console.close", reason, time.Now()
	h.cfg.Audit(context.WithoutCancel(r.Context()), ev)
	h.log.Info("console detached", "server", name, "principal", principal, "role", role, "reason", reason)
}

// attach returns the server's session, opening the console if none is
// active, and the role the new client gets. The console is opened without
// holding the handler's lock, so a slow BMC delays only its own clients;
// clients arriving meanwhile wait for that open and share its result.
func (h *Handler) attach(ctx context.Context, name string) (*session, string, error) {
	h.mu.Lock()
	s := h.sessions[name]
	if s != nil && s.isEnded() {
		// The console stream ended (the BMC dropped SOL); its clients are
		// leaving. A new client gets a fresh session.
		delete(h.sessions, name)
		s = nil
	}
	opener := s == nil
	if opener {
		s = &session{name: name, clients: map[*client]bool{}, ready: make(chan struct{}), ended: make(chan struct{})}
		h.sessions[name] = s
	}
	s.refs++
	role := RoleReader
	if !s.hasWriter {
		s.hasWriter = true
		role = RoleWriter
	}
	h.mu.Unlock()

	if opener {
		// The stream outlives this request: it is closed when the last client goes.
		stream, err := h.cfg.Opener.OpenConsole(context.WithoutCancel(ctx), name)
		h.mu.Lock()
		s.stream, s.openErr = stream, err
		if err != nil && h.sessions[name] == s {
			delete(h.sessions, name)
		}
		h.mu.Unlock()
		close(s.ready)
		if err == nil {
			go s.pump(h.log)
		}
	}
	select {
	case <-s.ready:
	case <-ctx.Done():
		h.detach(s, nil, role)
		return nil, "", ctx.Err()
	}
	if s.openErr != nil {
		h.detach(s, nil, role)
		return nil, "", s.openErr
	}
	return s, role, nil
}

// detach removes c (nil when the client never got a WebSocket); the last
// client closes the console stream.
func (h *Handler) detach(s *session, c *client, role string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c != nil {
		s.remove(c)
	}
	if role == RoleWriter {
		s.hasWriter = false
	}
	s.refs--
	if s.refs > 0 {
		return
	}
	if h.sessions[s.name] == s {
		delete(h.sessions, s.name)
	}
	if s.stream != nil {
		if err := s.stream.Close(); err != nil {
			h.log.Warn("console stream close", "server", s.name, "err", err)
		}
	}
}

// serve runs one client until it leaves, idles out, or the console ends.
// Idle and console-end close the WebSocket with a status (1008 policy
// violation, 1001 going away); the read loop then ends.
func (h *Handler) serve(ctx context.Context, s *session, c *client) string {
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var reason atomic.Value
	end := func(code websocket.StatusCode, r string) {
		if reason.CompareAndSwap(nil, r) {
			_ = c.conn.Close(code, r)
		}
	}

	// Console output → WebSocket.
	go func() {
		for {
			select {
			case <-gctx.Done():
				return
			case <-s.ended:
				end(websocket.StatusGoingAway, "console ended")
				return
			case b := <-c.out:
				c.touch()
				if err := c.conn.Write(gctx, websocket.MessageBinary, b); err != nil {
					return
				}
			}
		}
	}()
	// Idle watchdog: no input and no output for IdleTimeout ends the client.
	go func() {
		t := time.NewTimer(h.cfg.IdleTimeout)
		defer t.Stop()
		for {
			select {
			case <-gctx.Done():
				return
			case <-t.C:
				if left := h.cfg.IdleTimeout - time.Since(c.lastActive()); left > 0 {
					t.Reset(left)
					continue
				}
				end(websocket.StatusPolicyViolation, "idle timeout")
				return
			}
		}
	}()

	// WebSocket → console input (writer only).
	c.conn.SetReadLimit(64 << 10)
	for {
		_, b, err := c.conn.Read(ctx)
		if err != nil {
			break
		}
		c.touch()
		if c.role != RoleWriter || len(b) == 0 {
			continue
		}
		if _, err := s.stream.Write(b); err != nil {
			end(websocket.StatusGoingAway, "console ended")
			break
		}
	}
	if ctx.Err() != nil {
		end(websocket.StatusGoingAway, "server shutdown")
	}
	end(websocket.StatusNormalClosure, "client closed")
	r, _ := reason.Load().(string)
	return r
}

// session is one open console shared by its clients.
type session struct {
	name string
	// ready is closed once the open finished; stream and openErr are set
	// before and read only after.
	ready   chan struct{}
	stream  io.ReadWriteCloser
	openErr error
	ended   chan struct{} // closed when the stream's Read fails

	// guarded by Handler.mu
	refs      int
	hasWriter bool

	cmu     sync.Mutex
	clients map[*client]bool
}

func (s *session) isEnded() bool {
	select {
	case <-s.ended:
		return true
	default:
		return false
	}
}

func (s *session) add(c *client) {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	s.clients[c] = true
}

func (s *session) remove(c *client) {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	delete(s.clients, c)
}

// pump copies console output to every client; a client whose buffer is full
// misses that chunk rather than stalling the others.
func (s *session) pump(log *slog.Logger) {
	defer close(s.ended)
	buf := make([]byte, 4096)
	for {
		n, err := s.stream.Read(buf)
		if n > 0 {
			b := append([]byte(nil), buf[:n]...)
			s.cmu.Lock()
			for c := range s.clients {
				select {
				case c.out <- b:
				default:
					log.Warn("console client too slow; output dropped", "server", s.name, "bytes", n)
				}
			}
			s.cmu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// client is one attached WebSocket.
type client struct {
	conn *websocket.Conn
	role string
	out  chan []byte
	last atomic.Int64 // unix nanoseconds of the last input or output
}

func (c *client) touch()                { c.last.Store(time.Now().UnixNano()) }
func (c *client) lastActive() time.Time { return time.Unix(0, c.last.Load()) }
