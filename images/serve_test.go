package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// memTokens is a small TokenChecker holding hashed tokens with expiry, the
// shape the state package is expected to provide.
type memTokens struct {
	mu     sync.Mutex
	tokens map[[32]byte]struct {
		image   string
		expires time.Time
	}
	broken bool
}

func (m *memTokens) add(token, image string, ttl time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tokens == nil {
		m.tokens = map[[32]byte]struct {
			image   string
			expires time.Time
		}{}
	}
	m.tokens[sha256.Sum256([]byte(token))] = struct {
		image   string
		expires time.Time
	}{image, time.Now().Add(ttl)}
}

func (m *memTokens) CheckImageToken(_ context.Context, token, image string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.broken {
		return errors.New("state store unavailable")
	}
	h := sha256.Sum256([]byte(token))
	for k, v := range m.tokens {
		if subtle.ConstantTimeCompare(k[:], h[:]) == 1 && v.image == image && time.Now().Before(v.expires) {
			return nil
		}
	}
	return fmt.Errorf("image %s: %w", image, ErrTokenRejected)
}

func TestHandlerServesWithRangeAndToken(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, 2*mib+17)
	srv.put("/x.raw", raw)
	e := newTestEnv(t, nil)
	rec, err := e.im.Import(t.Context(), Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()})
	if err != nil {
		t.Fatal(err)
	}
	tokens := &memTokens{}
	tokens.add("good-token", "x", time.Minute)
	tokens.add("other-image", "y", time.Minute)
	tokens.add("expired", "x", -time.Second)
	h, err := NewHandler(HandlerConfig{Store: e.store, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	defer hs.Close()

	get := func(method, path, token, rng string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), method, hs.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}

	resp, body := get("GET", "/images/x", "good-token", "")
	if resp.StatusCode != 200 || !bytes.Equal(body, raw) {
		t.Fatalf("full GET = %d, %d bytes", resp.StatusCode, len(body))
	}
	if got := resp.Header.Get(ChecksumHeader); got != rec.Raw.String() {
		t.Errorf("%s = %q, want %q", ChecksumHeader, got, rec.Raw.String())
	}
	if resp.Header.Get("Accept-Ranges") != "bytes" {
		t.Errorf("Accept-Ranges = %q", resp.Header.Get("Accept-Ranges"))
	}

	resp, body = get("GET", "/images/x", "good-token", "bytes=1048576-")
	if resp.StatusCode != 206 || !bytes.Equal(body, raw[mib:]) {
		t.Errorf("range GET = %d, %d bytes; want 206 and the tail", resp.StatusCode, len(body))
	}
	if cr := resp.Header.Get("Content-Range"); cr != fmt.Sprintf("bytes %d-%d/%d", mib, len(raw)-1, len(raw)) {
		t.Errorf("Content-Range = %q", cr)
	}
	resp, body = get("GET", "/images/x", "good-token", "bytes=10-19")
	if resp.StatusCode != 206 || !bytes.Equal(body, raw[10:20]) {
		t.Errorf("small range GET = %d, %q", resp.StatusCode, body)
	}
	resp, body = get("HEAD", "/images/x", "good-token", "")
	if resp.StatusCode != 200 || len(body) != 0 || resp.ContentLength != int64(len(raw)) {
		t.Errorf("HEAD = %d, len %d, body %d", resp.StatusCode, resp.ContentLength, len(body))
	}

	for _, tc := range []struct {
		method, path, token string
		code                int
	}{
		{"GET", "/images/x", "", 401},
		{"GET", "/images/x", "wrong", 403},
		{"GET", "/images/x", "other-image", 403},
		{"GET", "/images/x", "expired", 403},
		{"GET", "/images/nope", "good-token", 403},
		{"GET", "/images/../x", "good-token", 404},
		{"POST", "/images/x", "good-token", 405},
	} {
		if resp, _ := get(tc.method, tc.path, tc.token, ""); resp.StatusCode != tc.code {
			t.Errorf("%s %s token=%q = %d, want %d", tc.method, tc.path, tc.token, resp.StatusCode, tc.code)
		}
	}
	tokens.add("for-missing", "missing", time.Minute)
	if resp, _ := get("GET", "/images/missing", "for-missing", ""); resp.StatusCode != 404 {
		t.Errorf("GET of an image not in the store = %d, want 404", resp.StatusCode)
	}
	tokens.mu.Lock()
	tokens.broken = true
	tokens.mu.Unlock()
	if resp, _ := get("GET", "/images/x", "good-token", ""); resp.StatusCode != 503 {
		t.Errorf("GET with failing token checker = %d, want 503", resp.StatusCode)
	}
}
