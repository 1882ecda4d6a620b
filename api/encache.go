package api

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/machina-metal/machina/state"
)

// encodedServers memoises each server's wire JSON, keyed by name and
// validated by (Revision, UpdatedAt, CreatedAt): the store bumps Revision
// and UpdatedAt on every committed change, so a hit is byte-identical to a
// fresh json.Marshal(toServer(srv)).
type encodedServers struct {
	mu sync.RWMutex
	m  map[string]encodedServer
}

type encodedServer struct {
	rev              uint64
	updated, created time.Time
	data             []byte
}

const maxEncodedServers = 200_000

func (c *encodedServers) get(srv state.Server) ([]byte, error) {
	c.mu.RLock()
	e, ok := c.m[srv.Name]
	c.mu.RUnlock()
	if ok && e.rev == srv.Revision && e.updated.Equal(srv.UpdatedAt) && e.created.Equal(srv.CreatedAt) {
		return e.data, nil
	}
	data, err := json.Marshal(toServer(srv))
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxEncodedServers {
		c.m = map[string]encodedServer{}
	}
	c.m[srv.Name] = encodedServer{rev: srv.Revision, updated: srv.UpdatedAt, created: srv.CreatedAt, data: data}
	c.mu.Unlock()
	return data, nil
}
