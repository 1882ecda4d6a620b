package controller

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/machina-metal/machina/ha"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/state"
)

// HAConfig runs the controller as one of a group of controllers sharing
// one etcd cluster (docs/ha.md): the state lives in etcd, one controller
// is elected leader on an etcd session lease and only it acts.
type HAConfig struct {
	// Etcd says where the site's state is: endpoints, client TLS, key
	// prefix. Zero: parsed from Config.StatePath, which must then be an
	// etcd:// target (state.ParseEtcdTarget, with Config.EtcdTLS). The
	// state store and the election share one client dialled from it;
	// Etcd.Client, if set, is used instead (and not closed).
	Etcd state.EtcdConfig
	// ID names this controller in the group (--ha-id). Required.
	ID string
	// TTL is the election's session lease (--ha-ttl), whole seconds; zero
	// means 10 s.
	TTL time.Duration
	// AdminURL is this controller's admin API base URL as the other
	// controllers reach it, put in its campaign value so standbys can
	// forward writes (--ha-admin-url). "": the admin API's own URL, which
	// must then name a specific host (not 0.0.0.0 or [::]).
	AdminURL string
	// VIP, if set, is the provisioning address that moves with the leader
	// (--vip, --vip-interface).
	VIP *ha.VIPConfig
}

// ErrDeposed is what Run returns after this controller lost leadership:
// it has stopped everything only a leader does and exits, to start again
// as a standby (machina serve exits non-zero; systemd restarts it), as
// kube-controller-manager does on a lost lease. Leader-only components are
// built once per process, so a clean restart is the simplest way to never
// reuse one that a lost term left half-stopped.
var ErrDeposed = errors.New("controller: leadership lost")

// leaderOnly names the components that only the leader runs: everything
// that acts on machines or BMCs, answers machines or writes status. The
// others (admin API, Git source, revisions: the clone and image caches)
// run on standbys too.
var leaderOnly = map[string]bool{
	"machine endpoints": true, "join": true, "status writer": true, "reconciler": true,
	"auto-enrol proposals": true, "bmc sweep": true, "host watch": true, "prune": true, "refusal summary": true,
	"events out": true, // one sender per site: standbys share the stored cursors
}

func isLeaderOnly(name string) bool {
	if leaderOnly[name] {
		return true
	}
	var i int
	_, err := fmt.Sscanf(name, "netboot %d", &i)
	return err == nil
}

// haWiring is what the ha stage builds.
type haWiring struct {
	client  *clientv3.Client
	prefix  string // election prefix
	elector *ha.Elector
	vip     *ha.VIP
	metrics *ha.Metrics
}

// openHAState dials the group's etcd client and opens the state on it.
func (w *wiring) openHAState(opts state.Options) (*state.Store, func(), error) {
	h := w.cfg.HA
	if h.ID == "" {
		return nil, nil, errors.New("controller: HA needs an id (--ha-id)")
	}
	w.ha = &haWiring{}
	closeClient := func() {}
	ec := h.Etcd
	if ec.Client == nil && len(ec.Endpoints) == 0 {
		if !state.IsEtcdTarget(w.cfg.StatePath) {
			return nil, nil, errors.New("controller: HA needs the state in etcd (--state etcd://…)")
		}
		var err error
		if ec, _, err = state.ParseEtcdTarget(w.cfg.StatePath, w.cfg.EtcdTLS); err != nil {
			return nil, nil, fmt.Errorf("controller: %w", err)
		}
	}
	cli := ec.Client
	if cli == nil {
		dial := ec.DialTimeout
		if dial <= 0 {
			dial = 5 * time.Second
		}
		var err error
		// The client's own zap logging is off: every error it returns is
		// logged by the component that made the call.
		cli, err = clientv3.New(clientv3.Config{Endpoints: ec.Endpoints, TLS: ec.TLS, DialTimeout: dial, Logger: zap.NewNop()})
		if err != nil {
			return nil, nil, fmt.Errorf("controller: etcd: %w", err)
		}
		closeClient = func() { _ = cli.Close() }
	}
	w.ha.client = cli
	ec.Client = cli
	st, err := state.OpenEtcd(ec, opts)
	if err != nil {
		closeClient()
		return nil, nil, fmt.Errorf("controller: open state: %w", err)
	}
	prefix := ec.Prefix
	if prefix == "" {
		prefix = "/machina/"
	}
	w.ha.prefix = prefix + "leader"
	if g := w.cfg.Group; g != "" {
		// Not under PREFIX leader/: that election's prefix would hold
		// every group's keys.
		w.ha.prefix = prefix + "groups/" + g + "/leader"
	}
	return st, func() { _ = st.Close(); closeClient() }, nil
}

// haStage builds the elector, the VIP and the admin API's gate, and fences
// the store as a standby (start-up writes, such as the CA on a fresh site,
// are done by then). Runs last, when the admin URL is known.
func (w *wiring) haStage() (func(), error) {
	if w.cfg.HA == nil {
		return nil, nil
	}
	h := w.cfg.HA
	adminURL := h.AdminURL
	if adminURL == "" {
		adminURL = w.adminURL
		if adminURL == "" {
			adminURL = "http://" + w.ln.Addr().String()
		}
		if u, err := url.Parse(adminURL); err == nil {
			if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsUnspecified() {
				return nil, fmt.Errorf("controller: HA: the admin API listens on %s, which other controllers cannot dial: set --ha-admin-url", u.Host)
			}
		}
	}
	if u, err := url.Parse(adminURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("controller: HA: admin URL %q: want https://host:port", adminURL)
	}
	w.ha.metrics = ha.NewMetrics(w.reg)
	el, err := ha.NewElector(ha.ElectorConfig{Client: w.ha.client, Prefix: w.ha.prefix, TTL: h.TTL, Metrics: w.ha.metrics,
		Self: ha.Candidate{ID: h.ID, AdminURL: adminURL}, Logger: w.log.With("component", "ha")})
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	w.ha.elector = el
	if h.VIP != nil {
		vc := *h.VIP
		vc.Logger = w.log.With("component", "vip")
		if w.ha.vip, err = ha.NewVIP(vc); err != nil {
			return nil, fmt.Errorf("controller: %w", err)
		}
	}
	tr, err := adminTransport(w.st)
	if err != nil {
		return nil, err
	}
	gate, err := ha.Gate(ha.GateConfig{Leader: el, Self: h.ID, Transport: tr, RetryAfter: el.TTL(), Logger: w.log.With("component", "ha")})
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	w.srv.Wrap(gate)
	// A standby writes nothing: create revisions start at 1, so no key
	// matches revision -1.
	if err := w.st.SetFence(&state.Fence{Key: w.ha.prefix + "/standby", Revision: -1}); err != nil {
		return nil, fmt.Errorf("controller: fence: %w", err)
	}
	if w.run != nil {
		w.run.Elector = el
	}
	return nil, nil
}

// adminTransport reaches another controller's admin API: the system roots
// plus the controller CA, which issues the admin certificates unless the
// operator gave one (--tls-cert; its CA should then be in the system roots).
func adminTransport(st *state.Store) (http.RoundTripper, error) {
	ca, err := join.LoadOrCreateCA(st, nil)
	if err != nil {
		return nil, fmt.Errorf("controller: HA: controller CA: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	pool.AppendCertsFromPEM(ca.PEM())
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig.RootCAs = pool
	return tr, nil
}

// runHA runs the election: each term fences the store with the term,
// adds the VIP and runs the leader-only components until the term ends;
// then the VIP goes at once (machines stop reaching this controller before
// its services have drained), the components stop, and runHA returns
// ErrDeposed. It returns nil when ctx ends first.
func (w *wiring) runHA(ctx context.Context, comps []component) error {
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	err := w.ha.elector.Run(hctx, ha.Handlers{
		OnElected: func(lctx context.Context, t ha.Term) error {
			if err := w.st.SetFence(&state.Fence{Key: t.Key, Revision: t.Rev, Value: t.Value}); err != nil {
				return err
			}
			if v := w.ha.vip; v != nil {
				if err := v.Acquire(lctx); err != nil {
					return err
				}
				released := make(chan struct{})
				defer func() { <-released }()
				go func() {
					defer close(released)
					<-lctx.Done()
					if err := v.Release(); err != nil {
						w.log.Error("ha: release the virtual IP", "err", err)
					}
				}()
			}
			w.log.Info("leader: starting the leader's components", "term_key", t.Key, "term_rev", t.Rev)
			g, gctx := errgroup.WithContext(lctx)
			for _, c := range comps {
				g.Go(func() error {
					if err := c.run(gctx); err != nil && !errors.Is(err, context.Canceled) {
						return fmt.Errorf("%s: %w", c.name, err)
					}
					return nil
				})
			}
			done := make(chan error, 1)
			go func() { done <- g.Wait() }()
			select {
			case err := <-done:
				if lctx.Err() != nil {
					return nil
				}
				return err
			case <-lctx.Done():
			}
			// Deposed: every component's context is cancelled and BMC calls
			// end with it, but a state call to an unreachable etcd has no
			// context and runs to its request timeout. Give them one TTL;
			// Run returns ErrDeposed after it either way (and machina serve
			// exits, ending what is left).
			select {
			case <-done:
			case <-time.After(w.ha.elector.TTL()):
				w.log.Warn("ha: leader components still stopping one TTL after the term ended; leaving them")
			}
			return nil
		},
		OnDeposed: func(t ha.Term, reason error) {
			if !errors.Is(reason, ha.ErrShutdown) {
				cancel(fmt.Errorf("%w: %w", ErrDeposed, reason))
			}
		},
	})
	if err != nil {
		return err
	}
	if cause := context.Cause(hctx); errors.Is(cause, ErrDeposed) {
		return cause
	}
	return nil
}
