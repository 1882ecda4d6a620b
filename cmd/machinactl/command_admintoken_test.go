package main

import (
	"bytes"
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/machina-metal/machina/state"
)

// TestAdminTokenThroughAPI: while the controller holds the state file, an
// operator creates a token through the admin API (its value printed once,
// the creator recorded), lists tokens (names only), and revokes the new
// one: its next request is refused. A taken name or an unknown one exits 2.
func TestAdminTokenThroughAPI(t *testing.T) {
	st, hs, tok := newAPIFixture(t)
	t.Setenv(envToken, tok)
	ctl := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), append(args, "--api", hs.URL), strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}

	code, out, errOut := ctl("admin-token", "create", "alice")
	newTok := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(newTok, state.AdminTokenPrefix) || !strings.Contains(errOut, "shown only this once") {
		t.Fatalf("create: exit %d, %q %q", code, out, errOut)
	}
	if got, err := st.AuthenticateAdmin(newTok); err != nil || got.Name != "alice" || got.CreatedBy != "ops" {
		t.Errorf("new token authenticates as %+v (%v), want alice created by ops", got, err)
	}
	if code, _, errOut := ctl("admin-token", "create", "alice"); code != 2 || !strings.Contains(errOut, "409") || !strings.Contains(errOut, "exists") {
		t.Errorf("create a taken name: exit %d %q, want a 409 saying it exists", code, errOut)
	}
	if code, _, errOut := ctl("admin-token", "create", "Bad_Name"); code != 2 || !strings.Contains(errOut, "RFC 1123") {
		t.Errorf("create a bad name: exit %d %q", code, errOut)
	}
	code, out, _ = ctl("admin-token", "list")
	if code != 0 || !strings.Contains(out, "alice") || !strings.Contains(out, "ops") || strings.Contains(out, newTok) || strings.Contains(out, tok) {
		t.Errorf("list: exit %d\n%s", code, out)
	}

	if code, out, errOut := ctl("admin-token", "revoke", "alice"); code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("revoke: exit %d %q %q", code, out, errOut)
	}
	req, _ := http.NewRequest(http.MethodGet, hs.URL+"/api/v1/servers", nil)
	req.Header.Set("Authorization", "Bearer "+newTok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the revoked token's request: %s, want 401", resp.Status)
	}
	if code, _, errOut := ctl("admin-token", "revoke", "nobody"); code != 2 || !strings.Contains(errOut, "nobody") {
		t.Errorf("revoke an unknown name: exit %d %q", code, errOut)
	}
	// ops is now the only token: revoking it would lock the admin API out
	// while the controller holds the state file.
	if code, _, errOut := ctl("admin-token", "revoke", "ops"); code != 2 || !strings.Contains(errOut, "the last one") {
		t.Errorf("revoke the last token: exit %d %q", code, errOut)
	}
	if _, err := st.AuthenticateAdmin(tok); err != nil {
		t.Errorf("the last token was revoked: %v", err)
	}
	evs, _ := st.Events(state.EventQuery{Limit: state.MaxPageSize})
	var kinds []string
	for _, e := range evs {
		if e.Kind == state.EventAdminCreated || e.Kind == state.EventAdminRevoked {
			kinds = append(kinds, string(e.Kind)+" by "+e.Actor)
		}
		if strings.Contains(e.Message, newTok) {
			t.Errorf("token value in event %+v", e)
		}
	}
	if want := "admin_token.created by local|admin_token.created by ops|admin_token.revoked by ops"; strings.Join(kinds, "|") != want {
		t.Errorf("audit %q, want %q", strings.Join(kinds, "|"), want)
	}
}

// TestAdminTokenCreateRole: `admin-token create NAME --role viewer` makes
// a viewer token (the list shows each role; no --role means admin); an
// unknown role exits 2; with the viewer's token, creating one is refused
// (exit 2 naming the role needed: admin).
func TestAdminTokenCreateRole(t *testing.T) {
	st, hs, tok := newAPIFixture(t)
	t.Setenv(envToken, tok)
	ctl := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), append(args, "--api", hs.URL), strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, errOut := ctl("admin-token", "create", "watcher", "--role", "viewer")
	viewer := strings.TrimSpace(out)
	if code != 0 || !strings.Contains(errOut, "role viewer") {
		t.Fatalf("create --role viewer: exit %d %q %q", code, out, errOut)
	}
	if got, err := st.AuthenticateAdmin(viewer); err != nil || got.Role != state.RoleViewer {
		t.Errorf("the new token = %+v (%v), want role viewer", got, err)
	}
	if code, _, errOut := ctl("admin-token", "create", "full"); code != 0 || !strings.Contains(errOut, "role admin") {
		t.Errorf("create without --role: exit %d %q", code, errOut)
	}
	if code, _, errOut := ctl("admin-token", "create", "x", "--role", "root"); code != 2 || !strings.Contains(errOut, "role") {
		t.Errorf("create --role root: exit %d %q", code, errOut)
	}
	code, out, _ = ctl("admin-token", "list")
	if code != 0 || !strings.Contains(out, "ROLE") || !regexpMatch(`watcher\s+\S+\s+viewer`, out) || !regexpMatch(`full\s+\S+\s+admin`, out) {
		t.Errorf("list: exit %d\n%s", code, out)
	}
	t.Setenv(envToken, viewer)
	if code, _, errOut := ctl("admin-token", "create", "sneaky", "--role", "admin"); code != 2 || !strings.Contains(errOut, "403") || !strings.Contains(errOut, "role admin") {
		t.Errorf("a viewer creating a token: exit %d %q, want a 403 naming role admin", code, errOut)
	}
}

func regexpMatch(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }
