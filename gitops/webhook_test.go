package gitops

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func sign(secret, body string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(body))
	return hex.EncodeToString(m.Sum(nil))
}

// TestWebhookTriggersPoll: a signed push notification from GitHub,
// Gitea/Forgejo or GitLab makes a source whose interval is an hour fetch
// the operator's new commit at once; a wrong or missing signature, a
// ping, another branch, an oversized body or a flood does not trigger.
func TestWebhookTriggersPoll(t *testing.T) {
	r := newTestRepo(t)
	const secret = "whsec-5f4e3d2c1b"
	secretFile := filepath.Join(t.TempDir(), "webhook.secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, StateDir: t.TempDir(), Interval: time.Hour, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var triggers atomic.Int32
	var logs syncBuffer
	wh, err := NewWebhook(WebhookConfig{SecretFile: secretFile, Branch: "main", Trigger: func() { triggers.Add(1); s.Trigger() },
		MaxBodyBytes: 64 << 10, Rate: 1000, Burst: 1000, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(wh)
	t.Cleanup(srv.Close)
	done := make(chan struct{})
	go func() { s.Run(t.Context()); close(done) }()
	t.Cleanup(func() { <-done })
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("the first poll", func() bool { g, _ := s.Latest(); return g.Commit != "" })

	post := func(body string, headers map[string]string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	push := `{"ref":"refs/heads/main","after":"x"}`
	tags := "tags: [kvm]\n    bootMAC: \"52:54:00:01:00:03\""
	for _, tc := range []struct {
		name    string
		headers map[string]string
	}{
		{"github", map[string]string{"X-GitHub-Event": "push", "X-Hub-Signature-256": "sha256=" + sign(secret, push)}},
		{"gitea", map[string]string{"X-Gitea-Event": "push", "X-Gitea-Signature": sign(secret, push)}},
		{"forgejo", map[string]string{"X-Forgejo-Event": "push", "X-Forgejo-Signature": sign(secret, push)}},
		{"gitlab", map[string]string{"X-Gitlab-Event": "Push Hook", "X-Gitlab-Token": secret}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := strings.Replace(tags, "kvm", "kvm, "+tc.name, 1)
			c := r.edit("servers.yaml", tags, next, "servers: tag r1-n03 "+tc.name)
			tags = next
			r.push(false)
			before := triggers.Load()
			if code := post(push, tc.headers); code != http.StatusAccepted {
				t.Fatalf("signed push = %d, want 202", code)
			}
			if triggers.Load() != before+1 {
				t.Fatal("accepted push did not trigger")
			}
			waitFor("the pushed commit "+c.String(), func() bool { g, _ := s.Latest(); return g.Commit == c.String() })
		})
	}
	before := triggers.Load()
	for name, tc := range map[string]struct {
		body    string
		headers map[string]string
		want    int
	}{
		"wrong github signature":           {push, map[string]string{"X-GitHub-Event": "push", "X-Hub-Signature-256": "sha256=" + sign("other", push)}, 401},
		"github signature of another body": {push, map[string]string{"X-GitHub-Event": "push", "X-Hub-Signature-256": "sha256=" + sign(secret, push+" ")}, 401},
		"no signature":                     {push, map[string]string{"X-GitHub-Event": "push"}, 401},
		"wrong gitlab token":               {push, map[string]string{"X-Gitlab-Event": "Push Hook", "X-Gitlab-Token": secret + "x"}, 401},
		"wrong gitea signature":            {push, map[string]string{"X-Gitea-Event": "push", "X-Gitea-Signature": "zz"}, 401},
		"ping":                             {`{"zen":"hi"}`, map[string]string{"X-GitHub-Event": "ping", "X-Hub-Signature-256": "sha256=" + sign(secret, `{"zen":"hi"}`)}, 200},
		"another branch":                   {`{"ref":"refs/heads/dev"}`, map[string]string{"X-Gitea-Event": "push", "X-Gitea-Signature": sign(secret, `{"ref":"refs/heads/dev"}`)}, 200},
		"oversized":                        {strings.Repeat("x", 65<<10), map[string]string{"X-Gitlab-Event": "Push Hook", "X-Gitlab-Token": secret}, 413},
	} {
		if code := post(tc.body, tc.headers); code != tc.want {
			t.Errorf("%s = %d, want %d", name, code, tc.want)
		}
	}
	if n := triggers.Load(); n != before {
		t.Errorf("refused or ignored deliveries triggered %d polls", n-before)
	}
	if strings.Contains(logs.String(), secret) {
		t.Error("logs contain the secret")
	}

	// A flood: past the burst, deliveries get 429 before being read.
	now := time.Unix(1e9, 0)
	flood, err := NewWebhook(WebhookConfig{SecretFile: secretFile, Trigger: func() {}, Rate: 1, Burst: 3})
	if err != nil {
		t.Fatal(err)
	}
	flood.cfg.now = func() time.Time { return now }
	codes := []int{}
	for range 5 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader([]byte(push)))
		req.Header.Set("X-Gitlab-Token", secret)
		req.Header.Set("X-Gitlab-Event", "Push Hook")
		flood.ServeHTTP(rec, req)
		codes = append(codes, rec.Code)
	}
	if want := []int{202, 202, 202, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("flood answers = %v, want %v", codes, want)
	}
	now = now.Add(time.Second)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader([]byte(push)))
	req.Header.Set("X-Gitlab-Token", secret)
	req.Header.Set("X-Gitlab-Event", "Push Hook")
	flood.ServeHTTP(rec, req)
	if rec.Code != http.StatusAccepted {
		t.Errorf("a delivery a second later = %d, want 202", rec.Code)
	}
}

// TestWebhookFloodFromOneSourceLeavesOthers: the delivery rate is counted
// per source address (an IPv6 source per /64), so a client on the
// operator network flooding unsigned deliveries gets 429 itself but does
// not starve the Git host's signed push from another address.
func TestWebhookFloodFromOneSourceLeavesOthers(t *testing.T) {
	const secret = "whsec-0a1b2c3d"
	secretFile := filepath.Join(t.TempDir(), "webhook.secret")
	if err := os.WriteFile(secretFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	var triggers atomic.Int32
	var logs syncBuffer
	wh, err := NewWebhook(WebhookConfig{SecretFile: secretFile, Trigger: func() { triggers.Add(1) }, Rate: 1, Burst: 3,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1e9, 0)
	wh.cfg.now = func() time.Time { return now }
	const push = `{"ref":"refs/heads/main"}`
	deliver := func(from string, signed bool) int {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(push))
		req.RemoteAddr = from
		req.Header.Set("X-GitHub-Event", "push")
		sig := strings.Repeat("0", 64)
		if signed {
			sig = sign(secret, push)
		}
		req.Header.Set("X-Hub-Signature-256", "sha256="+sig)
		wh.ServeHTTP(rec, req)
		return rec.Code
	}
	var flood []int
	for i := range 20 {
		// One IPv4 attacker, and one IPv6 attacker cycling through
		// addresses of its /64.
		flood = append(flood, deliver("198.51.100.7:4000", false), deliver(fmt.Sprintf("[2001:db8:1:2::%x]:4000", i+1), false))
	}
	if n := len(slices.DeleteFunc(slices.Clone(flood), func(c int) bool { return c != http.StatusTooManyRequests })); n != 34 {
		t.Errorf("flood answers %v: %d of 40 got 429, want 34 (a burst of 3 per source)", flood, n)
	}
	for _, from := range []string{"192.0.2.10:443", "[2001:db8:9::1]:443"} {
		if code := deliver(from, true); code != http.StatusAccepted {
			t.Errorf("signed push from %s during the flood = %d, want 202", from, code)
		}
	}
	if n := triggers.Load(); n != 2 {
		t.Errorf("%d polls triggered, want 2 (the signed pushes only)", n)
	}
	// The 6 refusals within one second: one Warn line, not one each.
	if n := strings.Count(logs.String(), "webhook delivery refused"); n != 1 {
		t.Errorf("%d refusal lines logged, want 1 a second:\n%s", n, logs.String())
	}
	now = now.Add(time.Second)
	deliver("203.0.113.9:1", false)
	if !strings.Contains(logs.String(), "unlogged_before=5") {
		t.Errorf("the next second's refusal line does not count the 5 unlogged:\n%s", logs.String())
	}
}
