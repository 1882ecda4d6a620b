package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/machina-metal/machina/reconciler/fleet"
)

// component is one long-running part of the controller, served by serve.
// run returns nil (or context.Canceled) once ctx is done.
type component struct {
	name string
	run  func(ctx context.Context) error
}

// componentList lists what serve runs, built by the stages.
func (w *wiring) componentList() []component {
	cfg, st, log := w.cfg, w.st, w.log
	var cs []component
	if w.adminLn != nil && !IsLoopback(w.ln.Addr().String()) {
		cs = append(cs, component{"machine endpoints", func(ctx context.Context) error { return w.srv.ServeMachine(ctx, w.ln) }})
	} else {
		cs = append(cs, component{"api", func(ctx context.Context) error { return w.srv.Serve(ctx, w.ln) }})
	}
	if w.adminLn != nil {
		log.Info("admin API and UI listening (TLS)", "url", w.adminURL)
		cs = append(cs, component{"admin api", func(ctx context.Context) error { return w.srv.Serve(ctx, w.adminLn) }})
	}
	cs = append(cs, component{"join", func(ctx context.Context) error { return w.joinSrv.Serve(ctx, w.joinLn) }})
	for i, r := range w.netRuns {
		cs = append(cs, component{fmt.Sprintf("netboot %d", i), r})
	}
	cs = append(cs, component{"git source", w.src.Run}, component{"status writer", w.writer.Run}, component{"reconciler", w.runReconciler})
	if w.enr != nil {
		cs = append(cs, component{"auto-enrol proposals", w.enr.Run})
	}
	if w.tpmPins != nil {
		cs = append(cs, component{"tpm pin proposals", w.tpmPins.Run})
	}
	if cfg.BMCWatchInterval >= 0 {
		sw := fleet.NewSweep(st, w.sweepDrivers, cfg.BMCWatchInterval, log.With("component", "bmc-sweep"))
		cs = append(cs, component{"bmc sweep", func(ctx context.Context) error { sw.Run(ctx); return nil }})
	}
	hw := newHostWatch(st, w.drivers, w.fencer, w.ctrl.Desired, hostWatchConfig{heartbeat: cfg.Heartbeat, lost: cfg.HostLostWindow,
		fenceAfter: cfg.HostFenceWindow, share: cfg.Reconciler.Plan.BrakeShare}, log.With("component", "host-watch")).scopedTo(w.hostInScope())
	cs = append(cs, w.eventsOutComponent()...)
	return append(cs,
		component{"host watch", func(ctx context.Context) error { hw.run(ctx); return nil }},
		component{"prune", func(ctx context.Context) error { prune(ctx, st, 10*time.Minute, log); return nil }},
		component{"refusal summary", func(ctx context.Context) error { w.refusals.run(ctx, time.Minute); return nil }},
		component{"revisions", func(ctx context.Context) error {
			follow(ctx, w.src, w.ctrl, w.importer, w.imgStore, w.importFails, cfg.Mirrors, log)
			return nil
		}})
}

// serve runs every component until ctx is done or one fails (which stops
// the others); it calls OnReady once they are started and returns the
// first failure, nil on a clean stop.
func (w *wiring) serve(ctx context.Context) error {
	w.log.Info("controller listening", "addr", w.ln.Addr().String(), "url", w.publicURL, "repo", redactURL(w.cfg.Repo.URL))
	g, gctx := errgroup.WithContext(ctx)
	comps := w.componentList()
	if w.ha != nil {
		var lead []component
		var all []component
		for _, c := range comps {
			if isLeaderOnly(c.name) {
				lead = append(lead, c)
			} else {
				all = append(all, c)
			}
		}
		comps = append(all, component{"ha election", func(ctx context.Context) error { return w.runHA(ctx, lead) }})
	}
	for _, c := range comps {
		g.Go(func() error {
			if err := c.run(gctx); err != nil && !errors.Is(err, context.Canceled) {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			return nil
		})
	}
	if w.cfg.OnReady != nil {
		w.cfg.OnReady(w.run)
	}
	if err := g.Wait(); err != nil {
		return err
	}
	w.log.Info("controller stopped")
	return nil
}

// runReconciler runs the reconciler; a group's leader first records the
// group's zone claim in the shared state (fenced by its term: a deposed
// leader's claim is refused), so the other groups' plans see it.
func (w *wiring) runReconciler(ctx context.Context) error {
	if g := w.cfg.Group; g != "" {
		by := ""
		if w.cfg.HA != nil {
			by = w.cfg.HA.ID
		}
		if err := w.st.PutZoneClaim(g, w.cfg.Zones, by); err != nil {
			return fmt.Errorf("zone claim of group %s: %w", g, err)
		}
		w.log.Info("zone claim recorded", "group", g, "zones", w.cfg.Zones)
	}
	return w.ctrl.Run(ctx)
}
