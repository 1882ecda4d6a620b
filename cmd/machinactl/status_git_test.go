package main

import (
	"bytes"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// TestWriteGitLines: `machinactl status` shows the Git side from GET
// /api/v1/status: a healthy poller and write-back with the age of their
// last success; a refused write-back as FAILING with its consecutive
// failures and error; a poller behind the remote tip; nothing without a
// repository.
func TestWriteGitLines(t *testing.T) {
	now := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	for _, tc := range []struct {
		name string
		g    *v1.GitHealth
		want string
	}{
		{"none", nil, ""},
		{"healthy", &v1.GitHealth{Poll: v1.GitLoopHealth{LastSuccess: ago(3 * time.Second)}, Push: v1.GitLoopHealth{LastSuccess: ago(40 * time.Second)},
			LastStatusCommit: "0123456789abcdef0123456789abcdef01234567", LastStatusPackBytes: 9060},
			"Git poll:   ok, last success 3s ago\nGit push:   ok, last success 40s ago, last status commit 0123456789ab (9060 bytes pushed)\n"},
		{"refused", &v1.GitHealth{Poll: v1.GitLoopHealth{LastSuccess: ago(time.Second)},
			Push: v1.GitLoopHealth{LastSuccess: ago(10 * time.Minute), ConsecutiveFailures: 4, Failing: true, LastError: "pre-receive hook declined"}},
			"Git poll:   ok, last success 1s ago\nGit push:   FAILING: 4 consecutive failures, last success 10m0s ago: pre-receive hook declined\n"},
		{"behind", &v1.GitHealth{Poll: v1.GitLoopHealth{ConsecutiveFailures: 1, LastError: "fetch: timeout"}, Behind: -1, RemoteTip: "fedcba9876543210"},
			"Git poll:   failing: 1 consecutive failure, never succeeded: fetch: timeout\nGit push:   ok, never succeeded\n"},
		{"lagging", &v1.GitHealth{Poll: v1.GitLoopHealth{LastSuccess: ago(time.Second)}, Behind: 2, RemoteTip: "fedcba9876543210"},
			"Git poll:   ok, last success 1s ago, 2 commits behind the remote tip fedcba987654\nGit push:   ok, never succeeded\n"},
	} {
		var b bytes.Buffer
		writeGitLines(&b, tc.g, now)
		if b.String() != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, b.String(), tc.want)
		}
	}
}
