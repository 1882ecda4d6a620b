package redfish_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/bmctest"
	"github.com/machina-metal/machina/bmc/redfish"
)

// serveTLS serves h over TLS with cert on addr ("127.0.0.1:0" for a new
// port) and returns the address; the server stops at cleanup or by stop.
func serveTLS(t *testing.T, addr string, h http.Handler, cert tls.Certificate) (string, func()) {
	t.Helper()
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // the old listener's port may linger a moment
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	stop := func() { _ = srv.Close() }
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// TestCAPinningSurvivesRenewal: the driver trusts the BMC
// through its CA (bmc.caBundle, --ca-file); the BMC restarts with a renewed
// leaf (new key, same CA) and the same driver goes on; a different CA is
// refused with ErrTLS, and nothing was sent to it.
func TestCAPinningSurvivesRenewal(t *testing.T) {
	ca := bmctest.NewCA(t)
	sim, err := bmcsim.New(bmcsim.Config{Tree: loadTree(t, treeOpenBMC), Username: "admin", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	addr, stop := serveTLS(t, "127.0.0.1:0", sim, ca.Leaf())
	drv, err := redfish.New(redfish.Config{Endpoint: "https://" + addr, Username: "admin", Password: "s3cret", RootCAs: ca.Pool(),
		Timeout: 5 * time.Second, RetryBase: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Close(context.Background())
	if _, err := drv.PowerState(context.Background()); err != nil {
		t.Fatalf("pinned CA: %v", err)
	}
	stop() // the BMC renews its certificate and restarts
	serveTLS(t, addr, sim, ca.Leaf())
	if _, err := drv.PowerState(context.Background()); err != nil {
		t.Fatalf("after renewal under the same CA: %v", err)
	}

	other := bmctest.NewCA(t)
	stray, err := redfish.New(redfish.Config{Endpoint: "https://" + addr, Username: "admin", Password: "s3cret", RootCAs: other.Pool(), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer stray.Close(context.Background())
	sim.ClearRequests()
	if _, err := stray.PowerState(context.Background()); !errors.Is(err, redfish.ErrTLS) {
		t.Fatalf("another CA: %v, want ErrTLS", err)
	}
	if n := len(sim.Requests()); n != 0 {
		t.Errorf("%d requests reached the BMC over an untrusted connection", n)
	}
}
