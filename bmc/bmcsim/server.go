package bmcsim

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Quirks are vendor behaviours the emulator reproduces. [DefaultQuirks]
// picks them by the tree's Manufacturer; each field names what it models.
type Quirks struct {
	// RejectBootModeInPatch answers 400 to any PATCH carrying
	// Boot.BootSourceOverrideMode, even with the current value (HPE iLO 5;
	// stmcginnis/gofish#507 shows iLO's strict PATCH handling).
	RejectBootModeInPatch bool
	// BootModeWhenOmitted, if set, is the mode a boot PATCH without
	// BootSourceOverrideMode leaves behind (Supermicro X12/X13 revert to
	// their default when the property is left out).
	BootModeWhenOmitted string
	// RequireIfMatch answers 428 to a PATCH without If-Match on resources
	// that carry @odata.etag (Lenovo XCC).
	RequireIfMatch bool
	// ETagGzipSuffix appends "-gzip" inside the ETag header (Apache
	// mod_deflate in front of some BMC web servers); If-Match must still
	// carry the plain value.
	ETagGzipSuffix bool
	// RejectInsertParams are InsertMedia parameters answered with 400
	// ActionParameterNotSupported (Supermicro refuses the optional fields).
	RejectInsertParams []string
	// RejectWriteProtectedFalse answers 400 to InsertMedia with
	// WriteProtected=false (iDRAC).
	RejectWriteProtectedFalse bool
	// RequireInsertParams are InsertMedia parameters answered with 400
	// ActionParameterMissing when absent (AMI MegaRAC asks for
	// TransferProtocolType; see sushy's *_required_error.json samples).
	RequireInsertParams []string
	// KeepImageAfterEject leaves Image set after EjectMedia, with
	// Inserted=false.
	KeepImageAfterEject bool
	// NoSessions answers 405 on POST to the Sessions collection, so
	// clients must use Basic auth.
	NoSessions bool
	// RefuseResetTypes are ResetType values answered with 400
	// ActionParameterValueNotInList even where the tree lists no
	// AllowableValues (BMCs that do not advertise what they accept).
	RefuseResetTypes []string
	// BootPatchAnswers400 applies a valid boot PATCH but answers 400 with
	// a GeneralError body (a BMC whose error path is wrong; read-back tests).
	BootPatchAnswers400 bool
	// StoreContinuousForOnce stores BootSourceOverrideEnabled=Continuous
	// when Once is requested, answering 204: the third-party Redfish
	// Redfish emulators in third-party labs and KubeVirt's virtbmc do so (public report
	// kubevirtbmc/kubevirtbmc#165: "Once is silently coerced to
	// Continuous"); BMCs that only implement a persistent override map
	// Once onto it the same way.
	StoreContinuousForOnce bool
	// IgnoreOnce accepts a PATCH asking for BootSourceOverrideEnabled=Once
	// with 204 and changes nothing (the old override stays, usually
	// Disabled): public report v1k0d3n/kubevirt-redfish#28 ("the call
	// passes, but all it does is set some annotations").
	IgnoreOnce bool
	// BasicOnly models a BMC without a session service: the service root
	// has no Links.Sessions and no SessionService, POST to the Sessions
	// path answers 401 with `WWW-Authenticate: Basic realm=...`, and every
	// unauthenticated request is challenged the same way. The third-party
	// third-party labs' Redfish emulators behave so; sushy's bare_minimum_root.json
	// fixture (openstack-sushy-json-samples) is a service root with no
	// session service at all.
	BasicOnly bool
	// NoAuth serves everything without authentication, as the DMTF
	// Redfish-Mockup-Server and lab BMCs with authentication turned off
	// do: credentials, when sent, are ignored.
	NoAuth bool
	// NoLastResetTime hides ComputerSystem.LastResetTime and BootProgress
	// and never updates them: the HPE iLO 5 and Lenovo XCC fixture trees
	// report neither, the Supermicro X13 tree no LastResetTime.
	NoLastResetTime bool
	// NoPowerCycle leaves PowerCycle out of the ResetType allowable values
	// (inline and in the ActionInfo) and refuses it, as HPE iLO 5 and
	// Lenovo XCC do (their fixture trees list no PowerCycle).
	NoPowerCycle bool
	// ContinuousReverts accepts BootSourceOverrideEnabled=Continuous (it
	// reads back, 204) but honours it for one boot only: the next Reset
	// that starts the host consumes it and the override reads Disabled
	// with target None afterwards, the backend being told so. BMCs whose
	// Redfish boot override is a layer over IPMI boot flags behave so
	// when they drop the "persistent" bit (IPMI 2.0 §28.12 boot flags are
	// cleared after the next boot unless persistent), and so do the
	// firmwares that implement only a one-time override.
	ContinuousReverts bool
	// NetworkFirst accepts and stores every boot override (it reads back)
	// but the host keeps booting by its own boot order, which puts the
	// network first: the backend is always told Pxe, Continuous. Servers
	// whose BIOS/UEFI boot order lists PXE first and whose BMC drops the
	// override (some Supermicro and Gigabyte firmware after a BIOS
	// update resets the order) behave so, and so do libvirt-backed BMCs
	// (sushy-tools' libvirt driver, VirtualBMC) on a domain whose <boot
	// order> puts the NIC first: after a deploy the machine network-boots
	// every time, and only the boot script can send it to its disk.
	NetworkFirst bool
}

// vendorQuirks is the emulator's behaviour per manufacturer prefix
// (lower case), first match wins. Each row names what it models.
var vendorQuirks = []struct {
	prefix string
	q      Quirks
}{
	// iLO 5: 400 on any PATCH carrying BootSourceOverrideMode.
	{"hpe", Quirks{RejectBootModeInPatch: true}},
	{"hp", Quirks{RejectBootModeInPatch: true}},
	// X12/X13: the mode reverts when omitted; InsertMedia takes only Image.
	{"supermicro", Quirks{BootModeWhenOmitted: "Legacy", RejectInsertParams: []string{"Inserted", "WriteProtected", "TransferProtocolType", "TransferMethod"}}},
	// iDRAC: InsertMedia refuses WriteProtected=false.
	{"dell", Quirks{RejectWriteProtectedFalse: true}},
	// XCC: If-Match required on PATCH (strong @odata.etag everywhere).
	{"lenovo", Quirks{RequireIfMatch: true}},
}

// DefaultQuirks returns the quirks the emulator applies to a tree from
// manufacturer (the first System's Manufacturer); none for others.
func DefaultQuirks(manufacturer string) Quirks {
	m := strings.ToLower(manufacturer)
	for _, v := range vendorQuirks {
		if strings.HasPrefix(m, v.prefix) {
			q := v.q
			q.RejectInsertParams = slices.Clone(q.RejectInsertParams)
			return q
		}
	}
	return Quirks{}
}

// Config configures a [Server]. Only Tree is required.
type Config struct {
	// Tree is the resource tree to serve; shared, never modified.
	Tree *Tree
	// Username and Password are the one account; zero means "admin" and
	// "password".
	Username, Password string
	// LockoutThreshold locks the account after this many consecutive failed
	// logins (Basic or session); zero disables lockout.
	LockoutThreshold int
	// LockoutDuration is how long a lockout lasts; zero means 5 minutes.
	LockoutDuration time.Duration
	// Quirks are the vendor behaviours; nil means DefaultQuirks(Tree.Manufacturer).
	Quirks *Quirks
	// Power is the machine behind the BMC; nil means a [MemoryPower]
	// starting in the tree's PowerState.
	Power PowerBackend
	// SessionTimeout expires sessions idle this long; zero means the tree's
	// SessionService.SessionTimeout (seconds; Dell 1800, Lenovo 300), and
	// no expiry when the tree has none. Negative disables expiry.
	SessionTimeout time.Duration
	// Now is the clock for session expiry and lockout; nil means time.Now.
	Now func() time.Time
	// RecordLimit caps the recorded requests, dropping the oldest; zero
	// means 4096.
	RecordLimit int
	// Logger receives one Debug line per request; nil discards.
	Logger *slog.Logger
	// Firmware tunes the BIOS, update, volume and Secure Boot models; the
	// zero value is the default (see [Firmware]).
	Firmware Firmware
	// PowerTransition is how long a power change takes after an accepted
	// ComputerSystem.Reset: meanwhile PowerState reads "PoweringOn" or
	// "PoweringOff" (iDRAC 9, iLO 5 and bmcweb report these while the host
	// powers up or down), or keeps the old state with
	// PowerTransitionKeepsState. Zero: power changes show at once.
	PowerTransition time.Duration
	// PowerTransitionKeepsState makes PowerState keep reading the state
	// before the Reset during PowerTransition instead of PoweringOn or
	// PoweringOff, as BMCs that poll the host's power every few seconds
	// do (Supermicro X11, IPMI-derived Redfish implementations).
	PowerTransitionKeepsState bool
	// FetchMedia makes VirtualMedia.InsertMedia (and a PATCH setting
	// Image) fetch the start of the image URL before accepting it, as
	// real BMCs do (iDRAC, iLO and XCC download or stream the image from
	// the URL and refuse an insert they cannot read): an unreachable URL
	// or an HTTP error fails the insert with 400 and a DMTF Base message,
	// ResourceAtUriUnauthorized for 401/403 and CouldNotEstablishConnection
	// otherwise, and the slot stays empty. Zero: the URL is not read.
	FetchMedia bool
	// MediaClient is the HTTP client FetchMedia uses; nil means one with a
	// 30-second timeout.
	MediaClient *http.Client
}

// Request is one request the emulator received, as recorded for tests.
type Request struct {
	Method string
	// Path is the URL path as sent, without query.
	Path string
	// Body is the decoded JSON body (nil when empty); a "Password" member
	// is replaced by "<redacted>".
	Body map[string]any
	// Auth is "session", "basic" or "" (none).
	Auth string
	// IfMatch is the If-Match header, "" when absent.
	IfMatch string
	// Status is the HTTP status answered (0 for a dropped connection).
	Status int
}

// String renders r as "METHOD /path {json}" for diffs in tests.
func (r Request) String() string {
	s := r.Method + " " + r.Path
	if r.Body != nil {
		b, _ := json.Marshal(r.Body)
		s += " " + string(b)
	}
	return s
}

// Server is one emulated BMC: an http.Handler over a shared [Tree] with its
// own state. Safe for concurrent use.
type Server struct {
	cfg    Config
	quirks Quirks
	power  PowerBackend
	log    *slog.Logger

	sessionTimeout time.Duration

	mu       sync.Mutex
	over     map[string]*node    // copy-on-write overlay, same keys as Tree.nodes
	sessions map[string]*session // by token
	failed   int
	lockedAt time.Time
	faults   []*Fault
	tasks    map[string]*task
	seq      int
	resets   int // accepted resets that start the host (LastResetTime stamps)
	fwst     *fwState

	// transMu guards trans, the power change in progress
	// (Config.PowerTransition).
	transMu sync.Mutex
	trans   powerTransition

	// recMu guards reqs only, so handlers holding mu can still record.
	recMu sync.Mutex
	reqs  []Request
}

// session is one login.
type session struct {
	url      string
	lastUsed time.Time
}

func (s *Server) now() time.Time {
	if s.cfg.Now != nil {
		return s.cfg.Now()
	}
	return time.Now()
}

// New returns an emulator serving cfg.Tree. It copies nothing from the tree
// until a resource is written, so instances are cheap.
func New(cfg Config) (*Server, error) {
	if cfg.Tree == nil {
		return nil, errors.New("bmcsim: new: Config.Tree is nil")
	}
	if cfg.Username == "" {
		cfg.Username = "admin"
	}
	if cfg.Password == "" {
		cfg.Password = "password"
	}
	if cfg.RecordLimit <= 0 {
		cfg.RecordLimit = 4096
	}
	if cfg.LockoutDuration == 0 {
		cfg.LockoutDuration = 5 * time.Minute
	}
	s := &Server{cfg: cfg, log: cfg.Logger, over: map[string]*node{}, sessions: map[string]*session{}, tasks: map[string]*task{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Quirks != nil {
		s.quirks = *cfg.Quirks
	} else {
		s.quirks = DefaultQuirks(cfg.Tree.Manufacturer)
	}
	switch {
	case cfg.SessionTimeout > 0:
		s.sessionTimeout = cfg.SessionTimeout
	case cfg.SessionTimeout == 0:
		if ss := cfg.Tree.lookup("/redfish/v1/SessionService"); ss != nil {
			if sec, ok := ss.body["SessionTimeout"].(float64); ok && sec > 0 {
				s.sessionTimeout = time.Duration(sec) * time.Second
			}
		}
	}
	s.power = cfg.Power
	if s.power == nil {
		on := false
		if sys := cfg.Tree.firstMember("/redfish/v1/systems"); sys != nil {
			on = sys.body["PowerState"] == "On"
		}
		s.power = NewMemoryPower(on)
	}
	return s, nil
}

// Requests returns a copy of the requests recorded so far.
func (s *Server) Requests() []Request {
	s.recMu.Lock()
	defer s.recMu.Unlock()
	return slices.Clone(s.reqs)
}

// ClearRequests forgets the recorded requests.
func (s *Server) ClearRequests() {
	s.recMu.Lock()
	s.reqs = nil
	s.recMu.Unlock()
}

// Sessions returns the number of live sessions.
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// ExpireSessions invalidates every session, as a BMC's session timeout does.
func (s *Server) ExpireSessions() {
	s.mu.Lock()
	clear(s.sessions)
	s.mu.Unlock()
}

// Get returns the current body of the resource at path (with overlay and
// live PowerState), or nil.
func (s *Server) Get(path string) map[string]any {
	s.mu.Lock()
	n := s.nodeLocked(path)
	s.mu.Unlock()
	if n == nil {
		return nil
	}
	b := deepCopy(n.body).(map[string]any)
	if _, ok := b["PowerState"]; ok && isSystem(b) {
		if ps, err := s.powerState(context.Background()); err == nil {
			b["PowerState"] = ps
		}
	}
	return b
}

// Patch changes the resource at path the way f edits its body, as a
// hardware change would (a failed power supply turning the System's
// Status.HealthRollup to "Critical"); the change is kept in the overlay
// with a new ETag, like a PATCH from a client. It reports false when the
// tree has no resource at path.
func (s *Server) Patch(path string, f func(body map[string]any)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodeLocked(path) == nil {
		return false
	}
	s.mutateLocked(path, f)
	return true
}

func isSystem(b map[string]any) bool {
	t, _ := b["@odata.type"].(string)
	return strings.Contains(t, "ComputerSystem.")
}

func (s *Server) nodeLocked(p string) *node {
	k := normPath(p)
	if n, ok := s.over[k]; ok {
		return n
	}
	return s.cfg.Tree.nodes[k]
}

// mutate runs f on a private copy of the resource at p and stores the
// result in the overlay with a new ETag. Caller holds s.mu.
func (s *Server) mutateLocked(p string, f func(body map[string]any)) {
	k := normPath(p)
	n := s.nodeLocked(p)
	if n == nil {
		return
	}
	body := deepCopy(n.body).(map[string]any)
	f(body)
	raw, _ := json.Marshal(body)
	if old, ok := body["@odata.etag"].(string); ok && old != "" {
		e := hashETag(raw)
		if strings.HasPrefix(old, "W/") {
			e = "W/" + e
		}
		body["@odata.etag"] = e
		raw, _ = json.Marshal(body)
	}
	s.over[k] = newNode(n.path, raw, body)
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	limit := int64(1 << 20)
	if strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/") {
		limit = 64 << 20 // a pushed firmware image
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, limit))
	if s.restartGate(w, r) {
		return
	}
	var decoded map[string]any
	if strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/") {
		// A multipart push update: the handler parses the raw body.
		r.Body = io.NopCloser(bytes.NewReader(body))
		body = nil
	}
	if len(body) > 0 {
		if err := json.Unmarshal(body, &decoded); err != nil {
			writeError(s.recorder(w, r, nil), http.StatusBadRequest, "Base.1.8.MalformedJSON", "The request body submitted was malformed JSON.")
			return
		}
	}
	if f := s.matchFault(r); f != nil {
		switch f.Kind {
		case FaultDrop:
			s.record(r, decoded, "", 0)
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
					return
				}
			}
			panic(http.ErrAbortHandler)
		case FaultDropAfter:
			s.serve(s.recorder(httptest.NewRecorder(), r, decoded), r, decoded)
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
					return
				}
			}
			panic(http.ErrAbortHandler)
		case FaultSlow:
			t := time.NewTimer(f.Delay)
			select {
			case <-r.Context().Done():
				t.Stop()
				s.record(r, decoded, "", 0) // client gave up; not performed
				// No answer at all: a plain return would make net/http
				// send an implicit empty 200, which a client still
				// reading would take for a (non-Redfish) answer.
				panic(http.ErrAbortHandler)
			case <-t.C:
			}
		case FaultUnavailable:
			if f.RetryAfter > 0 {
				w.Header().Set("Retry-After", strconv.Itoa(int((f.RetryAfter+time.Second-1)/time.Second)))
			}
			writeError(s.recorder(w, r, decoded), http.StatusServiceUnavailable, "Base.1.8.ServiceTemporarilyUnavailable", "The service is temporarily unavailable.")
			return
		case FaultBadGateway:
			writeError(s.recorder(w, r, decoded), http.StatusBadGateway, "Base.1.8.GeneralError", "Bad gateway.")
			return
		case FaultExpireSession:
			s.ExpireSessions()
		case FaultAccepted:
			s.accept(w, r, f, decoded)
			return
		}
	}
	s.serve(s.recorder(w, r, decoded), r, decoded)
}

// restartGate answers r as a BMC restarting after a firmware update does
// (a dropped connection, then 503) and reports whether it did.
func (s *Server) restartGate(w http.ResponseWriter, r *http.Request) bool {
	s.mu.Lock()
	restart := s.restartingLocked()
	s.mu.Unlock()
	switch restart {
	case -1:
		s.record(r, nil, "", 0)
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				c.Close()
				return true
			}
		}
		panic(http.ErrAbortHandler)
	case http.StatusServiceUnavailable:
		writeError(s.recorder(w, r, nil), http.StatusServiceUnavailable, "Base.1.8.ServiceTemporarilyUnavailable", "The service is temporarily unavailable.")
		return true
	}
	return false
}

// recWriter records its request when the status is written, before any
// byte reaches the client, so Requests() after a reply always includes it.
type recWriter struct {
	http.ResponseWriter
	s    *Server
	r    *http.Request
	body map[string]any
	auth string
	done bool
}

func (s *Server) recorder(w http.ResponseWriter, r *http.Request, body map[string]any) *recWriter {
	return &recWriter{ResponseWriter: w, s: s, r: r, body: body}
}

// WriteHeader implements http.ResponseWriter.
func (w *recWriter) WriteHeader(code int) {
	if !w.done {
		w.done = true
		w.s.record(w.r, w.body, w.auth, code)
		w.s.log.Debug("bmcsim request", "method", w.r.Method, "path", w.r.URL.Path, "status", code)
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *recWriter) Write(b []byte) (int, error) {
	if !w.done {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// serve authenticates and routes one request; w records it.
func (s *Server) serve(w *recWriter, r *http.Request, decoded map[string]any) {
	p := normPath(r.URL.Path)
	public := p == "/redfish" || p == "/redfish/v1" || (p == "/redfish/v1/sessionservice/sessions" && r.Method == http.MethodPost && !s.quirks.BasicOnly)
	if s.quirks.BasicOnly && (p == "/redfish/v1/sessionservice" || strings.HasPrefix(p, "/redfish/v1/sessionservice/")) && r.Method != http.MethodPost {
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "The resource at the URI "+r.URL.Path+" was not found.")
		return
	}
	if !public && !s.quirks.NoAuth {
		auth, ok, status := s.authenticate(r)
		w.auth = auth
		if !ok {
			if s.quirks.BasicOnly {
				w.Header().Set("WWW-Authenticate", `Basic realm="Redfish"`)
				writeError(w, status, "Base.1.8.AccessDenied", "Authorization required.")
				return
			}
			writeError(w, status, "Base.1.8.InsufficientPrivilege", "There are insufficient privileges for the account or credentials associated with the current session to perform the requested operation.")
			return
		}
	}
	s.route(w, r, p, decoded)
}

func (s *Server) record(r *http.Request, body map[string]any, auth string, status int) {
	if body != nil {
		body = deepCopy(body).(map[string]any)
		if _, ok := body["Password"]; ok {
			body["Password"] = "<redacted>"
		}
	}
	s.recMu.Lock()
	if len(s.reqs) >= s.cfg.RecordLimit {
		s.reqs = slices.Delete(s.reqs, 0, len(s.reqs)-s.cfg.RecordLimit+1)
	}
	s.reqs = append(s.reqs, Request{Method: r.Method, Path: r.URL.Path, Body: body, Auth: auth, IfMatch: r.Header.Get("If-Match"), Status: status})
	s.recMu.Unlock()
}

// authenticate checks X-Auth-Token or Basic credentials. It returns the
// kind used, whether it passed, and the status to answer if not.
func (s *Server) authenticate(r *http.Request) (string, bool, int) {
	if tok := r.Header.Get("X-Auth-Token"); tok != "" {
		s.mu.Lock()
		ss, ok := s.sessions[tok]
		now := s.now()
		if ok && s.sessionTimeout > 0 && now.Sub(ss.lastUsed) > s.sessionTimeout {
			delete(s.sessions, tok) // idle too long, as SessionService.SessionTimeout says
			ok = false
		}
		if ok {
			ss.lastUsed = now
		}
		s.mu.Unlock()
		return "session", ok, http.StatusUnauthorized
	}
	if u, p, ok := r.BasicAuth(); ok {
		if !s.checkLogin(u, p) {
			return "basic", false, http.StatusUnauthorized
		}
		return "basic", true, 0
	}
	return "", false, http.StatusUnauthorized
}

// checkLogin verifies credentials and applies the lockout policy.
func (s *Server) checkLogin(user, pass string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.lockedAt.IsZero() {
		if s.now().Sub(s.lockedAt) < s.cfg.LockoutDuration {
			return false
		}
		s.lockedAt, s.failed = time.Time{}, 0
	}
	ok := subtle.ConstantTimeCompare([]byte(user), []byte(s.cfg.Username)) == 1 &&
		subtle.ConstantTimeCompare([]byte(pass), []byte(s.cfg.Password)) == 1
	if ok {
		s.failed = 0
		return true
	}
	s.failed++
	if s.cfg.LockoutThreshold > 0 && s.failed >= s.cfg.LockoutThreshold {
		s.lockedAt = s.now()
	}
	return false
}

// Locked reports whether the account is locked out.
func (s *Server) Locked() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.lockedAt.IsZero() && s.now().Sub(s.lockedAt) < s.cfg.LockoutDuration
}

func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Server) route(w http.ResponseWriter, r *http.Request, p string, body map[string]any) int {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		return s.get(w, r, p)
	case http.MethodPost:
		switch {
		case p == "/redfish/v1/sessionservice/sessions":
			return s.login(w, body)
		case strings.HasSuffix(p, "/actions/computersystem.reset"):
			return s.reset(w, r, p, body)
		case strings.HasSuffix(p, "/actions/virtualmedia.insertmedia"):
			return s.insertMedia(r.Context(), w, p, body)
		case strings.HasSuffix(p, "/actions/virtualmedia.ejectmedia"):
			return s.ejectMedia(r.Context(), w, p)
		case strings.HasSuffix(p, "/actions/updateservice.simpleupdate"):
			return s.simpleUpdate(r.Context(), w, body)
		case s.isMultipartPush(p):
			raw, _ := io.ReadAll(r.Body)
			return s.multipartUpdate(w, r, raw)
		case strings.HasSuffix(p, "/volumes"):
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.createVolumeLocked(w, p, body)
		case p == "/redfish/v1/managers/idrac.embedded.1/jobs" && s.isDell():
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.postJobLocked(w, body)
		}
		return writeError(w, http.StatusMethodNotAllowed, "Base.1.8.OperationNotAllowed", "The HTTP method is not allowed for this resource.")
	case http.MethodPatch:
		return s.patch(w, r, p, body)
	case http.MethodDelete:
		if strings.HasPrefix(p, "/redfish/v1/sessionservice/sessions/") {
			return s.logout(w, r, p)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if n := s.nodeLocked(p); n != nil && isVolume(n.body) {
			return s.deleteVolumeLocked(w, p)
		}
		return writeError(w, http.StatusMethodNotAllowed, "Base.1.8.OperationNotAllowed", "The HTTP method is not allowed for this resource.")
	}
	return writeError(w, http.StatusMethodNotAllowed, "Base.1.8.OperationNotAllowed", "The HTTP method is not allowed for this resource.")
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, p string) int {
	if st, ok := s.serveTask(w, p); ok {
		return st
	}
	if st, ok := s.serveFirmwareGet(w, p); ok {
		return st
	}
	s.mu.Lock()
	n := s.nodeLocked(p)
	var live []string
	if p == "/redfish/v1/sessionservice/sessions" {
		for _, ss := range s.sessions {
			live = append(live, ss.url)
		}
	}
	s.mu.Unlock()
	if n == nil {
		return writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "The resource at the URI "+r.URL.Path+" was not found.")
	}
	raw := n.raw
	if isSystem(n.body) {
		if ps, err := s.powerState(r.Context()); err == nil {
			raw = n.rawWithPower(ps)
		}
		if s.quirks.NoLastResetTime || s.quirks.NoPowerCycle {
			var b map[string]any
			_ = json.Unmarshal(raw, &b)
			if s.quirks.NoLastResetTime {
				delete(b, "LastResetTime")
				delete(b, "BootProgress")
			}
			if s.quirks.NoPowerCycle {
				act, _ := obj(b, "Actions")["#ComputerSystem.Reset"].(map[string]any)
				if v, ok := act["ResetType@Redfish.AllowableValues"].([]any); ok {
					act["ResetType@Redfish.AllowableValues"] = withoutPowerCycle(v)
				}
			}
			raw, _ = json.Marshal(b)
		}
	}
	if s.quirks.NoPowerCycle && strings.Contains(p, "resetactioninfo") {
		var b map[string]any
		_ = json.Unmarshal(raw, &b)
		ps, _ := b["Parameters"].([]any)
		for _, pm := range ps {
			if m, ok := pm.(map[string]any); ok && m["Name"] == "ResetType" {
				if v, ok := m["AllowableValues"].([]any); ok {
					m["AllowableValues"] = withoutPowerCycle(v)
				}
			}
		}
		raw, _ = json.Marshal(b)
	}
	if p == "/redfish/v1" && s.quirks.BasicOnly {
		b := deepCopy(n.body).(map[string]any)
		delete(b, "SessionService")
		if l, ok := b["Links"].(map[string]any); ok {
			delete(l, "Sessions")
		}
		raw, _ = json.Marshal(b)
	}
	if live != nil || p == "/redfish/v1/sessionservice/sessions" {
		b := deepCopy(n.body).(map[string]any)
		slices.Sort(live)
		ms := make([]any, 0, len(live))
		for _, u := range live {
			ms = append(ms, map[string]any{"@odata.id": u})
		}
		b["Members"], b["Members@odata.count"] = ms, len(ms)
		raw, _ = json.Marshal(b)
	}
	w.Header().Set("ETag", s.etagHeader(n.etag))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = w.Write(raw)
	}
	return http.StatusOK
}

func (s *Server) etagHeader(e string) string {
	if s.quirks.ETagGzipSuffix && strings.HasSuffix(e, `"`) {
		return strings.TrimSuffix(e, `"`) + `-gzip"`
	}
	return e
}

func (s *Server) login(w http.ResponseWriter, body map[string]any) int {
	if s.quirks.NoAuth {
		// No authentication: a session is handed out to anyone.
		body = map[string]any{"UserName": s.cfg.Username, "Password": s.cfg.Password}
	}
	if s.quirks.NoSessions {
		return writeError(w, http.StatusMethodNotAllowed, "Base.1.8.OperationNotAllowed", "Sessions are not supported.")
	}
	u, _ := body["UserName"].(string)
	pw, _ := body["Password"].(string)
	if !s.checkLogin(u, pw) {
		return writeError(w, http.StatusUnauthorized, "Base.1.8.NoValidSession", "Invalid username or password.")
	}
	tok := newToken()
	s.mu.Lock()
	s.seq++
	loc := fmt.Sprintf("/redfish/v1/SessionService/Sessions/sim%d", s.seq)
	s.sessions[tok] = &session{url: loc, lastUsed: s.now()}
	s.mu.Unlock()
	w.Header().Set("X-Auth-Token", tok)
	w.Header().Set("Location", loc)
	return writeJSON(w, http.StatusCreated, map[string]any{
		"@odata.id": loc, "@odata.type": "#Session.v1_0_0.Session", "Id": strings.TrimPrefix(loc, "/redfish/v1/SessionService/Sessions/"), "UserName": u,
	})
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, p string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for tok, ss := range s.sessions {
		if normPath(ss.url) == p {
			delete(s.sessions, tok)
			w.WriteHeader(http.StatusNoContent)
			return http.StatusNoContent
		}
	}
	return writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "The resource at the URI "+r.URL.Path+" was not found.")
}

// writeError writes a Redfish error body (DSP0266 §9.6) and returns code.
func writeError(w http.ResponseWriter, code int, msgID, msg string, args ...string) int {
	ext := map[string]any{"@odata.type": "#Message.v1_1_1.Message", "MessageId": msgID, "Message": msg, "Severity": "Warning"}
	if len(args) > 0 {
		ext["MessageArgs"] = args
	}
	return writeJSON(w, code, map[string]any{"error": map[string]any{
		"code": msgID, "message": msg, "@Message.ExtendedInfo": []any{ext},
	}})
}

func writeJSON(w http.ResponseWriter, code int, v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":{"code":"Base.1.0.InternalError","message":"cannot encode the answer"}}`)
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	// Sent with its length, as OpenBMC's bmcweb, iDRAC and iLO send
	// theirs, rather than chunked as Go would send a body over 2 KiB.
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(code)
	_, _ = w.Write(b)
	return code
}

// Serve is a helper for the standalone `machina bmcsim`: it serves
// h on ln until ctx is done, then shuts down and returns nil.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("bmcsim: serve: %w", err)
	}
}

func obj(m map[string]any, k string) map[string]any { o, _ := m[k].(map[string]any); return o }

func withoutPowerCycle(v []any) []any {
	out := make([]any, 0, len(v))
	for _, e := range v {
		if e != "PowerCycle" {
			out = append(out, e)
		}
	}
	return out
}

// Modes are the simulated BMC quirks (service, session, auth, boot override
// and reset behaviours of real BMCs) by name, for `machina bmcsim
// --mode` and tests; see each Quirks field for the BMCs that behave so.
var Modes = map[string]func(*Quirks){
	"basic-only":         func(q *Quirks) { q.BasicOnly = true },
	"no-sessions":        func(q *Quirks) { q.NoSessions = true },
	"no-auth":            func(q *Quirks) { q.NoAuth = true },
	"once-to-continuous": func(q *Quirks) { q.StoreContinuousForOnce = true },
	"once-ignored":       func(q *Quirks) { q.IgnoreOnce = true },
	"continuous-reverts": func(q *Quirks) { q.ContinuousReverts = true },
	"network-first":      func(q *Quirks) { q.NetworkFirst = true },
	"no-powercycle":      func(q *Quirks) { q.NoPowerCycle = true },
	"no-lastresettime":   func(q *Quirks) { q.NoLastResetTime = true },
}

// SetMode turns on the behaviour called name (a key of Modes), or returns
// an error naming the known ones.
func (q *Quirks) SetMode(name string) error {
	f, ok := Modes[name]
	if !ok {
		names := make([]string, 0, len(Modes))
		for n := range Modes {
			names = append(names, n)
		}
		slices.Sort(names)
		return fmt.Errorf("bmcsim: unknown mode %q (want one of %s)", name, strings.Join(names, ", "))
	}
	f(q)
	return nil
}
