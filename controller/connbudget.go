package controller

import (
	"fmt"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/internal/connlimit"
	"github.com/machina-metal/machina/join"
)

// ConnBudget is the split of the process's descriptors between the
// controller's TCP listeners and the reserve for outbound work
// (connlimit.Budget), and the listeners wrapped with it. It is a
// prometheus.Collector of their metrics (machina_listener_conns_open,
// _budget, _refused_total{reason}, _evicted_total, _accept_errors_total,
// labelled by listener; machina_fd_limit and machina_fd_reserve). Wrap
// listeners before serving; Collect is then safe concurrently.
type ConnBudget struct {
	b         connlimit.Budget
	listeners []namedListener
}

type namedListener struct {
	name string
	l    *connlimit.Listener
}

// NewConnBudget reads RLIMIT_NOFILE (raising the soft limit to the hard
// one where Go has not) and splits it (connlimit.Split). Errors: a limit
// below 512.
func NewConnBudget() (*ConnBudget, error) {
	n, err := connlimit.NoFile()
	if err != nil {
		return nil, fmt.Errorf("controller: connection budget: %w", err)
	}
	b, err := connlimit.Split(n)
	if err != nil {
		return nil, fmt.Errorf("controller: connection budget: %w", err)
	}
	return &ConnBudget{b: b}, nil
}

// Budget returns the split.
func (c *ConnBudget) Budget() connlimit.Budget { return c.b }

// Wrap wraps ln with connlimit.New(ln, cfg) and keeps it for the metrics
// under cfg.Name.
func (c *ConnBudget) Wrap(ln net.Listener, cfg connlimit.Config) *connlimit.Listener {
	l := connlimit.New(ln, cfg)
	c.Add(cfg.Name, l)
	return l
}

// Add keeps l, wrapped elsewhere (ListenAdminTLSLimited), for the metrics
// under name; a listener without connlimit (nil) is ignored.
func (c *ConnBudget) Add(name string, ln net.Listener) {
	if l := limited(ln); l != nil {
		c.listeners = append(c.listeners, namedListener{name, l})
	}
}

// limitListeners wraps the machine-facing (or, on loopback, the only) HTTP
// listener and the join listener with their budgets; the admin TLS
// listener was wrapped when it was opened (adminLimits). On loopback, with
// no admin TLS listener, the one HTTP listener serves the admin API too and
// gets the Machine and Admin shares together.
func (w *wiring) limitListeners() {
	perIP := w.cfg.MaxConnsPerIP
	if perIP <= 0 {
		perIP = api.DefaultMaxConnsPerIP
	}
	name, total := "machine", w.conns.b.Machine
	if w.adminLn == nil {
		name, total = "api", w.conns.b.Machine+w.conns.b.Admin
	}
	w.ln = w.conns.Wrap(w.ln, connlimit.Config{Name: name, MaxPerIP: perIP, MaxTotal: total, Refused: w.srv.ConnsRefused(),
		Logger: w.log.With("component", "api")})
	w.joinLn = w.conns.Wrap(w.joinLn, connlimit.Config{Name: "join", MaxPerIP: join.MaxConnsPerIP, MaxTotal: w.conns.b.Join,
		Logger: w.log.With("component", "join")})
	w.log.Info("connection budget", "rlimit_nofile", w.conns.b.Limit, "reserve", w.conns.b.Reserve,
		name, total, "admin", w.conns.b.Admin, "join", w.conns.b.Join)
}

// adminLimits is the admin TLS listener's connlimit configuration: its
// own share, so a flood on the machine port never takes its slots.
func (w *wiring) adminLimits() connlimit.Config {
	perIP := w.cfg.MaxConnsPerIP
	if perIP <= 0 {
		perIP = api.DefaultMaxConnsPerIP
	}
	return connlimit.Config{Name: "admin", MaxPerIP: perIP, MaxTotal: w.conns.b.Admin, Refused: w.srv.ConnsRefused(),
		Logger: w.log.With("component", "api")}
}

// limited returns the connlimit listener under ln, if any.
func limited(ln net.Listener) *connlimit.Listener {
	if l, ok := ln.(interface{ Limits() *connlimit.Listener }); ok {
		return l.Limits()
	}
	return nil
}

// Describe implements prometheus.Collector.
func (c *ConnBudget) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConnsOpen, descConnsBudget, descConnsRefused, descConnsEvicted, descAcceptErrors, descFDLimit, descFDReserve} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *ConnBudget) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descFDLimit, prometheus.GaugeValue, float64(c.b.Limit))
	ch <- prometheus.MustNewConstMetric(descFDReserve, prometheus.GaugeValue, float64(c.b.Reserve))
	for _, nl := range c.listeners {
		s := nl.l.Stats()
		ch <- prometheus.MustNewConstMetric(descConnsOpen, prometheus.GaugeValue, float64(s.Open), nl.name)
		ch <- prometheus.MustNewConstMetric(descConnsBudget, prometheus.GaugeValue, float64(s.MaxTotal), nl.name)
		ch <- prometheus.MustNewConstMetric(descConnsRefused, prometheus.CounterValue, float64(s.RefusedPerIP), nl.name, "per_ip")
		ch <- prometheus.MustNewConstMetric(descConnsRefused, prometheus.CounterValue, float64(s.RefusedBudget), nl.name, "budget")
		ch <- prometheus.MustNewConstMetric(descConnsEvicted, prometheus.CounterValue, float64(s.Evicted), nl.name)
		ch <- prometheus.MustNewConstMetric(descAcceptErrors, prometheus.CounterValue, float64(s.AcceptErrors), nl.name)
	}
}

// The listener metrics; listener is machine, admin, api (loopback: the one
// listener serving both) or join.
var (
	descConnsOpen = prometheus.NewDesc("machina_listener_conns_open",
		"Connections open on the listener.", []string{"listener"}, nil)
	descConnsBudget = prometheus.NewDesc("machina_listener_conns_budget",
		"The listener's connection budget (its share of RLIMIT_NOFILE).", []string{"listener"}, nil)
	descConnsRefused = prometheus.NewDesc("machina_listener_conns_refused_total",
		"Connections closed at accept: their address had its per-address cap open (per_ip), or the listener was at its budget with no connection to close for them (budget).",
		[]string{"listener", "reason"}, nil)
	descConnsEvicted = prometheus.NewDesc("machina_listener_conns_evicted_total",
		"Open connections closed at the budget to admit a new one: the oldest of an address holding two more, or the oldest the server had not written to for the stall time (connlimit.Config.StallAfter).", []string{"listener"}, nil)
	descAcceptErrors = prometheus.NewDesc("machina_listener_accept_errors_total",
		"accept(2) failures backed off from (EMFILE, ENFILE, ENOBUFS, ENOMEM).", []string{"listener"}, nil)
	descFDLimit = prometheus.NewDesc("machina_fd_limit",
		"RLIMIT_NOFILE soft limit the connection budgets were split from.", nil, nil)
	descFDReserve = prometheus.NewDesc("machina_fd_reserve",
		"Descriptors left to outbound and other work, which no listener may take.", nil, nil)
)
