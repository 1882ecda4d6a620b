package dhcp

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/internal/netnstest"
)

// TestRestartedServerKeepsLeases: a server started over a lease store
// that already holds a live lease (a controller restarted on its state
// file: the leases are the state file's, controller/leases.go) offers and
// acknowledges the client the address it had, not the next free one, and
// writes the renewed lease through.
func TestRestartedServerKeepsLeases(t *testing.T) {
	p := netnstest.NewPair(t, "10.66.0.1/24")
	mac := clientMAC(t, p)
	var look boot.MemLookup
	_ = look.Set(boot.Assignment{MAC: mac, Lifecycle: boot.LifecycleCommissioning})
	leases := newNotifyLeases()
	kept := netip.MustParseAddr("10.66.0.120")
	if err := leases.MemLeases.PutLease(context.Background(), Lease{MAC: mac, IP: kept, Expires: time.Now().Add(5 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	startServer(t, p, fullConfig(&look, leases))

	var c *nclient4.Client
	if err := netnstest.Do(p.Client, func() error {
		var err error
		c, err = nclient4.New(p.ClientIf, nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(3))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := c.Request(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := lease.ACK.YourIPAddr.String(); got != kept.String() || lease.Offer.YourIPAddr.String() != kept.String() {
		t.Fatalf("after the restart: offered %s, acknowledged %s, want the stored %s", lease.Offer.YourIPAddr, got, kept)
	}
	if l := waitLease(t, leases.puts, "ack"); l.IP != kept || !l.Expires.After(time.Now().Add(9*time.Minute)) {
		t.Fatalf("renewed lease written %+v, want %s for another lease time", l, kept)
	}
}
