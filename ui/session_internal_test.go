package ui

import (
	"net/url"
	"path"
	"strings"
	"testing"
	"time"
)

func TestSessionsEvictOldestAndExpire(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ss := newSessions(10*time.Minute, 3, func() time.Time { return now })
	var ids []string
	for i := range 4 {
		id, s := ss.create("op", "tok")
		if len(s.csrf) < 40 || s.csrf == id {
			t.Fatalf("session %d: weak or reused CSRF token", i)
		}
		ids = append(ids, id)
		now = now.Add(time.Second)
	}
	if ss.len() != 3 {
		t.Fatalf("len = %d after 4 logins with MaxSessions 3, want 3", ss.len())
	}
	if ss.get(ids[0]) != nil {
		t.Error("the oldest session survived eviction")
	}
	if ss.get(ids[3]) == nil {
		t.Error("the newest session was evicted")
	}
	for k := range ss.m {
		if string(k[:]) == ids[3] {
			t.Error("the table holds a cookie value, not its hash")
		}
	}
	now = now.Add(10 * time.Minute)
	if ss.get(ids[3]) != nil {
		t.Error("a session outlived its TTL")
	}
	if ss.len() != 2 {
		t.Errorf("an expired session was not removed on lookup: len %d", ss.len())
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"/ui/servers/r1-n01":    "/ui/servers/r1-n01",
		"/ui/?q=1":              "/ui/?q=1",
		"//evil/ui/":            "/ui/",
		"/\\evil":               "/ui/",
		"https://evil/ui/":      "/ui/",
		"/api/v1/secrets":       "/ui/",
		"":                      "/ui/",
		"javascript:alert(1)":   "/ui/",
		"/ui/../api/v1/secrets": "/ui/",
		"/ui/%2e%2e/metrics":    "/ui/",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzSafeNext: whatever the login form's next= holds, the redirect stays
// a path under /ui/ on this host.
func FuzzSafeNext(f *testing.F) {
	for _, s := range []string{"/ui/", "/ui/servers/a", "//evil/ui/", "/\\evil", "/ui/../api", "/ui/%2f%2fevil", "https://x/ui/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out := safeNext(in)
		if out == "/ui/" {
			return
		}
		if out != in {
			t.Fatalf("safeNext(%q) = %q: neither the input nor the default", in, out)
		}
		u, err := url.Parse(out)
		if err != nil || u.Host != "" || u.Scheme != "" || !strings.HasPrefix(path.Clean(u.Path)+"/", "/ui/") || strings.HasPrefix(out, "//") || strings.ContainsRune(out, '\\') {
			t.Fatalf("safeNext(%q) = %q leaves the UI", in, out)
		}
	})
}
