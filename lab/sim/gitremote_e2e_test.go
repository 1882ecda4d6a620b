package sim_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/gitops"
)

// TestFirstStatusCommitNamesRevisionAndWebhookPolls runs the controller
// against the lab's inventory repository with an hour's poll interval:
// its first status commit names the inventory revision (not "none": the
// reconciler's first pass runs before the first poll ends), and a signed
// push webhook on the controller's route, with no admin token, makes it
// fetch an operator's new commit at once.
func TestFirstStatusCommitNamesRevisionAndWebhookPolls(t *testing.T) {
	const secret = "whsec-e2e-0a1b2c3d"
	secretFile := filepath.Join(t.TempDir(), "webhook.secret")
	if err := os.WriteFile(secretFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startRig(t, rigOptions{config: func(c *controller.Config) {
		c.WebhookSecretFile = secretFile
		c.PollInterval = time.Hour
	}})
	bare := strings.TrimPrefix(r.lab.RepoURL, "file://")

	// The oldest status commit names a revision.
	var first *object.Commit
	deadline := time.Now().Add(time.Minute)
	for first == nil {
		if time.Now().After(deadline) {
			t.Fatal("no status commit within a minute")
		}
		repo, err := git.PlainOpen(bare)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := repo.Head()
		if err != nil {
			t.Fatal(err)
		}
		c, err := repo.CommitObject(ref.Hash())
		for err == nil {
			if strings.Contains(c.Message, "\n"+gitops.TrailerRevision+": ") {
				first = c
			}
			if c.NumParents() == 0 {
				break
			}
			c, err = c.Parent(0)
		}
		if first == nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if strings.Contains(first.Message, gitops.TrailerRevision+": none") {
		t.Errorf("first status commit names no revision:\n%s", first.Message)
	}

	// An operator pushes; the webhook makes the controller fetch it.
	work := filepath.Join(t.TempDir(), "work")
	gitRun := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("git", append([]string{"-c", "user.name=Op", "-c", "user.email=op@site.lan"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	gitRun("clone", "-q", bare, work)
	servers := filepath.Join(work, "servers.yaml")
	b, err := os.ReadFile(servers)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "tags: [kvm]") {
		t.Fatal("servers.yaml has no 'tags: [kvm]' to edit")
	}
	if err := os.WriteFile(servers, []byte(strings.Replace(string(b), "tags: [kvm]", "tags: [kvm, webhook]", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	gitRun("-C", work, "commit", "-q", "-am", "servers: tag one server webhook")
	for i := 0; ; i++ {
		out, err := exec.Command("git", "-C", work, "push", "-q", "origin", "HEAD:main").CombinedOutput()
		if err == nil {
			break
		}
		if i == 10 {
			t.Fatalf("push: %v: %s", err, out)
		}
		gitRun("-C", work, "pull", "-q", "--rebase", "origin", "main") // a status commit landed meanwhile
	}
	want := gitRun("-C", work, "rev-parse", "HEAD")
	body := `{"ref":"refs/heads/main","after":"` + want + `"}`
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(body))
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, r.run.URL+"/api/v1/git/webhook", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("webhook = %d, want 202", resp.StatusCode)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		if good, _ := r.run.Source.Latest(); good.Commit == want {
			break
		}
		if time.Now().After(deadline) {
			good, bad := r.run.Source.Latest()
			t.Fatalf("revision %s 30 s after the webhook, want the pushed %s (poll interval 1h); invalid: %+v", good.Commit, want, bad)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
