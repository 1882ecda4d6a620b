package api

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxConnsPerIP is the open-connection cap per source address of
// Serve's listener when Config.MaxConnsPerIP is zero: far above what one
// machine, operator or browser opens, far below the descriptors a host
// has, so one address cannot hold them all (slow bodies on an
// unauthenticated route held 20,000 of 20,000).
const DefaultMaxConnsPerIP = 256

// ConnsRefused is the counter behind machina_api_conns_refused_total. A
// caller that wraps a listener for Serve itself (connlimit.New, as the
// controller does with its descriptor budget) passes it as
// connlimit.Config.Refused, so the metric keeps counting.
func (s *Server) ConnsRefused() *atomic.Int64 { return &s.connsRefused }

// Registry returns the registry served at /metrics (Config.Registry, or
// the one New made), for collectors of the caller's own listeners.
func (s *Server) Registry() *prometheus.Registry { return s.cfg.Registry }
