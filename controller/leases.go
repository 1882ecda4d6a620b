package controller

import (
	"context"
	"net"
	"net/netip"

	"github.com/machina-metal/machina/boot/dhcp"
	"github.com/machina-metal/machina/state"
)

// stateLeases is the DHCP server's lease store in full mode: the leases
// live in the state file, so a restarted controller hands every machine
// its address back and the machine endpoints and the join path keep
// refusing requests for a server from any address but its boot MAC's
// lease (before, the leases were in memory and a restart forgot them
// until the machines renewed: the address check was off until then).
// It implements dhcp.LeaseStore and api.LeaseLookup.
type stateLeases struct{ st *state.Store }

// Leases implements dhcp.LeaseStore.
func (l stateLeases) Leases(context.Context) ([]dhcp.Lease, error) {
	stored, err := l.st.Leases()
	if err != nil {
		return nil, err
	}
	out := make([]dhcp.Lease, 0, len(stored))
	for _, s := range stored {
		mac, err := net.ParseMAC(s.MAC)
		if err != nil {
			continue // state normalised it; unreadable means not ours
		}
		out = append(out, dhcp.Lease{MAC: mac, IP: s.IP, Expires: s.Expires, Hostname: s.Hostname})
	}
	return out, nil
}

// PutLease implements dhcp.LeaseStore (state.Store.PutLease: a renewal
// loop commits at most once per quarter lease).
func (l stateLeases) PutLease(_ context.Context, lease dhcp.Lease) error {
	return l.st.PutLease(state.Lease{MAC: lease.MAC.String(), IP: lease.IP, Expires: lease.Expires, Hostname: lease.Hostname})
}

// DeleteLease implements dhcp.LeaseStore.
func (l stateLeases) DeleteLease(_ context.Context, mac net.HardwareAddr) error {
	return l.st.DeleteLease(mac.String())
}

// LeasedIP implements api.LeaseLookup.
func (l stateLeases) LeasedIP(mac string) (netip.Addr, bool) { return l.st.LeasedIP(mac) }
