package fleet

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/redact"
	"github.com/machina-metal/machina/state"
)

// Defaults of the BMC sweep (NewSweep's interval).
const (
	// DefaultBMCWatchInterval is how long one sweep of every BMC spans: at
	// 10,000 servers about 17 reads a second, each one GET on Redfish.
	DefaultBMCWatchInterval = 10 * time.Minute
	// bmcWatchWorkers bounds the reads in flight (a slow BMC holds one
	// worker for at most ReadTimeout).
	bmcWatchWorkers = 8
	// ReadTimeout bounds one read of a BMC (the sweep's, and the lost-host
	// power read's).
	ReadTimeout = 20 * time.Second
	// bmcWatchAuthRounds is how many sweeps skip a BMC that refused its
	// credential: BMCs lock an account after a few failed logins, and the
	// operator fixes the secret in the meantime.
	bmcWatchAuthRounds = 3
)

// Sweep reads every BMC's power state and health rollup, paced evenly
// over an interval, and records them in the store (Store.ObserveBMC):
// power drift (someone pressed a power button or used the BMC's own UI) and
// health changes show in the fleet page, the API and status/ without an
// operator asking. Drivers that implement bmc.HealthReader are read with
// it (Redfish: one GET of the System); others with Info.
type Sweep struct {
	st       *state.Store
	drivers  reconciler.Drivers
	interval time.Duration
	first    time.Duration // delay before the first sweep
	log      *slog.Logger

	mu   sync.Mutex
	skip map[string]time.Time // server → no read before (refused credential)
}

// NewSweep returns a sweep of st's BMCs through drivers, one sweep
// spanning interval (zero: DefaultBMCWatchInterval). log must not be nil.
func NewSweep(st *state.Store, drivers reconciler.Drivers, interval time.Duration, log *slog.Logger) *Sweep {
	if interval == 0 {
		interval = DefaultBMCWatchInterval
	}
	return &Sweep{st: st, drivers: drivers, interval: interval, first: min(interval/10, time.Minute), log: log, skip: map[string]time.Time{}}
}

// Run sweeps until ctx ends: the first sweep after w.first, then one every
// w.interval (a sweep that takes longer is followed by the next at once).
// When a secret is stored, the servers whose BMC could not be read are
// read at once (rereadFailed), between sweeps.
func (w *Sweep) Run(ctx context.Context) {
	t := time.NewTimer(w.first)
	defer t.Stop()
	secrets := w.st.SecretsChanged()
	for {
		select {
		case <-ctx.Done():
			return
		case <-secrets:
			secrets = w.st.SecretsChanged()
			w.rereadFailed(ctx)
			continue
		case <-t.C:
		}
		start := time.Now()
		n, changed := w.sweep(ctx)
		w.log.Debug("bmc sweep", "servers", n, "changed", changed, "took", time.Since(start))
		t.Reset(max(0, w.interval-time.Since(start)))
	}
}

// sweep reads every server with a BMC that is not stalled, starting the
// reads evenly over w.interval with at most bmcWatchWorkers in flight. It
// returns how many it read and how many records changed.
func (w *Sweep) sweep(ctx context.Context) (read, changed int) {
	names, err := w.st.ServersWithBMC()
	if err != nil {
		w.log.Warn("bmc sweep: list servers", "err", err)
		return 0, 0
	}
	if len(names) == 0 {
		return 0, 0
	}
	pace := w.interval / time.Duration(len(names))
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		sem  = make(chan struct{}, bmcWatchWorkers)
		next = time.Now()
	)
	for _, name := range names {
		w.mu.Lock()
		until, skipped := w.skip[name]
		if skipped && time.Now().After(until) {
			delete(w.skip, name)
			skipped = false
		}
		w.mu.Unlock()
		if skipped {
			continue
		}
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return read, changed
			case <-time.After(d):
			}
		}
		next = next.Add(pace)
		select {
		case <-ctx.Done():
			wg.Wait()
			return read, changed
		case sem <- struct{}{}:
		}
		wg.Go(func() {
			defer func() { <-sem }()
			ok, ch := w.read(ctx, name)
			mu.Lock()
			if ok {
				read++
			}
			if ch {
				changed++
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return read, changed
}

// rereadFailed reads, now and before anything else, every server whose
// last read failed (Store.ServersWithBMCError), lifting the skip of a
// refused credential: called after a secret changed, so a fixed
// credential clears "BMC unreadable" on the next successful read instead
// of up to bmcWatchAuthRounds sweeps later. Reads run bmcWatchWorkers at a
// time, unpaced (they are few: the servers with an error).
func (w *Sweep) rereadFailed(ctx context.Context) (read int) {
	names, err := w.st.ServersWithBMCError()
	if err != nil {
		w.log.Warn("bmc sweep: list unreadable servers", "err", err)
		return 0
	}
	w.mu.Lock()
	for _, n := range names {
		delete(w.skip, n)
	}
	w.mu.Unlock()
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		sem = make(chan struct{}, bmcWatchWorkers)
	)
	for _, name := range names {
		select {
		case <-ctx.Done():
			wg.Wait()
			return read
		case sem <- struct{}{}:
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if ok, _ := w.read(ctx, name); ok {
				mu.Lock()
				read++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	w.log.Info("bmc sweep: read the unreadable servers again after a secret change", "servers", len(names), "read", read)
	return read
}

// read reads one server's BMC and records what it found; ok is false when
// the BMC could not be read (logged; a refused credential also skips the
// server for bmcWatchAuthRounds sweeps).
func (w *Sweep) read(ctx context.Context, name string) (ok, changed bool) {
	srv, err := w.st.Server(name)
	if err != nil || srv.Stalled != "" || srv.BMC.Driver == "" {
		return false, false
	}
	log := w.log.With("server", name)
	drv, err := w.drivers.Driver(ctx, srv)
	if err != nil {
		// A credential missing from the secret store is as unreadable
		// as a refused one, and the operator can act on it.
		w.failed(ctx, name, log, err)
		return false, false
	}
	rctx, cancel := context.WithTimeout(ctx, ReadTimeout)
	defer cancel()
	at := time.Now()
	var (
		p bmc.PowerState
		h string
	)
	if hr, isHR := drv.(bmc.HealthReader); isHR {
		p, h, err = hr.Health(rctx)
	} else {
		var in *bmc.Info
		if in, err = drv.Info(rctx); err == nil {
			p, h = in.Power, in.Health
		}
	}
	if err != nil {
		w.failed(ctx, name, log, err)
		return false, false
	}
	changed, err = w.st.ObserveBMC(name, at, StatePower(p), h)
	if err != nil {
		log.Warn("bmc sweep: record", "err", err)
		return true, false
	}
	if sr, ok := drv.(bmc.SecurityReporter); ok {
		if sec := sr.SessionSecurity(); sec != "" && sec != srv.BMC.Security {
			if _, err := w.st.UpdateServer(name, func(s *state.Server) error { s.BMC.Security = sec; return nil }); err != nil {
				log.Warn("bmc sweep: record", "err", err)
			} else {
				changed = true
			}
		}
	}
	if changed {
		log.Info("bmc observed", "power", string(p), "health", h)
	}
	if needsFirmwareRead(srv) {
		if w.readFirmware(ctx, name, drv, log) {
			changed = true
		}
	}
	return true, changed
}

// FirmwareReadTimeout bounds one firmware read of a BMC: the BIOS
// attribute registry alone is a document of about a megabyte on Dell
// iDRAC 9 and HPE iLO 5, which they serve slowly.
const FirmwareReadTimeout = 2 * time.Minute

// needsFirmwareRead: the server's firmware was never read, or it is ready
// and was read before its last lifecycle move (a commissioning or a
// release since: what the plan checks a profile against must be what the
// machine has now). Deployed servers are not re-read on every sweep: the
// registry is large and changes only with a BIOS update, which Machina
// reads back itself.
func needsFirmwareRead(srv state.Server) bool {
	if srv.Lifecycle == state.LifecycleRetired {
		return false
	}
	if srv.Firmware == nil {
		return true
	}
	return srv.Lifecycle == state.LifecycleReady && srv.Firmware.ReadAt.Before(srv.LifecycleAt)
}

// readFirmware reads the server's firmware (reconciler.ReadFirmware) and
// stores it, keeping the volumes Machina created; it reports whether it
// stored a read. A failed read is logged and tried again next sweep.
func (w *Sweep) readFirmware(ctx context.Context, name string, drv bmc.Driver, log *slog.Logger) bool {
	fctx, cancel := context.WithTimeout(ctx, FirmwareReadTimeout)
	defer cancel()
	fw, err := reconciler.ReadFirmware(fctx, drv, time.Now())
	if err != nil {
		log.Warn("bmc sweep: read firmware", "err", redact.String(err.Error()))
		return false
	}
	if _, err := w.st.UpdateServer(name, func(s *state.Server) error {
		if s.Firmware != nil {
			fw.CreatedVolumes = s.Firmware.CreatedVolumes
		}
		s.Firmware = fw
		return nil
	}); err != nil {
		log.Warn("bmc sweep: record firmware", "err", err)
		return false
	}
	log.Info("bmc firmware read", "unsupported", len(fw.Unsupported), "components", len(fw.Components))
	return true
}

// failed records a read that failed (unless the sweep is stopping): the
// redacted reason on the server (Store.BMCReadFailed) and in the log; a
// refused or missing credential also skips the server for
// bmcWatchAuthRounds sweeps.
func (w *Sweep) failed(ctx context.Context, name string, log *slog.Logger, err error) {
	if ctx.Err() != nil {
		return
	}
	if errors.Is(err, bmc.ErrAuth) {
		w.mu.Lock()
		w.skip[name] = time.Now().Add(bmcWatchAuthRounds * w.interval)
		w.mu.Unlock()
	}
	msg := redact.String(err.Error())
	log.Warn("bmc sweep: read", "err", msg)
	if _, err := w.st.BMCReadFailed(name, msg); err != nil {
		log.Warn("bmc sweep: record", "err", err)
	}
}

// NewSweepDrivers returns the driver cache the sweep uses: its own small
// one, so reading every BMC in turn does not evict the drivers (and BMC
// sessions) the reconciler keeps for the servers it is working on.
func NewSweepDrivers(st *state.Store, log *slog.Logger) *StoreDrivers {
	return &StoreDrivers{Store: st, Logger: log, MaxDrivers: 2 * bmcWatchWorkers, IdleTimeout: time.Minute}
}

// StatePower maps a BMC's power reading to the store's power state; ""
// (leave the record alone) for PowerUnknown.
func StatePower(p bmc.PowerState) state.Power {
	switch p {
	case bmc.PowerOn:
		return state.PowerOn
	case bmc.PowerOff:
		return state.PowerOff
	}
	return ""
}
