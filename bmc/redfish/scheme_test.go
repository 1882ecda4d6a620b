package redfish_test

import (
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
)

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	n *atomic.Int32
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestSchemeMismatchDetectedAtOnce: an https:// address pointed at a BMC's
// plain-HTTP port, and an http:// address pointed at its TLS port (Go's
// server answers 400 "Client sent an HTTP request to an HTTPS server"), is
// reported as ErrSchemeMismatch naming the URL to use, not as unreachable,
// and on the first connection: no retries (before, both were retried as
// unreachable for several seconds). Both auth paths are covered: auto
// negotiates with a raw GET of the service root, basic goes through gofish.
func TestSchemeMismatchDetectedAtOnce(t *testing.T) {
	sim, err := bmcsim.New(bmcsim.Config{Tree: loadTree(t, treeOpenBMC), Username: "admin", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		tls    bool   // the BMC's port speaks TLS
		scheme string // the scheme the driver is given
		want   string // in the error
	}{
		{"https-to-http-port", false, "https", "use http://"},
		{"http-to-https-port", true, "http", "use https://"},
	} {
		for _, auth := range []string{redfish.AuthAuto, redfish.AuthBasic} {
			t.Run(tc.name+"/"+auth, func(t *testing.T) {
				ts := httptest.NewUnstartedServer(sim)
				var n atomic.Int32
				ts.Listener = countingListener{Listener: ts.Listener, n: &n}
				ts.Config.ErrorLog = nil
				if tc.tls {
					ts.StartTLS()
				} else {
					ts.Start()
				}
				t.Cleanup(ts.Close)
				host := strings.TrimPrefix(strings.TrimPrefix(ts.URL, "https://"), "http://")
				drv, err := redfish.New(redfish.Config{Endpoint: tc.scheme + "://" + host, Username: "admin", Password: "s3cret", Auth: auth,
					Insecure: true, Timeout: 5 * time.Second, RetryBase: 50 * time.Millisecond, Retries: 3})
				if err != nil {
					t.Fatal(err)
				}
				defer drv.Close(context.Background())
				_, err = drv.PowerState(context.Background())
				if !errors.Is(err, redfish.ErrSchemeMismatch) || errors.Is(err, bmc.ErrUnreachable) || bmc.IsTransient(err) {
					t.Fatalf("PowerState = %v; want ErrSchemeMismatch, not unreachable or transient", err)
				}
				if !strings.Contains(err.Error(), tc.want+host) {
					t.Errorf("error %q does not say %q", err, tc.want+host)
				}
				if got := n.Load(); got != 1 {
					t.Errorf("%d connections, want 1 (no retries)", got)
				}
			})
		}
	}
}

// TestForcedSessionWithoutSessionService: Config.Auth "session" against a
// BMC without a session service (its service root names none: BasicOnly;
// or POST Sessions answers 405: NoSessions) says the BMC has no sessions
// and to use HTTP Basic, never that the credentials were refused, and a
// root naming no session service gets no login attempt at all (a refused
// one would count towards the account's lockout).
func TestForcedSessionWithoutSessionService(t *testing.T) {
	for _, tc := range []struct {
		name   string
		quirks bmcsim.Quirks
	}{
		{"basic-only", bmcsim.Quirks{BasicOnly: true}},
		{"sessions-405", bmcsim.Quirks{NoSessions: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := tc.quirks
			l := newLab(t, treeOpenBMC, labOpts{on: true, quirks: &q, tune: func(c *redfish.Config) { c.Auth = redfish.AuthSession }})
			_, err := l.drv.PowerState(context.Background())
			if !errors.Is(err, redfish.ErrNoSessionService) || errors.Is(err, bmc.ErrAuth) {
				t.Fatalf("PowerState = %v; want ErrNoSessionService and not ErrAuth", err)
			}
			if s := err.Error(); strings.Contains(s, "credentials") || !strings.Contains(s, "HTTP Basic") {
				t.Errorf("error %q: want no blame on the credentials and HTTP Basic suggested", s)
			}
			if n := failedLogins(l.sim); n != 0 {
				t.Errorf("%d requests answered 401, want none", n)
			}
		})
	}
}
