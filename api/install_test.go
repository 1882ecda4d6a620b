package api_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/state"
)

// fakeInstaller serves a tree and ISO from a temp dir and renders a
// document naming the callback token.
type fakeInstaller struct {
	tree, iso string
	mu        sync.Mutex
	tokens    []string
}

func (f *fakeInstaller) InstallerFiles(context.Context, state.Server) (string, string, error) {
	return f.tree, f.iso, nil
}

func (f *fakeInstaller) InstallerDocument(_ context.Context, srv state.Server, cb string) ([]byte, error) {
	f.mu.Lock()
	f.tokens = append(f.tokens, cb)
	f.mu.Unlock()
	return []byte("doc for " + srv.Name + " " + srv.Allocation.Deploy + " callback " + api.InstallDonePath + cb + "\n"), nil
}

func (f *fakeInstaller) last() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tokens[len(f.tokens)-1]
}

// deployingServer walks a server to deploying with an installer allocation.
func deployingServer(t *testing.T, f *fixture, name, mac, deploy string) {
	t.Helper()
	if _, err := f.store.CreateServer(state.Server{Name: name, BootMAC: mac}); err != nil {
		t.Fatal(err)
	}
	for _, to := range []state.Lifecycle{state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying} {
		s, _ := f.store.Server(name)
		_, err := f.store.Apply(state.Move{Server: name, From: s.Lifecycle, To: to, Reason: "test", Update: func(s *state.Server) error {
			if to == state.LifecycleAllocated {
				s.Allocation = &state.Allocation{Profile: "p", Image: "ubuntu-live", Deploy: deploy, At: time.Unix(1700000000, 0)}
			}
			return nil
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestInstallerEndpoints: the install token (reusable, short-lived, bound
// to a deploying installer server) reads the tree, the ISO and the
// installer's documents and nothing else; each document carries a fresh
// single-use completion token; the callback moves the server deploying →
// deployed (FinishDeploy) once; an expired install token is refused; the
// tree never serves a path outside itself.
func TestInstallerEndpoints(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	var clockMu sync.Mutex
	clock := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	f := newFixture(t, state.Options{Now: clock})
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	for p, c := range map[string]string{"casper/vmlinuz": "KERNEL", "casper/initrd": "INITRD"} {
		os.MkdirAll(filepath.Dir(filepath.Join(tree, p)), 0o755)
		os.WriteFile(filepath.Join(tree, p), []byte(c), 0o644)
	}
	os.WriteFile(filepath.Join(dir, "secret"), []byte("outside"), 0o644)
	iso := filepath.Join(dir, "blob")
	os.WriteFile(iso, []byte("ISO9660"), 0o644)
	inst := &fakeInstaller{tree: tree, iso: iso}
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, Installer: inst})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	deployingServer(t, f, "r1-n01", "52:54:00:00:00:01", "autoinstall")
	deployingServer(t, f, "r1-n02", "52:54:00:00:00:02", "image")

	tok, _, err := f.store.IssueToken(state.TokenSpec{Purpose: state.PurposeInstall, Server: "r1-n01", MAC: "52:54:00:00:00:01", TTL: 10 * time.Minute, Reusable: true})
	if err != nil {
		t.Fatal(err)
	}
	base := "/install/" + tok
	for _, c := range []struct {
		path string
		code int
		body string
	}{
		{base + "/tree/casper/vmlinuz", 200, "KERNEL"},
		{base + "/tree/casper/vmlinuz", 200, "KERNEL"}, // reusable
		{base + "/tree/casper/initrd", 200, "INITRD"},
		{base + "/tree/../secret", 404, ""},
		{base + "/tree/casper/../../secret", 404, ""},
		{base + "/tree/casper", 404, ""},
		{base + "/iso/ubuntu-live.iso", 200, "ISO9660"},
		{base + "/iso/other.iso", 404, ""},
		{base + "/nocloud/meta-data", 200, "instance-id: r1-n01-1700000000\nlocal-hostname: r1-n01\n"},
		{base + "/nocloud/network-config", 404, ""},
		{base + "/ks.cfg", 404, ""}, // not a kickstart server
		{"/install/not-a-token/tree/casper/vmlinuz", 403, ""},
	} {
		code, _, body := f.do(t, http.MethodGet, c.path, "", "")
		if code != c.code || (c.body != "" && string(body) != c.body) {
			t.Errorf("GET %s = %d %q, want %d %q", strings.Replace(c.path, tok, "TOKEN", 1), code, body, c.code, c.body)
		}
	}
	// Other purposes' tokens do not open installer files.
	planTok, _, _ := f.store.IssueToken(state.TokenSpec{Purpose: state.PurposePlan, Server: "r1-n01"})
	if code, _, _ := f.do(t, http.MethodGet, "/install/"+planTok+"/tree/casper/vmlinuz", "", ""); code != 403 {
		t.Errorf("deploy token on the installer tree: %d, want 403", code)
	}
	// An image-deploy server has no installer files.
	imgTok, _, _ := f.store.IssueToken(state.TokenSpec{Purpose: state.PurposeInstall, Server: "r1-n02", Reusable: true})
	if code, _, _ := f.do(t, http.MethodGet, "/install/"+imgTok+"/tree/casper/vmlinuz", "", ""); code != 404 {
		t.Errorf("installer tree of an image deploy: %d, want 404", code)
	}

	// user-data twice: two different single-use callback tokens.
	code, _, body := f.do(t, http.MethodGet, base+"/nocloud/user-data", "", "")
	if code != 200 || !strings.Contains(string(body), "callback /install/done/") {
		t.Fatalf("user-data: %d %s", code, body)
	}
	first := inst.last()
	f.do(t, http.MethodGet, base+"/nocloud/user-data", "", "")
	second := inst.last()
	if first == second {
		t.Error("two documents share a callback token")
	}
	if code, _, _ := f.do(t, http.MethodPost, "/install/done/"+tok, "", ""); code != 403 {
		t.Errorf("install token as callback: %d, want 403", code)
	}
	if code, _, _ := f.do(t, http.MethodGet, "/install/done/"+first, "", ""); code == 204 {
		t.Error("GET completed the install")
	}
	// One live token per purpose: the second document's callback token
	// revoked the first's.
	if code, _, _ := f.do(t, http.MethodPost, "/install/done/"+first, "", ""); code != 403 {
		t.Errorf("revoked callback token: %d, want 403", code)
	}
	if code, _, body := f.do(t, http.MethodPost, "/install/done/"+second, "", ""); code != 204 {
		t.Fatalf("callback: %d %s", code, body)
	}
	s, _ := f.store.Server("r1-n01")
	if s.Lifecycle != state.LifecycleDeployed || !s.FinishDeploy {
		t.Errorf("after the callback: %s finishDeploy %v, want deployed true", s.Lifecycle, s.FinishDeploy)
	}
	// The same request again (the answer lost): the same answer, and no
	// second transition.
	if code, _, _ := f.do(t, http.MethodPost, "/install/done/"+second, "", ""); code != 204 {
		t.Errorf("callback retried: %d, want the recorded 204", code)
	}
	if s2, _ := f.store.Server("r1-n01"); s2.Revision != s.Revision {
		t.Errorf("callback retried: revision %d → %d, want no change", s.Revision, s2.Revision)
	}
	if code, _, _ := f.do(t, http.MethodPost, "/install/done/"+first, "", ""); code != 403 {
		t.Errorf("revoked callback after deployed: %d, want 403", code)
	}
	// A deployed server's installer files are closed.
	if code, _, _ := f.do(t, http.MethodGet, base+"/tree/casper/vmlinuz", "", ""); code != 409 {
		t.Errorf("tree after deployed: %d, want 409", code)
	}

	// Expiry: a new deploying server, its install token read once, then
	// the clock passes its TTL.
	deployingServer(t, f, "r1-n03", "52:54:00:00:00:03", "kickstart")
	tok3, _, _ := f.store.IssueToken(state.TokenSpec{Purpose: state.PurposeInstall, Server: "r1-n03", TTL: 10 * time.Minute, Reusable: true})
	if code, _, body := f.do(t, http.MethodGet, "/install/"+tok3+"/ks.cfg", "", ""); code != 200 || !strings.Contains(string(body), "kickstart") {
		t.Fatalf("ks.cfg: %d %s", code, body)
	}
	cb3 := inst.last()
	clockMu.Lock()
	now = now.Add(11 * time.Minute)
	clockMu.Unlock()
	if code, _, _ := f.do(t, http.MethodGet, "/install/"+tok3+"/ks.cfg", "", ""); code != 403 {
		t.Errorf("expired install token: %d, want 403", code)
	}
	clockMu.Lock()
	now = now.Add(2 * time.Hour)
	clockMu.Unlock()
	if code, _, _ := f.do(t, http.MethodPost, "/install/done/"+cb3, "", ""); code != 403 {
		t.Errorf("expired callback token: %d, want 403", code)
	}
	if strings.Contains(f.logs.String(), tok) || strings.Contains(f.logs.String(), first) {
		t.Error("a token reached the logs")
	}
}
