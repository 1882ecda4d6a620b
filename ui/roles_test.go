package ui_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/machina-metal/machina/state"
	"github.com/machina-metal/machina/ui/uitest"
)

// TestUIHidesWhatTheRoleCannotDo: logged in with a viewer's admin token,
// the server page has no serial console button, the inventory page and
// the approval page show no approve button or form but say the role
// cannot approve, and asking anyway is refused (the console WebSocket 403,
// POST approve 403 with nothing recorded); with an operator's token the
// button and the form are there and the approval is recorded.
func TestUIHidesWhatTheRoleCannotDo(t *testing.T) {
	l := newLab(t, uitest.Options{})
	rev := strings.TrimPrefix(uitest.HeldDigest, "sha256:")[:12]
	for _, tc := range []struct {
		role state.Role
		can  bool
	}{{state.RoleViewer, false}, {state.RoleOperator, true}} {
		tok, _, err := l.Store.CreateAdminTokenRole("ui-"+string(tc.role), tc.role, state.ActorLocal)
		if err != nil {
			t.Fatal(err)
		}
		c := client(t)
		if resp := postForm(t, c, l.URL()+"/ui/login", url.Values{"token": {tok}}, l.URL()); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("%s login = %d", tc.role, resp.StatusCode)
		}
		_, body := get(t, c, l.URL()+"/ui/servers/r1-n01")
		if got := strings.Contains(body, `id="open-console"`); got != tc.can {
			t.Errorf("%s: server page console button %v, want %v", tc.role, got, tc.can)
		}
		_, body = get(t, c, l.URL()+"/ui/inventory")
		if got := strings.Contains(body, `id="approve"`); got != tc.can || strings.Contains(body, `id="approve-role"`) == tc.can {
			t.Errorf("%s: inventory page approve button %v, want %v", tc.role, got, tc.can)
		}
		_, body = get(t, c, l.URL()+"/ui/inventory/approve?rev="+rev)
		if got := strings.Contains(body, `id="do-approve"`); got != tc.can {
			t.Errorf("%s: approval page form %v, want %v", tc.role, got, tc.can)
		}
		if !tc.can {
			resp, _ := get(t, c, l.URL()+"/ui/servers/r1-n01/console/ws")
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s: console WebSocket = %d, want 403", tc.role, resp.StatusCode)
			}
		}
		csrf := csrfOf(t, c, l)
		resp := postForm(t, c, l.URL()+"/ui/inventory/approve", url.Values{"rev": {rev}, "confirm": {"yes"}, "csrf": {csrf}}, l.URL())
		want := http.StatusForbidden
		if tc.can {
			want = http.StatusSeeOther
		}
		if resp.StatusCode != want {
			t.Errorf("%s: POST approve = %d, want %d", tc.role, resp.StatusCode, want)
		}
		if ok, _ := l.Store.Approved(uitest.HeldDigest); ok != tc.can {
			t.Errorf("%s: approved = %v after POST, want %v", tc.role, ok, tc.can)
		}
	}
}

// csrfOf reads the session's CSRF token from a page.
func csrfOf(t *testing.T, c *http.Client, l *uitest.Lab) string {
	t.Helper()
	_, body := get(t, c, l.URL()+"/ui/hosts")
	i := strings.Index(body, `name="csrf" value="`)
	if i < 0 {
		t.Fatalf("no CSRF token in page:\n%s", body)
	}
	rest := body[i+len(`name="csrf" value="`):]
	return rest[:strings.IndexByte(rest, '"')]
}
