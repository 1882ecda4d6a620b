package v1

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestRetryText: the agent's cut of a retry reason and the controller's
// check of it are one rule: every RetryText result passes CheckRetry, and
// text CheckRetry accepts comes back unchanged.
func TestRetryText(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		n        int
		want     string
	}{
		{"plain", "piece 3 of 64: controller answered 503, retry 1 of 19 in 1s", 0, "piece 3 of 64: controller answered 503, retry 1 of 19 in 1s"},
		{"controls dropped", "a\nb\tc\x00d\x7fe\x1b[31m", 0, "abcde[31m"},
		{"invalid UTF-8 dropped", "ok\xff\xfeok", 0, "okok"},
		{"cut on a rune boundary", "ab\u00e9cd", 3, "ab"},
		{"cut at the bound", strings.Repeat("x", MaxProgressRetryBytes+10), 0, strings.Repeat("x", MaxProgressRetryBytes)},
		{"n above the bound is the bound", strings.Repeat("y", MaxProgressRetryBytes+1), 10 * MaxProgressRetryBytes, strings.Repeat("y", MaxProgressRetryBytes)},
	} {
		got := RetryText(tc.in, tc.n)
		if got != tc.want {
			t.Errorf("%s: RetryText(%q, %d) = %q, want %q", tc.name, tc.in, tc.n, got, tc.want)
		}
		if err := CheckRetry(got); err != nil {
			t.Errorf("%s: CheckRetry(RetryText(...)) = %v", tc.name, err)
		}
	}
	for _, bad := range []string{"a\nb", "\x7f", "\xff", strings.Repeat("z", MaxProgressRetryBytes+1)} {
		if err := CheckRetry(bad); err == nil {
			t.Errorf("CheckRetry(%q) = nil, want an error", bad)
		}
	}
}

// FuzzRetryText: for any input and bound, RetryText's result is valid
// UTF-8 within the bound, passes CheckRetry, is unchanged by a second
// RetryText, and equals the input when the input already passed.
func FuzzRetryText(f *testing.F) {
	f.Add("piece 1 of 2: controller request stalled for 1m0s", 300)
	f.Add("\xe2\x82\xac\xe2\x82", 4)
	f.Add("a\x00b", 1)
	f.Fuzz(func(t *testing.T, s string, n int) {
		got := RetryText(s, n)
		limit := n
		if limit <= 0 || limit > MaxProgressRetryBytes {
			limit = MaxProgressRetryBytes
		}
		if len(got) > limit || !utf8.ValidString(got) {
			t.Fatalf("RetryText(%q, %d) = %q: %d bytes (bound %d), valid UTF-8 %v", s, n, got, len(got), limit, utf8.ValidString(got))
		}
		if err := CheckRetry(got); err != nil {
			t.Fatalf("CheckRetry(RetryText(%q, %d)) = %v", s, n, err)
		}
		if again := RetryText(got, n); again != got {
			t.Fatalf("RetryText not idempotent: %q then %q", got, again)
		}
		if CheckRetry(s) == nil && len(s) <= limit && got != s {
			t.Fatalf("RetryText changed accepted text %q into %q", s, got)
		}
	})
}
