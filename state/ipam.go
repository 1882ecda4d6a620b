package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"
)

// IPAM: the pool addresses of networks.yaml subnets, handed to servers'
// pool-mode interfaces in the same transaction as their allocation move.
//
// Records. Bucket "ipam" holds one nested bucket per subnet; its keys are
// addresses (ipamKey: the family, 4 or 6, then the address's 4 or 16
// bytes, so a cursor walks one family in numeric order) and its values
// ipamRecord JSON naming the server holding the address. A server's record
// carries the same leases (Server.Addresses) for the snapshot, status and
// the deploy plan; the ipam buckets are what makes an address exclusive:
// a claim reads the subnet's records with a cursor and writes the one it
// takes in the move's transaction. On bbolt writers are serialised; on
// etcd the cursor read guards the transaction with a compare on the
// subnet bucket's generation key (engine_etcd.go), so of two controllers
// that pick the same free address, the second one's commit fails its
// compare and is rerun from a new snapshot, where the address is taken.

// bucketIPAM: subnet name → nested bucket: ipamKey(address) → ipamRecord.
var bucketIPAM = []byte("ipam")

// ErrPoolExhausted: a subnet's pools have no free address of a family the
// claim needs (see *PoolExhaustedError for which).
var ErrPoolExhausted = errors.New("address pool exhausted")

// PoolExhaustedError says which subnet's pools ran out, and how many
// addresses they hand out in all (Size: pool addresses minus reserved
// ranges, the gateway, fixed addresses and the network and broadcast
// addresses). It unwraps to ErrPoolExhausted. Nothing of the move that
// met it was written.
type PoolExhaustedError struct {
	Subnet    string
	Family    int // 4 or 6
	Size      uint64
	Server    string
	Interface string
}

func (e *PoolExhaustedError) Error() string {
	return fmt.Sprintf("subnet %s: IPv%d pools exhausted (%d addresses, all held): no address for %s interface %s", e.Subnet, e.Family, e.Size, e.Server, e.Interface)
}

// Unwrap returns ErrPoolExhausted.
func (e *PoolExhaustedError) Unwrap() error { return ErrPoolExhausted }

// AddressLease is one pool address IPAM holds for a server: the subnet
// and layout interface it is for, the address (netip canonical text), the
// profile it was taken for and when.
type AddressLease struct {
	Subnet    string    `json:"subnet"`
	Interface string    `json:"interface"`
	Address   string    `json:"address"`
	Profile   string    `json:"profile,omitempty"`
	At        time.Time `json:"at"`
}

// Addr returns the lease's address, the zero Addr when it does not parse.
func (l AddressLease) Addr() netip.Addr {
	a, _ := netip.ParseAddr(l.Address)
	return a
}

// ipamRecord is the value of an address key: who holds it.
type ipamRecord struct {
	Server    string `json:"server"`
	Interface string `json:"interface"`
	Profile   string `json:"profile,omitempty"`
}

// AddressRange is an inclusive range of addresses of one family.
type AddressRange struct{ Start, End netip.Addr }

// AddressPool is what IPAM picks from for one subnet and one family: the
// subnet's pool ranges in file order and the addresses never handed out
// (reserved ranges, the gateway, fixed addresses of servers.yaml, the
// network and broadcast addresses). Build it with NewAddressPool.
type AddressPool struct {
	Subnet   string
	Family   int // 4 or 6
	ranges   []AddressRange
	excluded []AddressRange // sorted by Start, merged
}

// NewAddressPool returns the pool of subnet for ranges (pool order) minus
// excluded (any order, may overlap). Ranges and excluded addresses of the
// other family than ranges[0] are dropped.
func NewAddressPool(subnet string, ranges, excluded []AddressRange) AddressPool {
	p := AddressPool{Subnet: subnet, Family: 4}
	if len(ranges) > 0 && ranges[0].Start.Is6() {
		p.Family = 6
	}
	for _, r := range ranges {
		if r.Start.IsValid() && r.End.IsValid() && fam(r.Start) == p.Family && fam(r.End) == p.Family && r.Start.Compare(r.End) <= 0 {
			p.ranges = append(p.ranges, r)
		}
	}
	var ex []AddressRange
	for _, r := range excluded {
		if r.Start.IsValid() && r.End.IsValid() && fam(r.Start) == p.Family && fam(r.End) == p.Family && r.Start.Compare(r.End) <= 0 {
			ex = append(ex, r)
		}
	}
	sort.Slice(ex, func(i, j int) bool { return ex[i].Start.Less(ex[j].Start) })
	for _, r := range ex {
		if n := len(p.excluded); n > 0 {
			last := &p.excluded[n-1]
			if next := last.End.Next(); !next.IsValid() || r.Start.Compare(next) <= 0 {
				if last.End.Less(r.End) {
					last.End = r.End
				}
				continue
			}
		}
		p.excluded = append(p.excluded, r)
	}
	return p
}

func fam(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}

// excludedAt returns the excluded range holding a, if any.
func (p *AddressPool) excludedAt(a netip.Addr) (AddressRange, bool) {
	i := sort.Search(len(p.excluded), func(i int) bool { return a.Less(p.excluded[i].Start) })
	if i > 0 && a.Compare(p.excluded[i-1].End) <= 0 {
		return p.excluded[i-1], true
	}
	return AddressRange{}, false
}

// Pickable reports whether a is in one of the pool's ranges and not
// excluded.
func (p *AddressPool) Pickable(a netip.Addr) bool {
	if !a.IsValid() || fam(a) != p.Family {
		return false
	}
	in := false
	for _, r := range p.ranges {
		if r.Start.Compare(a) <= 0 && a.Compare(r.End) <= 0 {
			in = true
			break
		}
	}
	if !in {
		return false
	}
	_, ex := p.excludedAt(a)
	return !ex
}

// Size is the number of addresses the pool hands out (ranges minus the
// excluded addresses inside them), saturated at the largest uint64.
func (p *AddressPool) Size() uint64 {
	total := new(big.Int)
	for _, r := range p.ranges {
		total.Add(total, span(r.Start, r.End))
		for _, x := range p.excluded {
			s, e := x.Start, x.End
			if s.Less(r.Start) {
				s = r.Start
			}
			if r.End.Less(e) {
				e = r.End
			}
			if s.Compare(e) <= 0 {
				total.Sub(total, span(s, e))
			}
		}
	}
	if !total.IsUint64() {
		return ^uint64(0)
	}
	return total.Uint64()
}

// span is the number of addresses from s to e inclusive.
func span(s, e netip.Addr) *big.Int {
	sb, eb := s.As16(), e.As16()
	n := new(big.Int).Sub(new(big.Int).SetBytes(eb[:]), new(big.Int).SetBytes(sb[:]))
	return n.Add(n, big.NewInt(1))
}

// Taken answers which addresses are held: Ceil returns the lowest held
// address at or above a of a's family, or false when there is none.
type Taken interface {
	Ceil(a netip.Addr) (netip.Addr, bool)
}

// SortedAddrs is a Taken over addresses sorted ascending (netip order).
type SortedAddrs []netip.Addr

// Ceil implements Taken by binary search.
func (s SortedAddrs) Ceil(a netip.Addr) (netip.Addr, bool) {
	i := sort.Search(len(s), func(i int) bool { return !s[i].Less(a) })
	if i == len(s) || fam(s[i]) != fam(a) {
		return netip.Addr{}, false
	}
	return s[i], true
}

// Pick returns the lowest address of the pool, in range order (the first
// range, in pool order, with a free address; its lowest), that is neither
// excluded nor taken; false when every address is. This is the one rule
// the controller's claim and the plan's simulation (Picker) both use.
func (p *AddressPool) Pick(taken Taken) (netip.Addr, bool) {
	for _, r := range p.ranges {
		if a, ok := p.pickIn(r, r.Start, taken); ok {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// pickIn is Pick within r from from on.
func (p *AddressPool) pickIn(r AddressRange, from netip.Addr, taken Taken) (netip.Addr, bool) {
	a := from
	for a.IsValid() && a.Compare(r.End) <= 0 {
		if x, ok := p.excludedAt(a); ok {
			a = x.End.Next()
			continue
		}
		if t, ok := taken.Ceil(a); ok && t == a {
			a = a.Next()
			continue
		}
		return a, true
	}
	return netip.Addr{}, false
}

// Picker picks a pool's addresses one after another as Pick would, given
// that the addresses it picked are taken and nothing is freed meanwhile
// (the plan's simulation of one pass): each pick resumes where the last
// one ended instead of walking the held addresses again.
type Picker struct {
	pool  AddressPool
	taken Taken
	ri    int
	next  netip.Addr
}

// NewPicker returns a Picker over pool with taken held.
func NewPicker(pool AddressPool, taken Taken) *Picker {
	pk := &Picker{pool: pool, taken: taken}
	if len(pool.ranges) > 0 {
		pk.next = pool.ranges[0].Start
	}
	return pk
}

// Pool returns the picker's pool.
func (pk *Picker) Pool() *AddressPool { return &pk.pool }

// Next returns the next address Pick would hand out, or false when the
// pool is exhausted.
func (pk *Picker) Next() (netip.Addr, bool) {
	for pk.ri < len(pk.pool.ranges) {
		r := pk.pool.ranges[pk.ri]
		if a, ok := pk.pool.pickIn(r, pk.next, pk.taken); ok {
			pk.next = a.Next()
			return a, true
		}
		pk.ri++
		if pk.ri < len(pk.pool.ranges) {
			pk.next = pk.pool.ranges[pk.ri].Start
		}
	}
	return netip.Addr{}, false
}

// AddressClaim asks for one address of Pool for a layout interface.
// Prefer, when valid, is taken if it is pickable and free (the plan's
// simulated pick, so the plan shows what the controller takes); else the
// lowest free one (AddressPool.Pick).
type AddressClaim struct {
	Interface string
	Pool      AddressPool
	Prefer    netip.Addr
}

// ipamKey is a's record key: the family byte, then its bytes.
func ipamKey(a netip.Addr) []byte {
	if a.Is4() {
		b := a.As4()
		return append([]byte{4}, b[:]...)
	}
	b := a.As16()
	return append([]byte{6}, b[:]...)
}

func ipamAddr(k []byte) (netip.Addr, bool) {
	switch {
	case len(k) == 5 && k[0] == 4:
		return netip.AddrFrom4([4]byte(k[1:])), true
	case len(k) == 17 && k[0] == 6:
		return netip.AddrFrom16([16]byte(k[1:])), true
	}
	return netip.Addr{}, false
}

// cursorTaken is a Taken over a subnet bucket's records. Queries that
// ascend walk the cursor forward (one etcd range read per page); a lower
// one seeks again.
type cursorTaken struct {
	c       kvCursor
	started bool
	last    netip.Addr
	k       netip.Addr
	ok      bool
}

func (t *cursorTaken) set(k []byte) {
	t.k, t.ok = ipamAddr(k)
}

func (t *cursorTaken) Ceil(a netip.Addr) (netip.Addr, bool) {
	if !t.started || a.Less(t.last) {
		k, _ := t.c.Seek(ipamKey(a))
		t.set(k)
		t.started = true
	}
	t.last = a
	for t.ok && fam(t.k) == fam(a) && t.k.Less(a) {
		k, _ := t.c.Next()
		t.set(k)
	}
	if !t.ok || fam(t.k) != fam(a) {
		return netip.Addr{}, false
	}
	return t.k, true
}

// ApplyClaiming is Apply of a move that allocates srv to profile (the
// ready→allocated move) and takes an address for each claim in the same
// transaction: the server keeps a lease it holds for the same subnet,
// interface, family and profile (a subnet whose release policy kept it),
// else gets Prefer when free, else the lowest free address. Leases of the
// server that no claim keeps are freed. A pool without a free address
// fails the whole move with a *PoolExhaustedError: no partial allocation.
func (s *Store) ApplyClaiming(m Move, profile string, claims []AddressClaim) (Server, error) {
	var tx kvTx
	upd := m.Update
	m.Update = func(srv *Server) error {
		if upd != nil {
			if err := upd(srv); err != nil {
				return err
			}
		}
		return s.claimTx(tx, srv, profile, claims)
	}
	return s.apply(m, func(fn func(kvTx) error) error {
		return s.update(func(t kvTx) error { tx = t; return fn(t) })
	})
}

// ApplyReleasing is Apply of a move that ends srv's allocation (a
// release, a retire, a rolled-back allocation): the server's leases on
// subnets keep reports true for stay with it (release policy keep), the
// others are freed in the move's transaction. keep nil frees all.
func (s *Store) ApplyReleasing(m Move, keep func(subnet string) bool) (Server, error) {
	var tx kvTx
	upd := m.Update
	m.Update = func(srv *Server) error {
		if upd != nil {
			if err := upd(srv); err != nil {
				return err
			}
		}
		return s.releaseTx(tx, srv, keep)
	}
	return s.apply(m, func(fn func(kvTx) error) error {
		return s.update(func(t kvTx) error { tx = t; return fn(t) })
	})
}

func (s *Store) claimTx(tx kvTx, srv *Server, profile string, claims []AddressClaim) error {
	if len(claims) == 0 && len(srv.Addresses) == 0 {
		return nil
	}
	root, err := tx.CreateBucketIfNotExists(bucketIPAM)
	if err != nil {
		return err
	}
	now := s.nowUTC()
	old := srv.Addresses
	used := make([]bool, len(old))
	var out []AddressLease
	for _, c := range claims {
		b, err := root.CreateBucketIfNotExists([]byte(c.Pool.Subnet))
		if err != nil {
			return err
		}
		if i, ok := reusable(b, srv.Name, profile, old, used, c); ok {
			used[i] = true
			out = append(out, old[i])
			continue
		}
		a := c.Prefer
		if !c.Pool.Pickable(a) || b.Get(ipamKey(a)) != nil {
			var ok bool
			if a, ok = c.Pool.Pick(&cursorTaken{c: b.Cursor()}); !ok {
				return &PoolExhaustedError{Subnet: c.Pool.Subnet, Family: c.Pool.Family, Size: c.Pool.Size(), Server: srv.Name, Interface: c.Interface}
			}
		}
		if err := putJSONKey(b, ipamKey(a), ipamRecord{Server: srv.Name, Interface: c.Interface, Profile: profile}); err != nil {
			return err
		}
		out = append(out, AddressLease{Subnet: c.Pool.Subnet, Interface: c.Interface, Address: a.String(), Profile: profile, At: now})
	}
	for i, l := range old {
		if !used[i] {
			if err := freeLease(root, srv.Name, l); err != nil {
				return err
			}
		}
	}
	srv.Addresses = sortLeases(out)
	return nil
}

// reusable finds a lease of old (not used yet) that c can keep: same
// subnet, interface, family and profile, still pickable, and its record
// still the server's.
func reusable(b kvBucket, server, profile string, old []AddressLease, used []bool, c AddressClaim) (int, bool) {
	for i, l := range old {
		a := l.Addr()
		if used[i] || l.Subnet != c.Pool.Subnet || l.Interface != c.Interface || l.Profile != profile || !c.Pool.Pickable(a) {
			continue
		}
		var rec ipamRecord
		if v := b.Get(ipamKey(a)); v == nil || json.Unmarshal(v, &rec) != nil || rec.Server != server {
			continue
		}
		return i, true
	}
	return 0, false
}

func (s *Store) releaseTx(tx kvTx, srv *Server, keep func(string) bool) error {
	if len(srv.Addresses) == 0 {
		return nil
	}
	root := tx.Bucket(bucketIPAM)
	var kept []AddressLease
	for _, l := range srv.Addresses {
		if keep != nil && keep(l.Subnet) {
			kept = append(kept, l)
			continue
		}
		if root != nil {
			if err := freeLease(root, srv.Name, l); err != nil {
				return err
			}
		}
	}
	srv.Addresses = kept
	return nil
}

// freeLease deletes l's record when server holds it.
func freeLease(root kvBucket, server string, l AddressLease) error {
	b := root.Bucket([]byte(l.Subnet))
	a := l.Addr()
	if b == nil || !a.IsValid() {
		return nil
	}
	var rec ipamRecord
	if v := b.Get(ipamKey(a)); v == nil || json.Unmarshal(v, &rec) != nil || rec.Server != server {
		return nil
	}
	return b.Delete(ipamKey(a))
}

func putJSONKey(b kvBucket, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, data)
}

func sortLeases(ls []AddressLease) []AddressLease {
	slices.SortFunc(ls, func(x, y AddressLease) int {
		if x.Subnet != y.Subnet {
			return strings.Compare(x.Subnet, y.Subnet)
		}
		if x.Interface != y.Interface {
			return strings.Compare(x.Interface, y.Interface)
		}
		return x.Addr().Compare(y.Addr())
	})
	return ls
}

// AddressHolders returns the holders of subnet's addresses from the ipam
// records: address (canonical text) → server name. Empty when the subnet
// has none.
func (s *Store) AddressHolders(subnet string) (map[string]string, error) {
	out := map[string]string{}
	err := s.view(func(tx kvTx) error {
		root := tx.Bucket(bucketIPAM)
		if root == nil {
			return nil
		}
		b := root.Bucket([]byte(subnet))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			a, ok := ipamAddr(k)
			if !ok {
				return nil
			}
			var rec ipamRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("decode ipam %s: %w", a, err)
			}
			out[a.String()] = rec.Server
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("state: address holders of %s: %w", subnet, err)
	}
	return out, nil
}

// SortAddrs sorts s ascending (netip order), as SortedAddrs wants.
func SortAddrs(s SortedAddrs) {
	slices.SortFunc(s, func(a, b netip.Addr) int { return a.Compare(b) })
}
