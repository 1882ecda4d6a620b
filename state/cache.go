package state

import (
	"bytes"
	"encoding/json"
	"maps"
	"sync"
)

// serverCache memoises decoded server records keyed by name and validated
// by their exact stored bytes, so a record is decoded again only after it
// changed. Validation by bytes (not by revision) keeps it correct across
// rolled-back transactions and files edited by other tools.
type serverCache struct {
	mu sync.RWMutex
	m  map[string]cachedServer
}

type cachedServer struct {
	raw []byte
	srv Server
}

// maxCachedServers bounds the cache; past it the cache is reset.
const maxCachedServers = 200_000

// decode returns the Server stored as v under key k. The result is a deep
// copy: callers may modify it freely.
func (c *serverCache) decode(k, v []byte) (Server, error) {
	c.mu.RLock()
	e, ok := c.m[string(k)]
	c.mu.RUnlock()
	if ok && bytes.Equal(e.raw, v) {
		return e.srv.clone(), nil
	}
	var srv Server
	if err := json.Unmarshal(v, &srv); err != nil {
		return Server{}, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedServers {
		c.m = map[string]cachedServer{}
	}
	c.m[string(k)] = cachedServer{raw: bytes.Clone(v), srv: srv.clone()}
	c.mu.Unlock()
	return srv, nil
}

// view calls fn with the decoded Server stored as v under key k, without
// copying it: fn must neither modify nor retain it. For scans that read a
// field or two of every server (counts, MAC lookups).
func (c *serverCache) view(k, v []byte, fn func(*Server)) error {
	c.mu.RLock()
	e, ok := c.m[string(k)]
	c.mu.RUnlock()
	if ok && bytes.Equal(e.raw, v) {
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

// clone returns a deep copy of s.
func (s Server) clone() Server {
	if s.Hardware != nil {
		h := *s.Hardware
		h.Disks = append([]Disk(nil), h.Disks...)
		h.NICs = append([]NIC(nil), h.NICs...)
		s.Hardware = &h
	}
	if s.Allocation != nil {
		a := *s.Allocation
		s.Allocation = &a
	}
	if s.Enrolled != nil {
		e := *s.Enrolled
		s.Enrolled = &e
	}
	if s.InFlight != nil {
		f := *s.InFlight
		s.InFlight = &f
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
	raw  []byte
	host Host
}

// decode returns the Host stored as v under key k, a deep copy.
func (c *hostCache) decode(k, v []byte) (Host, error) {
	c.mu.RLock()
	e, ok := c.m[string(k)]
	c.mu.RUnlock()
	if ok && bytes.Equal(e.raw, v) {
		return e.host.clone(), nil
	}
	var h Host
	if err := json.Unmarshal(v, &h); err != nil {
		return Host{}, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedServers {
		c.m = map[string]cachedHost{}
	}
	c.m[string(k)] = cachedHost{raw: bytes.Clone(v), host: h.clone()}
	c.mu.Unlock()
	return h, nil
}

// clone returns a deep copy of h.
func (h Host) clone() Host {
	h.Tags = append([]string(nil), h.Tags...)
	h.Networks = append([]string(nil), h.Networks...)
	h.StoragePools = append([]string(nil), h.StoragePools...)
	return h
}
