package sim_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/gitops"
)

// refuseStatusHook is a pre-receive hook that refuses every push of a
// commit the status writer made (author gitops.BotEmail), as a Git
// server's branch protection refusing a bot does, and lets the
// operator's pushes through.
const refuseStatusHook = `#!/bin/sh
while read old new ref; do
	if [ "$(git log -1 --format=%ae "$new")" = "` + gitops.BotEmail + `" ]; then
		echo "status pushes refused by policy" >&2
		exit 1
	fi
done
exit 0
`

// TestGitHealthRefusedPush: while the inventory repository refuses the
// status writer's pushes, GET /api/v1/status and /metrics show the
// write-back's consecutive failures growing, with the remote's error,
// while the poller stays healthy and names the revision acted on; once
// the remote accepts again, the next status commit resets the count.
func TestGitHealthRefusedPush(t *testing.T) {
	r := startRig(t, rigOptions{})
	r.steady()
	hook := filepath.Join(strings.TrimPrefix(r.lab.RepoURL, "file://"), "hooks", "pre-receive")
	if err := os.MkdirAll(filepath.Dir(hook), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hook, []byte(refuseStatusHook), 0o755); err != nil {
		t.Fatal(err)
	}
	// An inventory change gives the status writer something to push.
	id := r.commit("tag r1-n01", func(dir string) { r.setServer(dir, "r1-n01", "tags", "[nvme, kvm, e2e]") })
	status := func() v1.Status {
		code, body := r.admin("GET", "/api/v1/status", nil)
		var st v1.Status
		if code != 200 || json.Unmarshal(body, &st) != nil || st.Git == nil {
			t.Fatalf("GET /api/v1/status = %d %s", code, body)
		}
		return st
	}
	metric := func(name string) float64 {
		code, body := r.admin("GET", "/metrics", nil)
		if code != 200 {
			t.Fatalf("GET /metrics = %d", code)
		}
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(body)
		if m == nil {
			t.Fatalf("/metrics lacks %s", name)
		}
		v, err := strconv.ParseFloat(string(m[1]), 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	const pushFailures = `machina_git_consecutive_failures{loop="push"}`
	waitUntil(t, "two refused status writes in the API", 3*time.Minute, func() bool {
		return status().Git.Push.ConsecutiveFailures >= 2
	})
	st := status()
	if g := st.Git; !strings.Contains(g.Push.LastError, "pre-receive hook declined") || g.Poll.ConsecutiveFailures != 0 || g.Poll.LastSuccess == nil ||
		g.ActingCommit != id || g.ActingDigest == "" {
		t.Errorf("git health while pushes are refused = %+v (acting on %s wanted)", g, id)
	}
	if v := metric(pushFailures); v < 2 {
		t.Errorf("%s = %v, want >= 2", pushFailures, v)
	}
	if v := metric(`machina_git_revision_info{commit="` + id + `",digest="` + st.Git.ActingDigest + `"}`); v != 1 {
		t.Errorf("machina_git_revision_info = %v", v)
	}
	if err := os.Remove(hook); err != nil {
		t.Fatal(err)
	}
	refused := time.Now()
	waitUntil(t, "the write-back to recover", 3*time.Minute, func() bool {
		g := status().Git
		return g.Push.ConsecutiveFailures == 0 && g.Push.LastSuccess != nil && g.Push.LastSuccess.After(refused)
	})
	if v := metric(pushFailures); v != 0 {
		t.Errorf("%s after recovery = %v, want 0", pushFailures, v)
	}
	if v := metric(`machina_git_last_success_timestamp_seconds{loop="push"}`); v < float64(refused.Unix()) {
		t.Errorf("push last success %v, before the recovery at %d", v, refused.Unix())
	}
	r.waitStatus("status/inventory.yaml", id)
}
