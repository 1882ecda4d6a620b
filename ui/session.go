package ui

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/machina-metal/machina/state"
)

// CookieName is the session cookie. Its value is 32 random bytes
// (base64url); the server keeps only their SHA-256.
const CookieName = "machina_session"

// ErrNoSession is returned by a ConsoleAuthenticate'd check for a request
// that carries neither a UI session nor what the fallback accepts.
var ErrNoSession = errors.New("ui: no session")

// session is one logged-in browser. token is the admin token the operator
// typed: kept in memory only (never logged, never sent back), used to
// forward reads to the admin API and re-checked on every request so that
// revoking the token ends the session.
type session struct {
	actor   string // the admin token's name: the Actor of audit events
	token   string
	csrf    string
	created time.Time
	expires time.Time
	// done is closed when the session ends early (logout, eviction,
	// revocation noticed); long-lived requests (event stream, console) end
	// with it or at expires, whichever comes first.
	done     chan struct{}
	doneOnce sync.Once
}

func (s *session) end() { s.doneOnce.Do(func() { close(s.done) }) }

// bind returns a context that ends with ctx, at the session's expiry, or
// when the session ends.
func (s *session) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithDeadline(ctx, s.expires)
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// sessions is the server-side session table, keyed by the SHA-256 of the
// cookie value. Safe for concurrent use.
type sessions struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu sync.Mutex
	m  map[[32]byte]*session
}

func newSessions(ttl time.Duration, max int, now func() time.Time) *sessions {
	return &sessions{ttl: ttl, max: max, now: now, m: map[[32]byte]*session{}}
}

func randomString() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}

// create starts a session and returns its cookie value.
func (ss *sessions) create(actor, token string) (string, *session) {
	id := randomString()
	now := ss.now()
	s := &session{actor: actor, token: token, csrf: randomString(), created: now, expires: now.Add(ss.ttl), done: make(chan struct{})}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for k, v := range ss.m {
		if !now.Before(v.expires) {
			v.end()
			delete(ss.m, k)
		}
	}
	for len(ss.m) >= ss.max { // evict the oldest
		var oldest [32]byte
		var at time.Time
		for k, v := range ss.m {
			if at.IsZero() || v.created.Before(at) {
				oldest, at = k, v.created
			}
		}
		ss.m[oldest].end()
		delete(ss.m, oldest)
	}
	ss.m[sha256.Sum256([]byte(id))] = s
	return id, s
}

// get returns the live session of cookie value id, or nil.
func (ss *sessions) get(id string) *session {
	if id == "" {
		return nil
	}
	k := sha256.Sum256([]byte(id))
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[k]
	if s == nil {
		return nil
	}
	if !ss.now().Before(s.expires) {
		s.end()
		delete(ss.m, k)
		return nil
	}
	return s
}

func (ss *sessions) delete(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	k := sha256.Sum256([]byte(id))
	if s := ss.m[k]; s != nil {
		s.end()
	}
	delete(ss.m, k)
}

func (ss *sessions) len() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.m)
}

type sessionKey struct{}

// principalKey marks a request the UI authenticated before handing it to
// Config.Console; a client cannot set a context value.
type principalKey struct{}

// Principal returns the admin token name of the UI session that the UI
// verified for r before forwarding it to Config.Console, and true; or ""
// and false for any request that did not come through the UI.
func Principal(r *http.Request) (string, bool) {
	p, ok := r.Context().Value(principalKey{}).(string)
	return p, ok && p != ""
}

// ConsoleAuthenticate returns a console.Config.Authenticate function that
// accepts requests the UI forwarded (Principal) and passes every other
// request to fallback (the bearer-token check of machinactl's clients).
// A nil fallback refuses them with ErrNoSession.
func ConsoleAuthenticate(fallback func(*http.Request) (string, error)) func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		if p, ok := Principal(r); ok {
			return "ui:" + p, nil
		}
		if fallback == nil {
			return "", ErrNoSession
		}
		return fallback(r)
	}
}

// sessionFrom returns r's live session whose admin token is still valid,
// or nil. A revoked token ends the session here.
func (u *UI) sessionFrom(r *http.Request) *session {
	c, err := r.Cookie(CookieName)
	if err != nil {
		return nil
	}
	s := u.sessions.get(c.Value)
	if s == nil {
		return nil
	}
	if _, err := u.store.AuthenticateAdmin(s.token); err != nil {
		u.sessions.delete(c.Value)
		return nil
	}
	return s
}

func sessionOf(r *http.Request) *session {
	s, _ := r.Context().Value(sessionKey{}).(*session)
	return s
}

// authed requires a session; without one it answers 401 (reads, WebSocket).
func (u *UI) authed(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := u.sessionFrom(r)
		if s == nil {
			http.Error(w, "ui: not logged in", http.StatusUnauthorized)
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, s)))
	}
}

// page requires a session; without one it redirects to the login form.
func (u *UI) page(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := u.sessionFrom(r)
		if s == nil {
			http.Redirect(w, r, "/ui/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		next(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, s)))
	}
}

// change guards every state-changing request: a session, a same-origin
// request (Origin header, or Sec-Fetch-Site, when the browser sends them)
// and the session's CSRF token in the "csrf" form field or the
// X-CSRF-Token header (synchroniser token, OWASP CSRF cheat sheet).
// Refusals answer 403 and are logged.
func (u *UI) change(next http.HandlerFunc) http.HandlerFunc {
	return u.authed(func(w http.ResponseWriter, r *http.Request) {
		s := sessionOf(r)
		if !sameOrigin(r) {
			u.log.Warn("ui change refused", "reason", "cross-origin", "path", r.URL.Path, "actor", s.actor)
			http.Error(w, "ui: cross-origin request refused", http.StatusForbidden)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		tok := r.Header.Get("X-CSRF-Token")
		if tok == "" {
			tok = r.PostFormValue("csrf")
		}
		if subtle.ConstantTimeCompare([]byte(tok), []byte(s.csrf)) != 1 {
			u.log.Warn("ui change refused", "reason", "csrf token", "path", r.URL.Path, "actor", s.actor)
			http.Error(w, "ui: missing or wrong CSRF token", http.StatusForbidden)
			return
		}
		next(w, r)
	})
}

// sameOrigin reports whether r is not a cross-site request: its Origin,
// when present, names the request's own host, and Sec-Fetch-Site, when
// present, is same-origin or none (Fetch Metadata, W3C).
func sameOrigin(r *http.Request) bool {
	if sfs := r.Header.Get("Sec-Fetch-Site"); sfs != "" && sfs != "same-origin" && sfs != "none" {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	ou, err := url.Parse(o)
	if err != nil || ou.Host == "" {
		return false
	}
	return ou.Host == r.Host
}

func (u *UI) setCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name:     CookieName,
		Value:    value,
		Path:     "/ui/",
		MaxAge:   maxAge,
		HttpOnly: true,
		SameSite: http.SameSiteStrictMode,
		// Secure when served over TLS; on the plain-HTTP provisioning
		// network a Secure cookie would never be sent back.
		Secure: r.TLS != nil,
	})
}

func (u *UI) handleLoginForm(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	u.render(w, r, "login", http.StatusOK, loginView{Next: safeNext(r.URL.Query().Get("next"))})
}

type loginView struct {
	Next  string
	Error string
}

// safeNext keeps a post-login redirect inside the UI.
func safeNext(n string) string {
	if len(n) > 1 && len(n) < 512 && n[0] == '/' && n[1] != '/' && n[1] != '\\' {
		// Clean resolves dot segments as the browser will (%2e%2e included:
		// Parse decodes it), so "/ui/../api" does not pass.
		if p, err := url.Parse(n); err == nil && p.Host == "" && p.Scheme == "" && p.User == nil &&
			strings.HasPrefix(path.Clean(p.Path)+"/", "/ui/") && !strings.ContainsAny(n, "\\\r\n\t") {
			return n
		}
	}
	return Prefix
}

// handleLogin checks the admin token (state.Store.AuthenticateAdmin),
// starts a session and sets its cookie. The form is same-origin only
// (login CSRF). A wrong token answers 401 with the form again.
func (u *UI) handleLogin(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if !sameOrigin(r) {
		u.log.Warn("ui login refused", "reason", "cross-origin")
		http.Error(w, "ui: cross-origin request refused", http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	tok := r.PostFormValue("token")
	next := safeNext(r.PostFormValue("next"))
	at, err := u.store.AuthenticateAdmin(tok)
	if err != nil {
		if !errors.Is(err, state.ErrTokenUnknown) {
			u.log.Error("ui login", "err", err)
			http.Error(w, "ui: internal error", http.StatusInternalServerError)
			return
		}
		u.log.Warn("ui login refused", "reason", "unknown token", "remote", r.RemoteAddr)
		u.render(w, r, "login", http.StatusUnauthorized, loginView{Next: next, Error: "Unknown or revoked token."})
		return
	}
	if old, err := r.Cookie(CookieName); err == nil { // no session fixation
		u.sessions.delete(old.Value)
	}
	id, _ := u.sessions.create(at.Name, tok)
	u.setCookie(w, r, id, int(u.cfg.SessionTTL/time.Second))
	u.log.Info("ui login", "actor", at.Name, "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (u *UI) handleLogout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(CookieName); err == nil {
		u.sessions.delete(c.Value)
	}
	u.setCookie(w, r, "", -1)
	u.log.Info("ui logout", "actor", sessionOf(r).actor)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// decodeJSON decodes a bounded JSON body into v.
func decodeJSON(w http.ResponseWriter, r *http.Request, max int64, v any) error {
	body := http.MaxBytesReader(w, r.Body, max)
	data, err := io.ReadAll(body)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}
