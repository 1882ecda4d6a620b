package fleet

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/bmctest"
	"github.com/machina-metal/machina/bmc/redfish"
	"github.com/machina-metal/machina/state"
)

// TestStoreDriversCABundle: servers.yaml bmc.caBundle names a
// secret holding the CA PEM; the driver trusts the BMC's certificate
// through it, fails with ErrTLS without it, and a missing secret is an
// error naming it. bmc.auth reaches the driver (basic: no session).
func TestStoreDriversCABundle(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{MasterKey: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dir, err := bmcsim.TreeDir("", "openbmc-bmcweb-stock")
	if err != nil {
		t.Fatal(err)
	}
	tr, err := bmcsim.LoadTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "admin", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	ca := bmctest.NewCA(t)
	ts := httptest.NewUnstartedServer(sim)
	ts.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Leaf()}}
	ts.StartTLS()
	defer ts.Close()
	if _, err := st.PutSecret("bmc", state.Credential{Username: "admin", Password: "pw"}, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutSecret("site-ca", state.Credential{Extra: map[string]string{"pem": string(ca.PEM())}}, "test"); err != nil {
		t.Fatal(err)
	}
	d := &StoreDrivers{Store: st}
	defer d.Close(context.Background())
	srv := state.Server{Name: "s1", BMC: state.BMCFacts{Driver: "redfish", Address: ts.URL, Credentials: "bmc", CABundle: "site-ca", Auth: "basic"}}
	drv, err := d.Driver(context.Background(), srv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := drv.PowerState(context.Background()); err != nil {
		t.Fatalf("with the CA bundle: %v", err)
	}
	for _, r := range sim.Requests() {
		if r.Auth == "session" {
			t.Errorf("bmc.auth basic, yet a session was used: %v", r)
		}
	}
	srv.Name, srv.BMC.CABundle = "s2", ""
	drv, err = d.Driver(context.Background(), srv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := drv.PowerState(context.Background()); !errors.Is(err, redfish.ErrTLS) {
		t.Errorf("without the CA bundle: %v, want ErrTLS", err)
	}
	srv.Name, srv.BMC.CABundle = "s3", "no-such-ca"
	if _, err := d.Driver(context.Background(), srv); err == nil || !errors.Is(err, redfish.ErrTLS) {
		t.Errorf("missing CA secret: %v, want an error naming it", err)
	}
}
