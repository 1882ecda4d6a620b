package redfish_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
)

// failedLogins counts the requests the BMC answered 401.
func failedLogins(sim *bmcsim.Server) int {
	n := 0
	for _, r := range sim.Requests() {
		if r.Status == http.StatusUnauthorized {
			n++
		}
	}
	return n
}

// TestAuthNegotiation drives the driver against BMCs without a session
// service (Basic only, with a 401 challenge), without sessions (405), with
// sessions, and with authentication off: the right password works with the
// scheme the BMC offers, a wrong one is refused in exactly one attempt with
// an error naming the scheme, and Config.Auth forces the scheme.
func TestAuthNegotiation(t *testing.T) {
	for _, tc := range []struct {
		name       string
		quirks     bmcsim.Quirks
		auth       string
		wantScheme string
		wantText   string // in the wrong-password error
	}{
		{"basic-only-401-challenge", bmcsim.Quirks{BasicOnly: true}, "", "basic", "HTTP Basic"},
		{"sessions-405", bmcsim.Quirks{NoSessions: true}, "", "basic", "HTTP Basic"},
		{"sessions", bmcsim.Quirks{}, "", "session", "Redfish session login"},
		{"forced-basic", bmcsim.Quirks{}, redfish.AuthBasic, "basic", "HTTP Basic"},
		{"forced-session", bmcsim.Quirks{}, redfish.AuthSession, "session", "Redfish session login"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := tc.quirks
			l := newLab(t, treeOpenBMC, labOpts{on: true, quirks: &q, lockout: 3, tune: func(c *redfish.Config) { c.Auth = tc.auth }})
			if _, err := l.drv.PowerState(context.Background()); err != nil {
				t.Fatalf("right password: %v", err)
			}
			if got := l.drv.AuthScheme(); got != tc.wantScheme {
				t.Errorf("AuthScheme = %q, want %q", got, tc.wantScheme)
			}
			for _, r := range l.sim.Requests() {
				if r.Auth != "" && r.Auth != tc.wantScheme {
					t.Errorf("request %v used %s auth, want only %s", r, r.Auth, tc.wantScheme)
				}
			}
			// Remembered: a second operation does not negotiate again.
			n := len(l.sim.Requests())
			if _, err := l.drv.BootOverride(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, r := range l.sim.Requests()[n:] {
				if r.Method == http.MethodPost || r.Path == "/redfish/v1" {
					t.Errorf("second operation negotiated again: %v", r)
				}
			}

			l.sim.ClearRequests()
			bad := newLabWith(t, l.sim).driverWith(t, "wrong", tc.auth)
			// Info reads many resources: still one refused attempt.
			_, err := bad.Info(context.Background())
			if !errors.Is(err, bmc.ErrAuth) {
				t.Fatalf("wrong password: err = %v, want ErrAuth", err)
			}
			if !strings.Contains(err.Error(), "credentials refused") || !strings.Contains(err.Error(), tc.wantText) || !strings.Contains(err.Error(), "HTTP 401") {
				t.Errorf("wrong password error %q: want 'credentials refused', %q and the HTTP status", err, tc.wantText)
			}
			if n := failedLogins(l.sim); n != 1 {
				t.Errorf("wrong password: %d failed attempts, want exactly 1: %v", n, l.sim.Requests())
			}
			if _, err := bad.PowerState(context.Background()); !errors.Is(err, bmc.ErrAuth) {
				t.Fatalf("second command: %v", err)
			}
			if n := failedLogins(l.sim); n != 2 {
				t.Errorf("two commands: %d failed attempts, want 2", n)
			}
			if l.sim.Locked() {
				t.Error("account locked after two commands with lockout threshold 3")
			}
		})
	}
}

// A BMC with authentication off is usable without any credentials.
func TestNoCredentials(t *testing.T) {
	l := newLab(t, treeOpenBMC, labOpts{on: true, quirks: &bmcsim.Quirks{NoAuth: true}, tune: func(c *redfish.Config) { c.Username, c.Password = "", "" }})
	if _, err := l.drv.Info(context.Background()); err != nil {
		t.Fatalf("Info without credentials: %v", err)
	}
	if got := l.drv.AuthScheme(); got != "none" {
		t.Errorf("AuthScheme = %q, want none", got)
	}
	// The same driver against a BMC that wants credentials: one clear error.
	l2 := newLab(t, treeOpenBMC, labOpts{on: true, tune: func(c *redfish.Config) { c.Username, c.Password = "", "" }})
	_, err := l2.drv.PowerState(context.Background())
	if !errors.Is(err, bmc.ErrAuth) || !strings.Contains(err.Error(), "no credentials configured") {
		t.Fatalf("no credentials against an authenticating BMC: %v", err)
	}
}
