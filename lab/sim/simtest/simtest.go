// Package simtest runs the real controller (controller.Run) in-process
// against a simulated lab (lab/sim) for tests: the configuration the lab's
// tests share, the lab's BMC secrets, and start and stop bound to the test.
// It is the one copy of that wiring for lab/sim's end-to-end tests, the HA
// tests on the lab and machinactl's verbs against a running controller.
package simtest

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/state"
)

// Config returns the controller configuration of the lab's tests: state in
// dir/state.db and work in dir/work, the lab's inventory polled every
// 200 ms, status every 300 ms, reconcile passes every 200 ms with 0.2-2 s
// backoff, the per-address machine and connection limits out of the way
// (every simulated machine is 127.0.0.1), listening on a kernel-chosen
// loopback port, logging to log. Callers change what their test needs.
func Config(dir string, lab *sim.Lab, log *slog.Logger) controller.Config {
	return controller.Config{
		StatePath: filepath.Join(dir, "state.db"), WorkDir: filepath.Join(dir, "work"), Listen: "127.0.0.1:0",
		Repo: gitops.Remote{URL: lab.RepoURL}, PollInterval: 200 * time.Millisecond, StatusInterval: 300 * time.Millisecond,
		MachinePerIP:  boot.Limit{Burst: 1000, Every: time.Millisecond},
		MaxConnsPerIP: 1 << 20,
		Reconciler:    reconciler.Config{Interval: 200 * time.Millisecond, BackoffBase: 200 * time.Millisecond, BackoffCap: 2 * time.Second},
		Logger:        log,
	}
}

// PutLabSecrets stores the lab's BMC user and password under both
// credential names the lab's inventory uses (bmc-redfish, bmc-ipmi).
func PutLabSecrets(st *state.Store, lab *sim.Lab) error {
	user, pass := lab.Credentials()
	for _, name := range []string{"bmc-redfish", "bmc-ipmi"} {
		if _, err := st.PutSecret(name, state.Credential{Username: user, Password: pass}, "test"); err != nil {
			return fmt.Errorf("put secret %s: %w", name, err)
		}
	}
	return nil
}

// Controller is a controller.Run in its own goroutine.
type Controller struct {
	// Run is what the controller gave its OnReady.
	Run    *controller.Running
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned; err is then set
	err    error
}

// Start runs controller.Run with cfg and returns once it is ready (its
// OnReady, cfg's own first, has run), or Run's error when it ends before.
// The caller stops it with Stop.
func Start(cfg controller.Config) (*Controller, error) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &Controller{cancel: cancel, done: make(chan struct{})}
	ready := make(chan *controller.Running, 1)
	onReady := cfg.OnReady
	cfg.OnReady = func(r *controller.Running) {
		if onReady != nil {
			onReady(r)
		}
		ready <- r
	}
	go func() { c.err = controller.Run(ctx, cfg); close(c.done) }()
	select {
	case c.Run = <-ready:
		return c, nil
	case <-c.done:
		cancel()
		return nil, fmt.Errorf("controller did not start: %w", c.err)
	}
}

// Done is closed when controller.Run has returned by itself or after Stop
// (a deposed HA controller's Run returns on its own); Err then says why.
func (c *Controller) Done() <-chan struct{} { return c.done }

// Err is Run's error once Done is closed, nil before.
func (c *Controller) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// Stop ends controller.Run through its context (what it left running sees
// the context end too) and returns Run's error. Safe to call again.
func (c *Controller) Stop() error {
	c.cancel()
	<-c.done
	return c.err
}
