package state

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"time"
)

// bucketLeases holds the DHCP leases the controller granted in full DHCP
// mode: normalised MAC → Lease JSON. Created on the first lease (files
// from before it have none).
var bucketLeases = []byte("dhcp_leases")

// leaseKeepExpired is how long an expired lease is kept (for the
// operator's view) before a later write prunes it.
const leaseKeepExpired = 24 * time.Hour

// maxLeaseHostname caps the client-supplied host name stored with a lease
// (DHCP option 12 is at most 255 bytes; it is machine-supplied text).
const maxLeaseHostname = 64

// Lease is a DHCP lease the controller's DHCP server granted: IP bound to
// MAC (normalised, lower-case colon form) until Expires (UTC). Hostname is
// what the client sent in option 12, cut to 64 bytes.
type Lease struct {
	MAC      string     `json:"mac"`
	IP       netip.Addr `json:"ip"`
	Expires  time.Time  `json:"expires"`
	Hostname string     `json:"hostname,omitempty"`
}

// PutLease stores l, replacing the lease of l.MAC and dropping any other
// MAC's lease of the same address (the pool handed it on) and leases
// expired more than a day ago. So that a DHCP client renewing in a loop
// cannot turn its requests into commits, a renewal of the same address
// whose stored lease still has more than three quarters of the new
// lease's remaining time left is not written (nil, nothing committed);
// a client renewing at T1 (half the lease time) is always written, so
// the stored expiry never trails the granted one by more than a quarter
// of the lease. Errors: ErrInvalid (MAC, address).
func (s *Store) PutLease(l Lease) error {
	mac, err := normalizeMAC(l.MAC)
	if err != nil {
		return fmt.Errorf("state: put lease: %w", err)
	}
	if !l.IP.IsValid() {
		return fmt.Errorf("state: put lease %s: address: %w", mac, ErrInvalid)
	}
	l.MAC, l.IP, l.Expires = mac, l.IP.Unmap(), l.Expires.UTC()
	if len(l.Hostname) > maxLeaseHostname {
		l.Hostname = l.Hostname[:maxLeaseHostname]
	}
	now := s.nowUTC()
	if old, ok := s.lease(mac); ok && old.IP == l.IP {
		if old.Expires.After(now.Add(l.Expires.Sub(now) * 3 / 4)) {
			return nil
		}
		if l.Hostname == "" {
			l.Hostname = old.Hostname // a renewal need not repeat option 12
		}
	}
	data, err := json.Marshal(&l)
	if err != nil {
		return err
	}
	err = s.update(func(tx kvTx) error {
		b, err := tx.CreateBucketIfNotExists(bucketLeases)
		if err != nil {
			return err
		}
		var drop [][]byte
		if err := b.ForEach(func(k, v []byte) error {
			var o Lease
			if json.Unmarshal(v, &o) != nil || string(k) != mac && (o.IP == l.IP || now.Sub(o.Expires) > leaseKeepExpired) {
				drop = append(drop, append([]byte(nil), k...))
			}
			return nil
		}); err != nil {
			return err
		}
		for _, k := range drop {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return b.Put([]byte(mac), data)
	})
	if err != nil {
		return fmt.Errorf("state: put lease %s: %w", mac, err)
	}
	return nil
}

// DeleteLease removes the lease of mac (a DHCPRELEASE); a missing lease is
// not an error. Errors: ErrInvalid (MAC).
func (s *Store) DeleteLease(mac string) error {
	m, err := normalizeMAC(mac)
	if err != nil {
		return fmt.Errorf("state: delete lease: %w", err)
	}
	if _, ok := s.lease(m); !ok {
		return nil
	}
	err = s.update(func(tx kvTx) error {
		if b := tx.Bucket(bucketLeases); b != nil {
			return b.Delete([]byte(m))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("state: delete lease %s: %w", m, err)
	}
	return nil
}

// Leases returns every stored lease, expired ones included, sorted by
// address.
func (s *Store) Leases() ([]Lease, error) {
	var out []Lease
	err := s.view(func(tx kvTx) error {
		b := tx.Bucket(bucketLeases)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			var l Lease
			if err := json.Unmarshal(v, &l); err != nil {
				return fmt.Errorf("decode lease %s: %w", k, err)
			}
			out = append(out, l)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("state: leases: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IP.Less(out[j].IP) })
	return out, nil
}

// LeasedIP returns the address leased to mac (any form macaddr.Normalize
// reads) while its stored lease has not expired: the machine endpoints
// and the join path refuse requests for that MAC's server from any other
// address (api.LeaseLookup). The lease survives a controller restart.
func (s *Store) LeasedIP(mac string) (netip.Addr, bool) {
	m, err := normalizeMAC(mac)
	if err != nil {
		return netip.Addr{}, false
	}
	l, ok := s.lease(m)
	if !ok || !s.nowUTC().Before(l.Expires) {
		return netip.Addr{}, false
	}
	return l.IP, true
}

func (s *Store) lease(mac string) (Lease, bool) {
	var l Lease
	found := false
	_ = s.view(func(tx kvTx) error {
		b := tx.Bucket(bucketLeases)
		if b == nil {
			return nil
		}
		if v := b.Get([]byte(mac)); v != nil && json.Unmarshal(v, &l) == nil {
			found = true
		}
		return nil
	})
	return l, found
}
