package dhcp

import (
	"context"
	"net"
	"net/netip"
	"sort"
	"sync"
	"time"
)

// Lease is one address bound to one client.
type Lease struct {
	MAC      net.HardwareAddr
	IP       netip.Addr
	Expires  time.Time
	Hostname string
}

// LeaseStore persists leases. The state package provides the production
// implementation; [MemLeases] keeps them in memory. The server loads all
// leases once in [Server.Serve] and writes through on every ACK and release,
// so implementations see one call per client transaction.
type LeaseStore interface {
	// Leases returns every stored lease (expired ones included; the server
	// ignores them).
	Leases(ctx context.Context) ([]Lease, error)
	// PutLease stores l, replacing any lease for l.MAC.
	PutLease(ctx context.Context, l Lease) error
	// DeleteLease removes the lease of mac; a missing lease is not an error.
	DeleteLease(ctx context.Context, mac net.HardwareAddr) error
}

// MemLeases is an in-memory [LeaseStore]. The zero value is ready; safe for
// concurrent use.
type MemLeases struct {
	mu sync.Mutex
	m  map[string]Lease
}

// Leases implements [LeaseStore], sorted by IP.
func (s *MemLeases) Leases(context.Context) ([]Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Lease, 0, len(s.m))
	for _, l := range s.m {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IP.Less(out[j].IP) })
	return out, nil
}

// PutLease implements [LeaseStore].
func (s *MemLeases) PutLease(_ context.Context, l Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]Lease{}
	}
	s.m[l.MAC.String()] = l
	return nil
}

// DeleteLease implements [LeaseStore].
// LeasedIP returns the address leased to mac (any form net.ParseMAC
// reads) when its lease has not expired.
func (s *MemLeases) LeasedIP(mac string) (netip.Addr, bool) {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return netip.Addr{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.m[hw.String()]
	if !ok || !time.Now().Before(l.Expires) {
		return netip.Addr{}, false
	}
	return l.IP, true
}

func (s *MemLeases) DeleteLease(_ context.Context, mac net.HardwareAddr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, mac.String())
	return nil
}

// pool tracks which addresses are bound, offered or declined. Guarded by the
// server's mutex.
type pool struct {
	start, end netip.Addr
	byMAC      map[string]binding
	byIP       map[netip.Addr]string // ip -> mac ("" for declined)
	next       netip.Addr
}

type binding struct {
	ip      netip.Addr
	expires time.Time
	offered bool // an OFFER hold, not yet persisted
}

func newPool(start, end netip.Addr) *pool {
	return &pool{start: start, end: end, next: start, byMAC: map[string]binding{}, byIP: map[netip.Addr]string{}}
}

func (p *pool) contains(ip netip.Addr) bool {
	return p.start.IsValid() && p.start.Compare(ip) <= 0 && ip.Compare(p.end) <= 0
}

// holder returns the MAC holding ip at now ("" and false when free).
func (p *pool) holder(ip netip.Addr, now time.Time) (string, bool) {
	mac, ok := p.byIP[ip]
	if !ok {
		return "", false
	}
	if mac == "" { // declined
		return "", true
	}
	b := p.byMAC[mac]
	if b.ip != ip || now.After(b.expires) {
		return "", false
	}
	return mac, true
}

func (p *pool) bind(mac string, ip netip.Addr, expires time.Time, offered bool) {
	if old, ok := p.byMAC[mac]; ok && old.ip != ip && p.byIP[old.ip] == mac {
		delete(p.byIP, old.ip)
	}
	p.byMAC[mac] = binding{ip: ip, expires: expires, offered: offered}
	p.byIP[ip] = mac
}

func (p *pool) release(mac string) {
	if b, ok := p.byMAC[mac]; ok {
		if p.byIP[b.ip] == mac {
			delete(p.byIP, b.ip)
		}
		delete(p.byMAC, mac)
	}
}

// decline marks ip unusable (another host answered ARP for it, RFC 2131
// §4.3.3) until the process restarts.
func (p *pool) decline(ip netip.Addr) { p.byIP[ip] = "" }

// free returns a free pool address, scanning round-robin from the last
// allocation; false when the pool is exhausted.
func (p *pool) free(now time.Time) (netip.Addr, bool) {
	if !p.start.IsValid() {
		return netip.Addr{}, false
	}
	ip := p.next
	for {
		if _, held := p.holder(ip, now); !held {
			p.next = ip.Next()
			if !p.contains(p.next) {
				p.next = p.start
			}
			return ip, true
		}
		ip = ip.Next()
		if !p.contains(ip) {
			ip = p.start
		}
		if ip == p.next {
			return netip.Addr{}, false
		}
	}
}
