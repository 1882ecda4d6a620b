package tftp

import (
	"testing"
)

// TestListenOnAddressNotYetOnHost: a specific listen address that is not
// (yet) on the host binds (IP_FREEBIND): the HA virtual IP is the
// provisioning address, and it is added only while this controller leads,
// after the TFTP server started. Before, Listen failed with "cannot assign
// requested address". 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never on a
// host, and nothing is sent.
func TestListenOnAddressNotYetOnHost(t *testing.T) {
	s, err := New(Config{Root: t.TempDir(), Addr: "192.0.2.123:0", ScriptURL: scriptURL})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatalf("Listen on an address not on the host: %v", err)
	}
	defer s.conn.Close()
	defer s.root.Close()
	if got := s.Addr().IP.String(); got != "192.0.2.123" {
		t.Errorf("bound to %s, want 192.0.2.123", got)
	}
}
