package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/bmc/bmctest"
	"github.com/machina-metal/machina/state"
)

// newAPIFixture serves the admin API over a fresh sealed store and returns
// the store, the server and an admin token named ops; both close at the
// end of the test.
func newAPIFixture(t *testing.T) (*state.Store, *httptest.Server, string) {
	t.Helper()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{MasterKey: []byte("master-key-for-cli-test")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	a, err := api.New(api.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(a.Handler())
	t.Cleanup(hs.Close)
	tok, _, err := st.CreateAdminToken("ops", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	return st, hs, tok
}

func TestSecretSetThroughAPI(t *testing.T) {
	st, hs, tok := newAPIFixture(t)
	const pw = "s3cret-from-stdin"
	ctx := context.Background()

	t.Setenv(envToken, tok)
	var out, errb bytes.Buffer
	code := run(ctx, []string{"secret", "set", "bmc-default", "--username", "admin", "--password-stdin", "--api", hs.URL}, strings.NewReader(pw+"\r\n"), &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "sealed at rest") || strings.Contains(out.String()+errb.String(), pw) {
		t.Errorf("output %q %q", out.String(), errb.String())
	}
	cred, err := st.Secret("bmc-default")
	if err != nil || cred.Username != "admin" || cred.Password != pw {
		t.Errorf("stored %v, %v", cred, err)
	}
	evs, _ := st.Events(state.EventQuery{})
	last := evs[len(evs)-1]
	if last.Kind != state.EventSecretSet || last.Actor != "ops" {
		t.Errorf("audit event %+v", last)
	}

	// MACHINA_API is read when --api is absent.
	t.Setenv(envAPI, hs.URL)
	if code := run(ctx, []string{"secret", "set", "ipmi", "--username", "root", "--password-stdin"}, strings.NewReader("pw2"), &out, &errb); code != 0 {
		t.Errorf("with MACHINA_API: exit %d: %s", code, errb.String())
	}

	cases := []struct {
		name  string
		args  []string
		stdin string
		token string
		want  string
	}{
		{"no --password-stdin", []string{"secret", "set", "x", "--username", "u", "--api", hs.URL}, "pw", tok, "never taken from the command line"},
		{"no token", []string{"secret", "set", "x", "--username", "u", "--password-stdin", "--api", hs.URL}, "pw", "", "MACHINA_TOKEN is not set"},
		{"bad token", []string{"secret", "set", "x", "--username", "u", "--password-stdin", "--api", hs.URL}, "pw", "mna_nope", "401"},
		{"empty password", []string{"secret", "set", "x", "--username", "u", "--password-stdin", "--api", hs.URL}, "\n", tok, "empty password"},
		{"bad name", []string{"secret", "set", "Bad_Name", "--username", "u", "--password-stdin", "--api", hs.URL}, "pw", tok, "400"},
		{"no username", []string{"secret", "set", "x", "--password-stdin", "--api", hs.URL}, "pw", tok, "--username is required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(envToken, c.token)
			var out, errb bytes.Buffer
			code := run(ctx, c.args, strings.NewReader(c.stdin), &out, &errb)
			if code != 2 || !strings.Contains(errb.String(), c.want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, errb.String(), c.want)
			}
		})
	}
}

// TestSecretSetPEMFile: a CA bundle for bmc.caBundle is stored
// from a PEM file, as the secret's value.
func TestSecretSetPEMFile(t *testing.T) {
	st, hs, tok := newAPIFixture(t)
	t.Setenv(envToken, tok)
	ca := bmctest.NewCA(t)
	f := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(f, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"secret", "set", "site-ca", "--pem-file", f, "--api", hs.URL}, strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	cred, err := st.Secret("site-ca")
	if err != nil || cred.Password != string(ca.PEM()) {
		t.Errorf("stored %d bytes, %v", len(cred.Password), err)
	}
	if err := os.WriteFile(f, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := run(context.Background(), []string{"secret", "set", "bad", "--pem-file", f, "--api", hs.URL}, strings.NewReader(""), &out, &errb); code != 2 || !strings.Contains(errb.String(), "no PEM certificate") {
		t.Errorf("not PEM: exit %d, %s", code, errb.String())
	}
}
