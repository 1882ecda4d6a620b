package api

import (
	"context"
	"net"
	"net/netip"

	"github.com/machina-metal/machina/boot/dhcp"
	"github.com/machina-metal/machina/state"
)

// StateLeases is the DHCP server's lease store in full mode: the leases
// live in the state file, so a restarted controller hands every machine
// its address back and the machine endpoints and the join path keep
// refusing requests for a server from any address but its boot MAC's
// lease (before, the leases were in memory and a restart forgot them
// until the machines renewed: the address check was off until then).
// It implements dhcp.LeaseStore and LeaseLookup. On etcd the leases are
// shared, so a new leader answers the renewals of the old one's leases
// (ha TestLeaseAndTokenAcrossTakeover).
type StateLeases struct{ Store *state.Store }

// Leases implements dhcp.LeaseStore.
func (l StateLeases) Leases(context.Context) ([]dhcp.Lease, error) {
	stored, err := l.Store.Leases()
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
func (l StateLeases) PutLease(_ context.Context, lease dhcp.Lease) error {
	return l.Store.PutLease(state.Lease{MAC: lease.MAC.String(), IP: lease.IP, Expires: lease.Expires, Hostname: lease.Hostname})
}

// DeleteLease implements dhcp.LeaseStore.
func (l StateLeases) DeleteLease(_ context.Context, mac net.HardwareAddr) error {
	return l.Store.DeleteLease(mac.String())
}

// LeasedIP implements LeaseLookup.
func (l StateLeases) LeasedIP(mac string) (netip.Addr, bool) { return l.Store.LeasedIP(mac) }
