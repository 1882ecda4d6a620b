package ui_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/net/html"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/state"
	"github.com/machina-metal/machina/ui"
	"github.com/machina-metal/machina/ui/uitest"
)

func newLab(t *testing.T, opts uitest.Options) *uitest.Lab {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	l, err := uitest.New(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.Close()
	})
	return l
}

// client returns an HTTP client with a cookie jar that does not follow
// redirects, so tests see the 303s.
func client(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func postForm(t *testing.T, c *http.Client, u string, v url.Values, origin string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(v.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func get(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// login logs c in and returns the session's CSRF token read from a page.
func login(t *testing.T, l *uitest.Lab, c *http.Client) string {
	t.Helper()
	resp := postForm(t, c, l.URL()+"/ui/login", url.Values{"token": {l.Token()}}, l.URL())
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("POST /ui/login = %d, want 303", resp.StatusCode)
	}
	_, body := get(t, c, l.URL()+"/ui/hosts")
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token in page:\n%s", body)
	}
	return m[1]
}

func TestPagesNeedLogin(t *testing.T) {
	l := newLab(t, uitest.Options{})
	c := client(t)
	for _, p := range []string{"/ui/", "/ui/servers/r1-n01", "/ui/images", "/ui/hosts", "/ui/inventory", "/ui/servers/r1-n01/console"} {
		resp, _ := get(t, c, l.URL()+p)
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ui/login?next=") {
			t.Errorf("GET %s without session = %d %q, want 303 to /ui/login", p, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	for _, p := range []string{"/ui/api/v1/servers", "/ui/data/history", "/ui/data/images", "/ui/servers/r1-n01/console/ws"} {
		resp, _ := get(t, c, l.URL()+p)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without session = %d, want 401", p, resp.StatusCode)
		}
	}
	// A forged cookie is no session.
	u, _ := url.Parse(l.URL() + "/ui/")
	c.Jar.SetCookies(u, []*http.Cookie{{Name: ui.CookieName, Value: "forged", Path: "/ui/"}})
	if resp, _ := get(t, c, l.URL()+"/ui/"); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("GET /ui/ with forged cookie = %d, want 303", resp.StatusCode)
	}
}

func TestLoginCookieFlags(t *testing.T) {
	l := newLab(t, uitest.Options{SessionTTL: 10 * time.Minute})
	c := client(t)
	resp := postForm(t, c, l.URL()+"/ui/login", url.Values{"token": {"mach_wrong"}}, l.URL())
	if resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Fatalf("login with a wrong token = %d with %d cookies, want 401 and none", resp.StatusCode, len(resp.Cookies()))
	}
	resp = postForm(t, c, l.URL()+"/ui/login", url.Values{"token": {l.Token()}, "next": {"/ui/hosts"}}, l.URL())
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/hosts" {
		t.Fatalf("login = %d to %q, want 303 to /ui/hosts", resp.StatusCode, resp.Header.Get("Location"))
	}
	var sc *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == ui.CookieName {
			sc = ck
		}
	}
	if sc == nil {
		t.Fatal("no session cookie")
	}
	if !sc.HttpOnly || sc.SameSite != http.SameSiteStrictMode || sc.Path != "/ui/" || sc.MaxAge != 600 || len(sc.Value) < 40 {
		t.Errorf("cookie = %+v, want HttpOnly, SameSite=Strict, Path=/ui/, Max-Age=600, 32 random bytes", sc)
	}
	if sc.Secure {
		t.Errorf("cookie over plain HTTP is Secure; it would never come back")
	}
	if strings.Contains(sc.Value, l.Token()) {
		t.Errorf("cookie carries the admin token")
	}
	// Over TLS the cookie is Secure.
	req := httptest.NewRequest(http.MethodPost, "https://machina.lan/ui/login", strings.NewReader(url.Values{"token": {l.Token()}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.TLS = &tls.ConnectionState{}
	rec := httptest.NewRecorder()
	l.UI.ServeHTTP(rec, req)
	if got := rec.Result().Cookies(); len(got) != 1 || !got[0].Secure {
		t.Errorf("cookie over TLS = %+v, want one Secure cookie", got)
	}
	// Open redirects are refused.
	for _, next := range []string{"//evil.example/ui/", "https://evil.example/ui/", "/\\evil.example", "/api/v1/secrets"} {
		resp = postForm(t, client(t), l.URL()+"/ui/login", url.Values{"token": {l.Token()}, "next": {next}}, l.URL())
		if loc := resp.Header.Get("Location"); loc != "/ui/" {
			t.Errorf("login next=%q redirects to %q, want /ui/", next, loc)
		}
	}
}

func TestSessionExpiresAndRevocationEndsIt(t *testing.T) {
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	l := newLab(t, uitest.Options{SessionTTL: 5 * time.Minute, Now: clock})
	c := client(t)
	login(t, l, c)
	if resp, _ := get(t, c, l.URL()+"/ui/"); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /ui/ after login = %d", resp.StatusCode)
	}
	mu.Lock()
	now = now.Add(5 * time.Minute)
	mu.Unlock()
	if resp, _ := get(t, c, l.URL()+"/ui/"); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("GET /ui/ after the TTL = %d, want 303 to login", resp.StatusCode)
	}
	login(t, l, c)
	if err := l.Store.RevokeAdminToken("operator", state.ActorLocal); err != nil {
		t.Fatal(err)
	}
	if resp, _ := get(t, c, l.URL()+"/ui/"); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("GET /ui/ after revoking the token = %d, want 303 to login", resp.StatusCode)
	}
}

func TestLogoutNeedsCSRFAndEndsSession(t *testing.T) {
	l := newLab(t, uitest.Options{})
	c := client(t)
	csrf := login(t, l, c)
	if resp := postForm(t, c, l.URL()+"/ui/logout", nil, l.URL()); resp.StatusCode != http.StatusForbidden {
		t.Errorf("logout without CSRF = %d, want 403", resp.StatusCode)
	}
	resp := postForm(t, c, l.URL()+"/ui/logout", url.Values{"csrf": {csrf}}, l.URL())
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout = %d, want 303", resp.StatusCode)
	}
	if resp, _ := get(t, c, l.URL()+"/ui/"); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("GET /ui/ after logout = %d, want 303", resp.StatusCode)
	}
}

func TestCSRFRefusalAndApproval(t *testing.T) {
	l := newLab(t, uitest.Options{})
	c := client(t)
	csrf := login(t, l, c)
	rev := strings.TrimPrefix(uitest.HeldDigest, "sha256:")[:12]
	approve := l.URL() + "/ui/inventory/approve"
	cases := []struct {
		name   string
		form   url.Values
		origin string
		want   int
	}{
		{"no token", url.Values{"rev": {rev}, "confirm": {"yes"}}, l.URL(), http.StatusForbidden},
		{"wrong token", url.Values{"rev": {rev}, "confirm": {"yes"}, "csrf": {csrf + "x"}}, l.URL(), http.StatusForbidden},
		{"cross-origin", url.Values{"rev": {rev}, "confirm": {"yes"}, "csrf": {csrf}}, "http://evil.example", http.StatusForbidden},
		{"not confirmed", url.Values{"rev": {rev}, "csrf": {csrf}}, l.URL(), http.StatusBadRequest},
		{"stale revision", url.Values{"rev": {"0123456789ab"}, "confirm": {"yes"}, "csrf": {csrf}}, l.URL(), http.StatusConflict},
	}
	for _, tc := range cases {
		resp := postForm(t, c, approve, tc.form, tc.origin)
		if resp.StatusCode != tc.want {
			t.Errorf("%s: POST approve = %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
	}
	if ok, _ := l.Store.Approved(uitest.HeldDigest); ok {
		t.Fatal("a refused request approved the plan")
	}
	// The confirmation page lists what will happen.
	_, body := get(t, c, approve+"?rev="+rev)
	for _, want := range []string{"r3-n01", "retire", "r1-n03", "release", "3 steps"} {
		if !strings.Contains(body, want) {
			t.Errorf("confirmation page lacks %q", want)
		}
	}
	resp := postForm(t, c, approve, url.Values{"rev": {rev}, "confirm": {"yes"}, "csrf": {csrf}}, l.URL())
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("approve = %d, want 303", resp.StatusCode)
	}
	if ok, err := l.Store.Approved(uitest.HeldDigest); !ok || err != nil {
		t.Fatalf("Approved = %v, %v after approving", ok, err)
	}
	evs, err := l.Store.Events(state.EventQuery{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	var audited bool
	for _, e := range evs {
		if e.Kind == state.EventApproval && e.Actor == "operator" && strings.Contains(e.Message, rev) {
			audited = true
		}
	}
	if !audited {
		t.Error("no approval event with the session's token name as actor")
	}
}

// TestSecurityHeadersAndNoInlineScript fetches every page (and a 404, an
// error page and static files) and checks the CSP header, then parses the
// HTML: every <script> has a same-origin src and no body, no element has
// an on* handler attribute or a javascript: URL.
func TestSecurityHeadersAndNoInlineScript(t *testing.T) {
	l := newLab(t, uitest.Options{})
	c := client(t)
	rev := strings.TrimPrefix(uitest.HeldDigest, "sha256:")[:12]
	paths := []string{"/ui/login", "/ui/", "/ui/servers/r1-n01", "/ui/servers/r2-n01", "/ui/servers/r1-n03", "/ui/images", "/ui/hosts",
		"/ui/inventory", "/ui/inventory/approve?rev=" + rev, "/ui/servers/r1-n01/console", "/ui/servers/nope", "/ui/inventory/approve?rev=0123456789ab"}
	login(t, l, c)
	scripts := 0
	for _, p := range paths {
		resp, body := get(t, c, l.URL()+p)
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self';") || strings.Contains(csp, "unsafe-eval") ||
			!strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") || !strings.Contains(csp, "connect-src 'self'") {
			t.Errorf("GET %s: CSP %q", p, csp)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: no nosniff", p)
		}
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Errorf("GET %s: Content-Type %q", p, resp.Header.Get("Content-Type"))
		}
		scripts += checkNoInlineScript(t, p, body)
	}
	if scripts < 5 {
		t.Errorf("found %d module scripts over all pages, want the pages' own scripts", scripts)
	}
	for _, p := range []string{"/ui/static/app.css", "/ui/static/js/fleet.mjs", "/ui/static/vendor/xterm/xterm.mjs", "/ui/nope"} {
		resp, _ := get(t, c, l.URL()+p)
		if resp.Header.Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: no CSP", p)
		}
		if p != "/ui/nope" && resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d", p, resp.StatusCode)
		}
	}
	if resp, _ := get(t, c, l.URL()+"/ui/static/js/fleet.mjs"); !strings.Contains(resp.Header.Get("Content-Type"), "javascript") {
		t.Errorf("module served as %q, browsers refuse it", resp.Header.Get("Content-Type"))
	}
	if resp, _ := get(t, c, l.URL()+"/ui/static/js/"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("directory listing answered %d", resp.StatusCode)
	}
}

func checkNoInlineScript(t *testing.T, page, body string) int {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s: parse: %v", page, err)
	}
	n := 0
	var walk func(*html.Node)
	walk = func(x *html.Node) {
		if x.Type == html.ElementNode {
			if x.Data == "script" {
				src := ""
				for _, a := range x.Attr {
					if a.Key == "src" {
						src = a.Val
					}
				}
				if !strings.HasPrefix(src, "/ui/static/") || x.FirstChild != nil {
					t.Errorf("%s: inline or foreign script (src %q)", page, src)
				}
				n++
			}
			for _, a := range x.Attr {
				if strings.HasPrefix(strings.ToLower(a.Key), "on") || a.Key == "style" ||
					strings.HasPrefix(strings.ToLower(strings.TrimSpace(a.Val)), "javascript:") {
					t.Errorf("%s: <%s %s=%q> is inline code or style", page, x.Data, a.Key, a.Val)
				}
				if (a.Key == "src" || a.Key == "href" || a.Key == "action") && strings.Contains(a.Val, "//") {
					t.Errorf("%s: <%s %s=%q> points off the host", page, x.Data, a.Key, a.Val)
				}
			}
		}
		for ch := x.FirstChild; ch != nil; ch = ch.NextSibling {
			walk(ch)
		}
	}
	walk(doc)
	return n
}

func TestPagesShowTheFeed(t *testing.T) {
	l := newLab(t, uitest.Options{})
	c := client(t)
	login(t, l, c)
	checks := map[string][]string{
		"/ui/": {"zone-a", "zone-b", "zone-c", "r1-n02", "commissioning", "powered_on", "Critical"},
		"/ui/servers/r1-n01": {"PowerEdge R650", "CPU1 Temp", "312 W", "iDRAC", "Fan 3 RPM", "128.0 GiB", "nvme0n1", "1.7 TiB", "447.1 GiB",
			"<td>leaf-r1-a</td><td>Ethernet1/1</td><td>100</td>", "no LLDP heard"},
		"/ui/servers/r3-n03": {"Not reported by this BMC: power, firmware, logs"},
		"/ui/servers/r2-n01": {"bmc: unreachable"},
		"/ui/servers/r2-n02": {"SMART status FAILED", "Stalled", "bump actions.commission"},
		"/ui/servers/r3-n01": {"image-write: 1.5 GiB of 4.0 GiB at 120.0 MiB/s"},
		"/ui/servers/r2-n03": {"2 failures in a row; next retry"},
		"/ui/servers/r1-n03": {"hypervisor", "ubuntu-24.04", "hv-r1-n03", "br-mgmt: vlan 10", "deployed",
			`<tr><td><code>10.20.0.100</code></td><td>eno1</td><td>mgmt</td><td>hypervisor</td></tr>`},
		"/ui/images": {"ubuntu-24.04", `value="42"`, "checksum mismatch", "verified", "4.0 MiB", "2.0 GiB"},
		"/ui/hosts":  {"hv-r1-n03", "online", "hv-r9-n01", "offline", "vmpool: lvm", "br-vm"},
		"/ui/inventory": {"9e1f2a3b4c5d", "servers.yaml:88:14: servers[12].bootMAC", "servers.yaml:95:11", "Approve held plan", "r3-n01", "more than the 20% brake",
			// The Git side: a write-back refused four times in a row.
			`<tr id="git-push"><td>Status write-back</td><td><span class="error">failing</span></td><td>2026-11-29 09:40:00Z</td><td>4</td><td>status write: push to the inventory remote: pre-receive hook declined</td></tr>`,
			`<tr id="git-poll"><td>Inventory poll</td><td>ok</td><td>2026-11-29 10:06:00Z</td><td>0</td>`, "Last status commit <code>c0ffee012345</code> (8.8 KiB pushed)"},
	}
	for p, wants := range checks {
		resp, body := get(t, c, l.URL()+p)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d", p, resp.StatusCode)
			continue
		}
		for _, w := range wants {
			if !strings.Contains(body, w) {
				t.Errorf("GET %s: page lacks %q", p, w)
			}
		}
	}
	if resp, _ := get(t, c, l.URL()+"/ui/servers/nope"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown server = %d, want 404", resp.StatusCode)
	}
	if resp, _ := get(t, c, l.URL()+"/ui/servers/r1-n01"); resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("page Cache-Control = %q, want no-store", resp.Header.Get("Cache-Control"))
	}
}

func TestAPIProxyAndHistory(t *testing.T) {
	l := newLab(t, uitest.Options{})
	c := client(t)
	login(t, l, c)
	resp, body := get(t, c, l.URL()+"/ui/api/v1/servers/r1-n02")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"lifecycle":"commissioning"`) {
		t.Errorf("proxied server = %d %s", resp.StatusCode, body)
	}
	for _, p := range []string{"/ui/api/v1/secrets", "/ui/api/v1/servers/r1-n01/console", "/ui/api/v1/../../metrics", "/ui/api/v1/%2e%2e/secrets"} {
		if resp, body := get(t, c, l.URL()+p); resp.StatusCode == http.StatusOK || strings.Contains(body, "go_goroutines") {
			t.Errorf("GET %s = %d, want refused", p, resp.StatusCode)
		}
	}
	_, body = get(t, c, l.URL()+"/ui/data/history")
	if !strings.Contains(body, `"points":[{`) || !strings.Contains(body, `"ready":`) {
		t.Errorf("history = %.300s", body)
	}
}

func TestConsoleRolesAndEcho(t *testing.T) {
	l := newLab(t, uitest.Options{})
	c1, c2 := client(t), client(t)
	login(t, l, c1)
	login(t, l, c2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(l.URL(), "http") + "/ui/servers/r1-n01/console/ws"
	dial := func(c *http.Client) *websocket.Conn {
		conn, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: c,
			Subprotocols: []string{"machina.console.writer", "machina.console.reader"},
			HTTPHeader:   http.Header{"Origin": {l.URL()}}})
		if err != nil {
			t.Fatalf("dial: %v (%v)", err, resp)
		}
		return conn
	}
	w := dial(c1)
	defer w.CloseNow()
	if w.Subprotocol() != "machina.console.writer" {
		t.Fatalf("first session subprotocol %q, want writer", w.Subprotocol())
	}
	r := dial(c2)
	defer r.CloseNow()
	if r.Subprotocol() != "machina.console.reader" {
		t.Fatalf("second session subprotocol %q, want reader", r.Subprotocol())
	}
	readUntil := func(conn *websocket.Conn, want string) {
		t.Helper()
		var got strings.Builder
		for !strings.Contains(got.String(), want) {
			_, b, err := conn.Read(ctx)
			if err != nil {
				t.Fatalf("read: %v (got %q, want %q)", err, got.String(), want)
			}
			got.Write(b)
		}
	}
	if err := w.Write(ctx, websocket.MessageBinary, []byte("\r")); err != nil {
		t.Fatal(err)
	}
	readUntil(w, "login: ")
	if err := r.Write(ctx, websocket.MessageBinary, []byte("reader-typed")); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, websocket.MessageBinary, []byte("root")); err != nil {
		t.Fatal(err)
	}
	readUntil(w, "root")
	readUntil(r, "root")
	if n := l.ConsoleStreams(); n != 1 {
		t.Errorf("console streams opened = %d, want 1 shared by writer and reader", n)
	}
	audit := l.Audit()
	if len(audit) < 2 || audit[0].Principal != "ui:operator" || audit[0].Action != "console.open" {
		t.Errorf("audit = %+v, want console.open by ui:operator", audit)
	}
	// A cross-site page cannot open it (Origin check).
	_, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: c1, HTTPHeader: http.Header{"Origin": {"http://evil.example"}}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin console dial: err %v, resp %v; want 403", err, resp)
	}
	// The API route still takes bearer tokens (machinactl console).
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(l.URL(), "http")+"/api/v1/servers/r1-n01/console",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + l.Token()}}})
	if err != nil {
		t.Fatalf("bearer console dial: %v", err)
	}
	conn.CloseNow()
}

// TestLogoutEndsStreams: the event stream and the console WebSocket a
// session opened end when the session does.
func TestLogoutEndsStreams(t *testing.T) {
	l := newLab(t, uitest.Options{})
	c := client(t)
	csrf := login(t, l, c)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, l.URL()+"/ui/api/v1/events/stream", nil)
	sc := &http.Client{Jar: c.Jar} // no client timeout: the stream is long-lived
	resp, err := sc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	buf := make([]byte, 64)
	if n, err := resp.Body.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "retry:") {
		t.Fatalf("first stream bytes %q, %v", buf[:n], err)
	}
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(l.URL(), "http")+"/ui/servers/r1-n01/console/ws",
		&websocket.DialOptions{HTTPClient: c, HTTPHeader: http.Header{"Origin": {l.URL()}}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()

	if resp := postForm(t, c, l.URL()+"/ui/logout", url.Values{"csrf": {csrf}}, l.URL()); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout = %d", resp.StatusCode)
	}
	if _, err := io.ReadAll(resp.Body); err != nil && ctx.Err() != nil {
		t.Fatalf("event stream still open after logout: %v", err)
	}
	if _, _, err := conn.Read(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("console still open after logout: %v", err)
	}
}

// TestAPITarget: the remote Target drives transitions through the admin
// API, and reports the API's refusals.
func TestAPITarget(t *testing.T) {
	l := newLab(t, uitest.Options{})
	a := &uitest.APITarget{BaseURL: l.URL(), AdminToken: l.Token()}
	ctx := context.Background()
	if err := a.Transition(ctx, "r1-n02", "commissioning", "ready", "via api"); err != nil {
		t.Fatal(err)
	}
	srv, err := l.Store.Server("r1-n02")
	if err != nil || srv.Lifecycle != state.LifecycleReady {
		t.Fatalf("after APITarget.Transition: %v, %v", srv.Lifecycle, err)
	}
	if err := a.Transition(ctx, "r1-n02", "commissioning", "ready", "again"); err == nil || !strings.Contains(err.Error(), "409") {
		t.Errorf("stale transition error = %v, want HTTP 409", err)
	}
}

// TestMinimalConfig: with only Store and API, every page renders and says
// which source is missing; New refuses a config without them.
func TestMinimalConfig(t *testing.T) {
	if _, err := ui.New(ui.Config{}); err == nil {
		t.Error("New without Store succeeded")
	}
	l := newLab(t, uitest.Options{})
	if _, err := ui.New(ui.Config{Store: l.Store}); err == nil {
		t.Error("New without API succeeded")
	}
	h, err := ui.New(ui.Config{Store: l.Store, API: l.API.Handler()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := client(t)
	if resp := postForm(t, c, srv.URL+"/ui/login", url.Values{"token": {l.Token()}}, srv.URL); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login = %d", resp.StatusCode)
	}
	for p, want := range map[string]string{
		"/ui/servers/r1-n01":         "no BMC read model source is configured",
		"/ui/images":                 "no image status source is configured",
		"/ui/inventory":              "no inventory status source is configured",
		"/ui/servers/r1-n01/console": "no console handler is configured",
	} {
		resp, body := get(t, c, srv.URL+p)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("GET %s = %d, want a page saying %q", p, resp.StatusCode, want)
		}
	}
	if resp, _ := get(t, c, srv.URL+"/ui/servers/r1-n01/console/ws"); resp.StatusCode != http.StatusNotImplemented {
		t.Errorf("console ws without a handler = %d, want 501", resp.StatusCode)
	}
}

// consoleProbe is a ui.ConsoleSource: r2-n02's BMC has no serial console
// (as the uitest opener answers), r3-n01's cannot be asked.
type consoleProbe struct{}

func (consoleProbe) ConsoleSupported(_ context.Context, server string) error {
	switch server {
	case "r2-n02":
		return fmt.Errorf("probe %s: %w", server, bmc.ErrUnsupported)
	case "r3-n01":
		return fmt.Errorf("probe %s: %w", server, bmc.ErrUnreachable)
	}
	return nil
}

// TestConsoleUnsupportedPage: with Config.ConsoleSupport, a server whose
// BMC has no serial console gets a console page saying "not supported by
// this BMC" without a terminal (no WebSocket the handler would refuse with
// a status the browser never shows) and a server page without the console
// button; a BMC that cannot be asked, and one with a console, get the
// terminal.
func TestConsoleUnsupportedPage(t *testing.T) {
	l := newLab(t, uitest.Options{})
	h, err := ui.New(ui.Config{Store: l.Store, API: l.API.Handler(), Console: l.Console, ConsoleSupport: consoleProbe{}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := client(t)
	if resp := postForm(t, c, srv.URL+"/ui/login", url.Values{"token": {l.Token()}}, srv.URL); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login = %d", resp.StatusCode)
	}
	for name, supported := range map[string]bool{"r1-n01": true, "r2-n02": false, "r3-n01": true} {
		resp, body := get(t, c, srv.URL+"/ui/servers/"+name+"/console")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("console page %s = %d", name, resp.StatusCode)
		}
		hasTerm := strings.Contains(body, `id="terminal"`)
		says := strings.Contains(body, `id="console-unsupported"`) && strings.Contains(body, "not supported by this BMC")
		if hasTerm != supported || says == supported {
			t.Errorf("console page %s: terminal %v, says unsupported %v; want terminal %v", name, hasTerm, says, supported)
		}
		_, body = get(t, c, srv.URL+"/ui/servers/"+name)
		if btn := strings.Contains(body, `id="open-console"`); btn != supported {
			t.Errorf("server page %s: console button %v, want %v", name, btn, supported)
		}
	}
}

// TestHostsPageShowsHostRecord checks that the hosts page's Networks and
// Storage pools cells list exactly the names of the host record (what GET
// /api/v1/hosts returns), each with the join log's message for its step
// ("network NAME", "pool NAME", as join/node.Apply reports them) as title.
func TestHostsPageShowsHostRecord(t *testing.T) {
	l := newLab(t, uitest.Options{})
	c := client(t)
	login(t, l, c)
	_, body := get(t, c, l.URL()+"/ui/hosts")
	doc, err := html.Parse(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	type cell struct{ names, titles []string }
	cells := map[string]map[string]*cell{} // host → field → cell
	var host, field string
	var walk func(*html.Node)
	walk = func(x *html.Node) {
		if x.Type == html.ElementNode {
			for _, a := range x.Attr {
				switch {
				case x.Data == "tr" && a.Key == "data-host":
					host, cells[a.Val] = a.Val, map[string]*cell{}
				case x.Data == "td" && a.Key == "data-field":
					field = a.Val
					cells[host][field] = &cell{names: []string{}, titles: []string{}}
				}
			}
			if x.Data == "div" && field != "" && x.FirstChild != nil {
				c := cells[host][field]
				c.names = append(c.names, x.FirstChild.Data)
				title := ""
				for _, a := range x.Attr {
					if a.Key == "title" {
						title = a.Val
					}
				}
				c.titles = append(c.titles, title)
			}
		}
		for ch := x.FirstChild; ch != nil; ch = ch.NextSibling {
			walk(ch)
		}
		if x.Type == html.ElementNode && x.Data == "td" {
			field = ""
		}
	}
	walk(doc)
	hosts, err := l.Store.Hosts()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		got := cells[h.Name]
		if got == nil || got["networks"] == nil || got["pools"] == nil {
			t.Fatalf("hosts page has no networks/pools cells for %s:\n%s", h.Name, body)
		}
		want := func(s []string) []string { return append([]string{}, s...) }
		if g, w := got["networks"].names, want(h.Networks); !slices.Equal(g, w) {
			t.Errorf("%s networks cell = %q, host record has %q", h.Name, g, w)
		}
		if g, w := got["pools"].names, want(h.StoragePools); !slices.Equal(g, w) {
			t.Errorf("%s storage pools cell = %q, host record has %q", h.Name, g, w)
		}
	}
	if g, w := cells["hv-r1-n03"]["networks"].titles, []string{"br-mgmt: vlan 10, 10.20.1.13/24", "br-vm: vlan 200, no address"}; !slices.Equal(g, w) {
		t.Errorf("hv-r1-n03 network details = %q, want the join log's %q", g, w)
	}
	if g, w := cells["hv-r1-n03"]["pools"].titles, []string{"vmpool: lvm on nvme0n1 (1.7 TiB)"}; !slices.Equal(g, w) {
		t.Errorf("hv-r1-n03 pool details = %q, want the join log's %q", g, w)
	}
}

// TestHostsPageShowsLostAndFenced: a lost host shows its HostLost
// condition with the power its BMC read; a fenced one shows fenced, and
// one that heartbeats while fenced says the fence did not hold.
func TestHostsPageShowsLostAndFenced(t *testing.T) {
	l := newLab(t, uitest.Options{})
	c := client(t)
	login(t, l, c)
	if _, err := l.Store.MarkHostLost("hv-r1-n03", time.Now().Add(time.Hour), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := l.Store.RecordLostPower("hv-r1-n03", time.Now(), state.PowerOn, ""); err != nil {
		t.Fatal(err)
	}
	_, body := get(t, c, l.URL()+"/ui/hosts")
	if !strings.Contains(body, `data-condition="HostLost"`) || !strings.Contains(body, "lost, powered on") {
		t.Fatalf("hosts page does not show the lost host:\n%s", body)
	}
	if _, err := l.Store.FenceServer("r1-n03", state.Fencing{Actor: "ops", Reason: "lost", Device: "bmc", Host: "hv-r1-n03"}); err != nil {
		t.Fatal(err)
	}
	_, body = get(t, c, l.URL()+"/ui/hosts")
	if !strings.Contains(body, `data-condition="Fenced"`) {
		t.Fatalf("hosts page does not show the fenced host:\n%s", body)
	}
	// Two heartbeats: the first after a fence may have been in flight
	// (state.Host.FencedBeat); the second proves the fence did not hold.
	for i := range 2 {
		if _, err := l.Store.RecordHeartbeat("hv-r1-n03", time.Now().Add(time.Duration(i)*time.Second), state.Heartbeat{}); err != nil {
			t.Fatal(err)
		}
	}
	_, body = get(t, c, l.URL()+"/ui/hosts")
	if !strings.Contains(body, `data-condition="FenceFailed"`) || !strings.Contains(body, "fence did not hold") {
		t.Fatalf("hosts page does not show the fence that did not hold:\n%s", body)
	}
}
