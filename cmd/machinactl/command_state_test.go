package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/state"
)

// TestStateSnapshotAndRestore takes an online snapshot over the TLS admin
// API while the store stays open, then opens the copy as a restored state
// file: the secret opens with the master key and the admin token
// authenticates. Without a token the endpoint answers 401.
func TestStateSnapshotAndRestore(t *testing.T) {
	st, tlsAddr, _, caFile, tok := tlsAdminFixture(t)
	if _, err := st.PutSecret("bmc-default", state.Credential{Username: "admin", Password: "pw-in-snapshot"}, "ops"); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envToken, tok)
	dst := filepath.Join(t.TempDir(), "backup.db")
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"state", "snapshot", dst, "--api", "https://" + tlsAddr, "--ca-file", caFile}, strings.NewReader(""), &out, &errb)
	if code != 0 {
		t.Fatalf("state snapshot: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "checked") {
		t.Errorf("stdout %q", out.String())
	}
	fi, err := os.Stat(dst)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("snapshot file: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
	// The live store keeps working after the snapshot.
	if _, err := st.PutSecret("after", state.Credential{Username: "u", Password: "p"}, "ops"); err != nil {
		t.Fatalf("store after snapshot: %v", err)
	}
	restored, err := state.Open(dst, state.Options{MasterKey: []byte("master-key-for-tls-test")})
	if err != nil {
		t.Fatalf("open the snapshot as a state file: %v", err)
	}
	defer restored.Close()
	if cred, err := restored.Secret("bmc-default"); err != nil || cred.Password != "pw-in-snapshot" {
		t.Errorf("restored secret = %v, %v", cred, err)
	}
	if _, err := restored.Secret("after"); err == nil {
		t.Error("the snapshot holds a secret written after it")
	}
	if _, err := restored.AuthenticateAdmin(tok); err != nil {
		t.Errorf("restored admin token: %v", err)
	}
	evs, _ := st.Events(state.EventQuery{})
	found := false
	for _, e := range evs {
		found = found || (e.Kind == "state.snapshot" && e.Actor == "ops")
	}
	if !found {
		t.Error("no state.snapshot event by ops")
	}

	// No token: 401, nothing streamed.
	hc, err := (&connFlags{caFile: caFile}).httpClient()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get("https://" + tlsAddr + "/api/v1/state/snapshot")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("snapshot without a token: %d, want 401", resp.StatusCode)
	}
}
