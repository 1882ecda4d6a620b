package state

import (
	"encoding/json"
	"hash/maphash"
	"maps"
	"slices"
	"sync"
)

// serverCache memoises decoded server records keyed by name and validated
// by a digest of their stored bytes, so a record is decoded again only
// after it changed. Validation by content (not by revision) keeps it
// correct across rolled-back transactions and files edited by other tools.
// The digest is the length plus a 64-bit hash/maphash under a per-process
// random seed (no input can be chosen to collide with another), which keeps
// the cache at the size of the decoded records instead of twice it.
type serverCache struct {
	mu sync.RWMutex
	m  map[string]*cachedServer
	// macs hints which server holds a boot MAC: each record decoded or
	// written here notes its BootMAC → name. A hint is only a place to
	// look first (ServerByBootMAC reads that record and checks its MAC),
	// never an answer by itself: it may be stale (the MAC changed, the
	// write rolled back, the record was deleted). A MAC noted for two
	// names maps to "" (ambiguous), which sends lookups to the scan.
	macs map[string]string
	// registries keeps one copy of each distinct BIOS attribute
	// registry among the cached records: a fleet's servers of one model
	// and BIOS version publish the same registry (hundreds of
	// attributes), and each record decoded its own.
	registries registryInterner
	// values keeps one copy of each distinct chunk of BIOS attribute
	// values (BIOSValues): servers of one model read mostly equal
	// values, hundreds per server.
	values chunkInterner
	// components keeps one copy of each distinct firmware inventory.
	components componentInterner
}

// cachedServer is one decoded record. An entry is never changed once in
// the map (a new decoding replaces the pointer), so readers may use it
// after dropping the lock; the map holds pointers so that a lookup copies
// no record (view hands out the entry's own Server).
type cachedServer struct {
	sum recordSum
	srv Server
}

// recordSum identifies a stored record's bytes: length and seeded hash.
type recordSum struct {
	n int
	h uint64
}

// cacheSeed seeds every record digest of this process.
var cacheSeed = maphash.MakeSeed()

func sumOf(v []byte) recordSum { return recordSum{n: len(v), h: maphash.Bytes(cacheSeed, v)} }

// maxCachedServers bounds the cache; past it the cache is reset.
const maxCachedServers = 200_000

// decode returns the Server stored as v under key k. The result is a copy
// (Server.clone): callers may modify it, except its BIOS reading, which is
// shared and read-only (Firmware.Clone).
func (c *serverCache) decode(k, v []byte) (Server, error) {
	srv, err := c.share(k, v)
	if err != nil {
		return Server{}, err
	}
	return srv.clone(), nil
}

// share returns the Server stored as v under key k for a snapshot: the
// cache's own entry, shared with the cache and with every other snapshot
// and lookup, so it is read-only (entries are never changed once stored;
// a new decoding replaces the pointer). A pass's snapshot of a large
// fleet then copies no record (BenchmarkSnapshot10k).
func (c *serverCache) share(k, v []byte) (*Server, error) {
	sum := sumOf(v)
	c.mu.RLock()
	e, ok := c.m[string(k)]
	c.mu.RUnlock()
	if ok && e.sum == sum {
		return &e.srv, nil
	}
	e = &cachedServer{sum: sum}
	if err := json.Unmarshal(v, &e.srv); err != nil {
		return nil, err
	}
	c.intern(&e.srv)
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedServers {
		c.m = map[string]*cachedServer{}
	}
	c.m[string(k)] = e
	c.noteMACLocked(e.srv.BootMAC, string(k))
	c.mu.Unlock()
	return &e.srv, nil
}

// intern replaces srv's BIOS registry, BIOS value chunks and firmware
// inventory by the kept copies of equal ones (each read-only once
// stored), so servers of one model hold them once.
func (c *serverCache) intern(srv *Server) {
	c.registries.internIn(srv)
	c.values.internIn(srv)
	c.components.internIn(srv)
}

// noteMACLocked records the hint mac → name (c.mu held for writing).
func (c *serverCache) noteMACLocked(mac, name string) {
	if mac == "" {
		return
	}
	if c.macs == nil || len(c.macs) >= maxCachedServers {
		c.macs = map[string]string{}
	}
	if prev, ok := c.macs[mac]; ok && prev != name {
		name = "" // two servers were seen with this MAC: ambiguous
	}
	c.macs[mac] = name
}

// hintMAC returns the server name last noted for mac; ok is false when
// none was, or when two names were (ambiguous).
func (c *serverCache) hintMAC(mac string) (name string, ok bool) {
	c.mu.RLock()
	name = c.macs[mac]
	c.mu.RUnlock()
	return name, name != ""
}

// remember records srv as the decoding of v under k, as a writer stores
// it: the next read of the record (often at once: the boot index after a
// token mint, the planner after a move) copies instead of decoding. Safe
// when the transaction later rolls back: the entry is keyed by v's
// digest, and the record then holds other bytes.
func (c *serverCache) remember(k string, v []byte, srv *Server) {
	e := &cachedServer{sum: sumOf(v), srv: srv.clone()}
	c.intern(&e.srv)
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedServers {
		c.m = map[string]*cachedServer{}
	}
	c.m[k] = e
	c.noteMACLocked(srv.BootMAC, k)
	c.mu.Unlock()
}

// view calls fn with the decoded Server stored as v under key k, without
// copying it: fn must neither modify nor retain it. For scans that read a
// field or two of every server (counts, MAC lookups).
func (c *serverCache) view(k, v []byte, fn func(*Server)) error {
	c.mu.RLock()
	e, ok := c.m[string(k)]
	c.mu.RUnlock()
	if ok && e.sum == sumOf(v) {
		fn(&e.srv)
		return nil
	}
	srv, err := c.decode(k, v)
	if err != nil {
		return err
	}
	fn(&srv)
	return nil
}

// registryInterner keeps one copy of each distinct BIOS attribute
// registry (FirmwareBIOS.Registry), found by a seeded hash of its contents
// and checked equal before it is shared. Registries are read-only once
// stored, so records may share one. At most maxInternedRegistries are
// kept; past it the table starts again (records keep what they share).
type registryInterner struct {
	mu sync.Mutex
	m  map[uint64][]BIOSAttribute
}

// maxInternedRegistries bounds the interner: a site has a few registries
// per server model and BIOS version.
const maxInternedRegistries = 256

// internIn replaces srv's BIOS registry by the kept copy of an equal one,
// or keeps srv's as the copy; the BIOS reading is copied first so that no
// other holder of srv's reading sees the change.
func (r *registryInterner) internIn(srv *Server) {
	if srv.Firmware == nil || srv.Firmware.BIOS == nil || len(srv.Firmware.BIOS.Registry) == 0 {
		return
	}
	reg := srv.Firmware.BIOS.Registry
	h := registryHash(reg)
	r.mu.Lock()
	kept, ok := r.m[h]
	if !ok || !registriesEqual(kept, reg) {
		if r.m == nil || len(r.m) >= maxInternedRegistries {
			r.m = map[uint64][]BIOSAttribute{}
		}
		r.m[h] = reg
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	if &kept[0] == &reg[0] {
		return
	}
	fw := *srv.Firmware
	bios := *fw.BIOS
	bios.Registry = kept
	fw.BIOS = &bios
	srv.Firmware = &fw
}

// registryHash is a seeded hash of every field of reg's attributes.
func registryHash(reg []BIOSAttribute) uint64 {
	var h maphash.Hash
	h.SetSeed(cacheSeed)
	for _, a := range reg {
		h.WriteString(a.Name)
		h.WriteByte(0)
		h.WriteString(a.Type)
		h.WriteByte(0)
		for _, v := range a.Values {
			h.WriteString(v)
			h.WriteByte(1)
		}
		for _, p := range []*int64{a.Min, a.Max} {
			if p == nil {
				h.WriteByte(2)
			} else {
				maphash.WriteComparable(&h, *p)
			}
		}
		maphash.WriteComparable(&h, [2]bool{a.ReadOnly, a.ResetRequired})
	}
	return h.Sum64()
}

// registriesEqual reports whether a and b hold equal attributes.
func registriesEqual(a, b []BIOSAttribute) bool {
	return slices.EqualFunc(a, b, func(x, y BIOSAttribute) bool {
		return x.Name == y.Name && x.Type == y.Type && x.ReadOnly == y.ReadOnly && x.ResetRequired == y.ResetRequired &&
			slices.Equal(x.Values, y.Values) && intPtrEqual(x.Min, y.Min) && intPtrEqual(x.Max, y.Max)
	})
}

func intPtrEqual(a, b *int64) bool {
	return a == b || (a != nil && b != nil && *a == *b)
}

// clone returns a deep copy of s, except its BIOS reading, which is
// shared (Firmware.Clone).
func (s Server) clone() Server {
	if s.Hardware != nil {
		h := *s.Hardware
		h.Disks = append([]Disk(nil), h.Disks...)
		h.NICs = append([]NIC(nil), h.NICs...)
		h.GPUs = append([]GPU(nil), h.GPUs...)
		s.Hardware = &h
	}
	if s.Allocation != nil {
		a := *s.Allocation
		s.Allocation = &a
	}
	s.Firmware = s.Firmware.Clone()
	if s.Enrolled != nil {
		e := *s.Enrolled
		s.Enrolled = &e
	}
	if s.Fenced != nil {
		f := *s.Fenced
		s.Fenced = &f
	}
	if s.InFlight != nil {
		f := *s.InFlight
		s.InFlight = &f
	}
	if s.BootFetch != nil {
		f := *s.BootFetch
		s.BootFetch = &f
	}
	if s.Actions != nil {
		s.Actions = maps.Clone(s.Actions)
	}
	return s
}

// hostCache memoises decoded host records the way serverCache does
// servers: Snapshot reads every host on every reconcile pass.
type hostCache struct {
	mu sync.RWMutex
	m  map[string]cachedHost
}

type cachedHost struct {
	sum  recordSum
	host Host
}

// share returns the Host stored as v under key k for a snapshot: a copy
// of the struct whose slices and pointers are shared with the cache and
// every other snapshot, so they are read-only (serverCache.share).
func (c *hostCache) share(k, v []byte) (Host, error) {
	sum := sumOf(v)
	c.mu.RLock()
	e, ok := c.m[string(k)]
	c.mu.RUnlock()
	if ok && e.sum == sum {
		return e.host, nil
	}
	var h Host
	if err := json.Unmarshal(v, &h); err != nil {
		return Host{}, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedServers {
		c.m = map[string]cachedHost{}
	}
	c.m[string(k)] = cachedHost{sum: sum, host: h}
	c.mu.Unlock()
	return h, nil
}
