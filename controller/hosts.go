package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/redfish"
	"github.com/machina-metal/machina/fence"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/reconciler/fleet"
	"github.com/machina-metal/machina/redact"
	"github.com/machina-metal/machina/state"
)

// Host liveness and fencing.
//
// A host whose last heartbeat is older than the lost window (default 3
// heartbeat intervals) is marked lost (state.MarkHostLost, condition
// HostLost, an event), and its server's power is read from the BMC and
// recorded: "lost, powered on" is a host that is running but unreachable
// (network, agent), "lost, powered off" one that is down. A heartbeat
// clears it (join listener). A host whose profile says `fence: auto` and
// that stays lost for a second window is fenced: its server powered off
// through its BMC or fencing device and read back off, only while the
// safety brake's share allows it (plan.Options.BrakeShare): when
// more than that share of the hosts is lost at once (a network split
// looks like that) no host is fenced automatically, and fences never
// exceed the share of hosts.

// errNoServer is returned for a host that runs on no known server.
var errNoServer = errors.New("the host's server is not known (it joined without one)")

// fencer powers a host's server off (fence.Fence) through the device
// servers.yaml names for it (`fence:`) or its BMC, and records the result.
type fencer struct {
	st      *state.Store
	drivers reconciler.Drivers
	desired func() *inventory.Inventory
	opts    fence.Options
	// ipmitool is the binary for IPMI fencing devices; "" means PATH's.
	ipmitool string
	log      *slog.Logger
	// mu serialises fences of one server (two operators, or an operator
	// and auto-fence, at once).
	mu   sync.Mutex
	busy map[string]bool
}

// errFenceBusy is returned while another fence of the same server runs.
var errFenceBusy = errors.New("a fence of this server is already running")

// device opens what fences srv: the fencing device of its servers.yaml
// entry when it has one (credentials from the secret store, the password
// handed to ipmitool's environment or the Redfish client's memory), else
// its BMC. close releases it.
func (f *fencer) device(ctx context.Context, srv state.Server) (dev fence.Device, desc string, closeFn func(), err error) {
	var fd *inventory.BMC
	if inv := f.desired(); inv != nil {
		if ws := inv.Server(srv.Name); ws != nil {
			fd = ws.Fence
		}
	}
	if fd == nil {
		drv, err := f.drivers.Driver(ctx, srv)
		if err != nil {
			return nil, "", nil, fmt.Errorf("open BMC: %w", err)
		}
		return fence.BMC{Driver: drv}, "bmc", func() {}, nil // the driver stays cached for the reconciler
	}
	cred, err := f.st.Secret(fd.Credentials)
	if errors.Is(err, state.ErrNotFound) {
		return nil, "", nil, fmt.Errorf("fencing device credential %q is not in the secret store (machinactl secret set %s): %w", fd.Credentials, fd.Credentials, bmc.ErrAuth)
	}
	if err != nil {
		return nil, "", nil, fmt.Errorf("read fencing device credential %q: %w", fd.Credentials, err)
	}
	desc = fmt.Sprintf("fence %s %s", fd.Driver, fd.Address)
	switch fd.Driver {
	case inventory.DriverIPMI:
		return &fence.IPMITool{Address: fd.Address, Username: cred.Username, Password: cred.Password, Path: f.ipmitool}, desc, func() {}, nil
	case inventory.DriverRedfish:
		drv, err := redfish.New(redfish.Config{Endpoint: fd.Address, SystemID: fd.SystemID, Insecure: fd.InsecureTLS,
			Username: cred.Username, Password: cred.Password, Logger: f.log.With("server", srv.Name, "fence", fd.Address)})
		if err != nil {
			return nil, "", nil, fmt.Errorf("open fencing device: %w", err)
		}
		return fence.BMC{Driver: drv}, desc, func() {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = drv.Close(cctx)
		}, nil
	}
	return nil, "", nil, fmt.Errorf("fencing device driver %q: %w", fd.Driver, bmc.ErrUnsupported)
}

// fenceHost fences the named host's server: power off, read back off,
// then state.FenceServer (audit event with actor and reason). A failure
// is recorded as an EventHostFenceFailed and returned; nothing is marked
// fenced unless the power read back off.
func (f *fencer) fenceHost(ctx context.Context, host, actor, reason string, auto bool) (state.Server, error) {
	h, err := f.st.Host(host)
	if err != nil {
		return state.Server{}, err
	}
	if h.Server == "" {
		return state.Server{}, errNoServer
	}
	srv, err := f.st.Server(h.Server)
	if err != nil {
		return state.Server{}, fmt.Errorf("server %s: %w", h.Server, err)
	}
	f.mu.Lock()
	if f.busy == nil {
		f.busy = map[string]bool{}
	}
	if f.busy[srv.Name] {
		f.mu.Unlock()
		return state.Server{}, errFenceBusy
	}
	f.busy[srv.Name] = true
	f.mu.Unlock()
	defer func() { f.mu.Lock(); delete(f.busy, srv.Name); f.mu.Unlock() }()

	log := f.log.With("host", host, "server", srv.Name, "actor", actor)
	dev, desc, closeDev, err := f.device(ctx, srv)
	if err == nil {
		log.Info("fencing host", "device", desc, "reason", reason)
		err = fence.Fence(ctx, dev, f.opts)
		closeDev()
	}
	if err != nil {
		msg := redact.String(err.Error())
		log.Error("fence failed", "err", msg)
		_, _ = f.st.AppendEvent(state.Event{Server: srv.Name, Kind: state.EventHostFenceFailed, Actor: actor,
			Message: fmt.Sprintf("host %s not fenced (%s): %s", host, reason, msg)})
		return state.Server{}, fmt.Errorf("fence %s: %s", host, msg)
	}
	out, err := f.st.FenceServer(srv.Name, state.Fencing{Actor: actor, Reason: reason, Host: host, Device: desc, Auto: auto})
	if err != nil {
		return state.Server{}, err
	}
	log.Info("host fenced: power read back off", "device", desc)
	return out, nil
}

// mountHosts mounts the fence routes:
//
//	POST /api/v1/hosts/{name}/fence    body v1.FenceRequest → 200 v1.FenceResult
//	POST /api/v1/hosts/{name}/unfence  body v1.FenceRequest → 200 v1.Host
//
// A fence answers only after the power read back off (502 when it did
// not, with the device's sanitised error; 409 for a host without a known
// server or a fence already running; 404 for an unknown host; 400 without
// a reason). Both are audited as events naming the admin token.
func mountHosts(srv *api.Server, st *state.Store, f *fencer, trigger func(), heartbeat time.Duration) error {
	reasonOf := func(w http.ResponseWriter, r *http.Request) (string, bool) {
		var req v1.FenceRequest
		if !decode(w, r, &req) {
			return "", false
		}
		req.Reason = strings.TrimSpace(req.Reason)
		if req.Reason == "" || len(req.Reason) > 500 || strings.ContainsAny(req.Reason, "\x00\r\n") {
			writeErr(w, http.StatusBadRequest, "bad_request", "reason is required: one line of at most 500 characters saying why")
			return "", false
		}
		return req.Reason, true
	}
	routes := map[string]http.HandlerFunc{
		"POST /api/v1/hosts/{name}/fence": func(w http.ResponseWriter, r *http.Request) {
			reason, ok := reasonOf(w, r)
			if !ok {
				return
			}
			name := r.PathValue("name")
			// A fence that started runs to its read-back even when the
			// client goes away (fence.Options.Timeout bounds it).
			out, err := f.fenceHost(context.WithoutCancel(r.Context()), name, api.Actor(r), reason, false)
			switch {
			case errors.Is(err, state.ErrNotFound):
				writeErr(w, http.StatusNotFound, "not_found", "no host "+name)
			case errors.Is(err, errNoServer), errors.Is(err, errFenceBusy):
				writeErr(w, http.StatusConflict, "conflict", "fence "+name+": "+err.Error())
			case err != nil:
				writeErr(w, http.StatusBadGateway, "fence_failed", err.Error())
			default:
				trigger()
				writeJSON(w, http.StatusOK, v1.FenceResult{Host: name, Server: out.Name, Device: out.Fenced.Device,
					Power: string(state.PowerOff), At: out.Fenced.At, Actor: out.Fenced.Actor})
			}
		},
		"POST /api/v1/hosts/{name}/unfence": func(w http.ResponseWriter, r *http.Request) {
			reason, ok := reasonOf(w, r)
			if !ok {
				return
			}
			name := r.PathValue("name")
			h, err := st.Host(name)
			if errors.Is(err, state.ErrNotFound) {
				writeErr(w, http.StatusNotFound, "not_found", "no host "+name)
				return
			}
			if err == nil && h.Server == "" {
				err = errNoServer
			}
			if err == nil {
				var changed bool
				if changed, err = st.UnfenceServer(h.Server, api.Actor(r), reason); err == nil && !changed {
					writeErr(w, http.StatusConflict, "not_fenced", "host "+name+" is not fenced")
					return
				}
			}
			if err != nil {
				writeErr(w, http.StatusConflict, "conflict", "unfence "+name+": "+err.Error())
				return
			}
			trigger()
			h, _ = st.Host(name)
			writeJSON(w, http.StatusOK, join.HostView(h, time.Now(), heartbeat))
		},
	}
	for pattern, h := range routes {
		if err := srv.HandleAdmin(pattern, h); err != nil {
			return err
		}
	}
	return nil
}

// hostWatch marks silent hosts lost, reads their power, and auto-fences.
type hostWatch struct {
	st      *state.Store
	drivers reconciler.Drivers
	fencer  *fencer
	desired func() *inventory.Inventory
	// lost is the silence that makes a host lost; fenceAfter the further
	// time lost before auto-fence; share the safety brake's share.
	lost, fenceAfter, tick time.Duration
	share                  float64
	now                    func() time.Time
	log                    *slog.Logger

	held      bool                 // an auto-fence hold is in force (reported once)
	powerRead map[string]time.Time // host → last power read attempt
	// include, if set, says which hosts this watch marks lost, reads
	// and fences (a controller group's, scopedTo); nil: every host.
	include func(state.Host) bool
}

// hostWatchConfig is what newHostWatch needs; zero durations default from
// heartbeat (lost 3 intervals, fenceAfter the same again, tick half an
// interval, at least 100ms), a zero share is 0.2.
type hostWatchConfig struct {
	heartbeat, lost, fenceAfter time.Duration
	share                       float64
}

// scopedTo limits the watch to the hosts include accepts (a controller
// group's: those whose server is in its zones); nil watches every host.
func (w *hostWatch) scopedTo(include func(state.Host) bool) *hostWatch {
	w.include = include
	return w
}

func newHostWatch(st *state.Store, drivers reconciler.Drivers, f *fencer, desired func() *inventory.Inventory, c hostWatchConfig, log *slog.Logger) *hostWatch {
	if c.heartbeat <= 0 {
		c.heartbeat = 30 * time.Second
	}
	if c.lost <= 0 {
		c.lost = 3 * c.heartbeat
	}
	if c.fenceAfter <= 0 {
		c.fenceAfter = c.lost
	}
	if c.share <= 0 {
		c.share = 0.2
	}
	return &hostWatch{st: st, drivers: drivers, fencer: f, desired: desired, lost: c.lost, fenceAfter: c.fenceAfter,
		tick: max(c.heartbeat/2, 100*time.Millisecond), share: c.share, now: time.Now, log: log, powerRead: map[string]time.Time{}}
}

// run checks every tick until ctx ends.
func (w *hostWatch) run(ctx context.Context) {
	t := time.NewTicker(w.tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.check(ctx)
	}
}

// watched reports whether a host's heartbeats are expected: it joined (or
// is joining) and was not released or retired with its server.
func watched(h state.Host) bool {
	return h.CertFingerprint != "" && (h.JoinStatus == "joined" || h.JoinStatus == "joining" || h.JoinStatus == "failed")
}

// check is one pass: mark lost hosts, read the power of lost hosts not
// read in the last lost window, and auto-fence.
func (w *hostWatch) check(ctx context.Context) {
	hosts, err := w.st.Hosts()
	if err != nil {
		w.log.Warn("host watch: list hosts", "err", err)
		return
	}
	now := w.now()
	var watchedHosts []state.Host
	for _, h := range hosts {
		if !watched(h) || (w.include != nil && !w.include(h)) {
			continue
		}
		last := h.LastSeen
		if last.IsZero() {
			last = h.JoinedAt
		}
		if h.Lost == nil && now.Sub(last) >= w.lost {
			changed, err := w.st.MarkHostLost(h.Name, now.Add(-w.lost), now)
			switch {
			case errors.Is(err, state.ErrNotLost):
				continue // a heartbeat landed first
			case err != nil:
				w.log.Warn("host watch: mark lost", "host", h.Name, "err", err)
				continue
			}
			if changed {
				w.log.Warn("host lost: no heartbeat", "host", h.Name, "server", h.Server, "since", last, "window", w.lost)
				delete(w.powerRead, h.Name)
			}
			if h, err = w.st.Host(h.Name); err != nil {
				continue
			}
		}
		if h.Lost != nil && h.Fenced == nil && (h.Lost.Power == "" || now.Sub(w.powerRead[h.Name]) >= w.lost) && now.Sub(w.powerRead[h.Name]) >= w.tick*4 {
			w.powerRead[h.Name] = now
			w.readPower(ctx, h)
			if h2, err := w.st.Host(h.Name); err == nil {
				h = h2
			}
		}
		if h.Lost == nil {
			delete(w.powerRead, h.Name)
		}
		watchedHosts = append(watchedHosts, h)
	}
	w.autoFence(ctx, watchedHosts, now)
}

// readPower reads a lost host's server power from its BMC and records it.
func (w *hostWatch) readPower(ctx context.Context, h state.Host) {
	if h.Server == "" {
		_ = w.st.RecordLostPower(h.Name, w.now(), "", "the host's server is not known")
		return
	}
	srv, err := w.st.Server(h.Server)
	if err != nil {
		_ = w.st.RecordLostPower(h.Name, w.now(), "", "server "+h.Server+" not found")
		return
	}
	rctx, cancel := context.WithTimeout(ctx, fleet.ReadTimeout)
	defer cancel()
	drv, err := w.drivers.Driver(rctx, srv)
	var p bmc.PowerState
	if err == nil {
		p, err = drv.PowerState(rctx)
	}
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		msg := redact.String(err.Error())
		w.log.Warn("lost host: power read failed", "host", h.Name, "server", srv.Name, "err", msg)
		_ = w.st.RecordLostPower(h.Name, w.now(), "", msg)
		return
	}
	sp := fleet.StatePower(p)
	if sp == "" {
		_ = w.st.RecordLostPower(h.Name, w.now(), "", "the BMC reports power "+string(p))
		return
	}
	if err := w.st.RecordLostPower(h.Name, w.now(), sp, ""); err != nil && !errors.Is(err, state.ErrNotLost) {
		w.log.Warn("lost host: record power", "host", h.Name, "err", err)
	}
	w.log.Info("lost host: power read", "host", h.Name, "server", srv.Name, "power", string(p))
}

// autoFenceDecision is what autoFence works out from the hosts: which to
// fence now, or why none may be.
type autoFenceDecision struct {
	fence []string // host names, sorted
	held  string   // why auto-fence is held, "" when not
}

// decideAutoFence picks the hosts to fence: lost for lost+fenceAfter, not
// fenced, on a server whose profile has fence: auto. share bounds both the
// lost hosts not fenced (more than share of the hosts: a split, fence
// nothing) and the fenced ones (existing fences plus new ones at most share of the
// hosts, rounded down). Pure, for tests.
func decideAutoFence(hosts []state.Host, auto func(state.Host) bool, now time.Time, lostFor time.Duration, share float64) autoFenceDecision {
	total, lost, fenced := len(hosts), 0, 0
	var due []string
	for _, h := range hosts {
		if h.Fenced != nil {
			fenced++ // counted against the share below, not as a new loss
			continue
		}
		if h.Lost == nil {
			continue
		}
		lost++
		if now.Sub(h.Lost.Since) >= lostFor && auto(h) {
			due = append(due, h.Name)
		}
	}
	if len(due) == 0 || total == 0 {
		return autoFenceDecision{}
	}
	sort.Strings(due)
	if float64(lost) > share*float64(total) {
		return autoFenceDecision{held: fmt.Sprintf("%d of %d hosts are lost (%.0f%%), more than the safety brake's %.0f%%: a network split looks like this, so none is fenced automatically (fence by hand: machinactl host fence NAME --reason ...)",
			lost, total, 100*float64(lost)/float64(total), 100*share)}
	}
	allowed := int(math.Floor(share*float64(total)+1e-9)) - fenced
	if allowed <= 0 {
		return autoFenceDecision{held: fmt.Sprintf("%d of %d hosts are fenced already, the safety brake's %.0f%% share: no more are fenced automatically until one is unfenced", fenced, total, 100*share)}
	}
	d := autoFenceDecision{fence: due}
	if len(due) > allowed {
		d.fence = due[:allowed]
		d.held = fmt.Sprintf("%d hosts are due for auto-fence, the safety brake's %.0f%% of %d hosts allows %d more", len(due), 100*share, total, allowed)
	}
	return d
}

func (w *hostWatch) autoFence(ctx context.Context, hosts []state.Host, now time.Time) {
	inv := w.desired()
	if inv == nil {
		return
	}
	auto := func(h state.Host) bool {
		if h.Server == "" {
			return false
		}
		srv, err := w.st.Server(h.Server)
		if err != nil || srv.Allocation == nil {
			return false
		}
		p := inv.Profile(srv.Allocation.Profile)
		return p != nil && p.Fence == inventory.FenceAuto
	}
	d := decideAutoFence(hosts, auto, now, w.lost+w.fenceAfter, w.share)
	if d.held != "" && !w.held {
		w.log.Warn("auto-fence held by the safety brake", "why", d.held)
		_, _ = w.st.AppendEvent(state.Event{Kind: state.EventHostFenceHeld, Actor: state.ActorController, Message: "auto-fence held: " + d.held})
	}
	w.held = d.held != ""
	for _, name := range d.fence {
		reason := fmt.Sprintf("auto-fence: no heartbeat for more than %s (profile fence: auto)", (w.lost + w.fenceAfter).Round(time.Second))
		if _, err := w.fencer.fenceHost(ctx, name, state.ActorController, reason, true); err != nil && ctx.Err() == nil {
			w.log.Warn("auto-fence failed", "host", name, "err", err)
		}
	}
}

// registerJoinMetrics exports the join listener's heartbeat counters:
// heartbeats answered 429 over the per-host rate, and heartbeats from
// fenced hosts (each says the fence did not hold).
func registerJoinMetrics(reg prometheus.Registerer, js *join.Server) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "machina_join_heartbeats_limited_total",
			Help: "Heartbeats answered 429 because their host sent faster than the per-host heartbeat rate."},
			func() float64 { return float64(js.HeartbeatsLimited()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "machina_join_fenced_heartbeats_total",
			Help: "Heartbeats received from fenced hosts: each says the fence did not hold."},
			func() float64 { return float64(js.FencedHeartbeats()) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
