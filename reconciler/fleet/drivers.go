// Package fleet holds what the controller keeps about the whole fleet of
// BMCs: StoreDrivers, the cache of BMC drivers opened with the store's
// sealed credentials (one session per BMC, bounded), and the BMC sweep,
// which reads every BMC's power state and health rollup paced over an
// interval and records them in the store.
package fleet

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/ipmi"
	"github.com/machina-metal/machina/bmc/redfish"
	"github.com/machina-metal/machina/state"
)

// StoreDrivers opens BMC drivers with credentials from the store's secrets.
// One driver per server is cached (one Redfish session per BMC) and
// replaced when the server's BMC settings or the secret change. The cache
// is bounded: a driver unused for IdleTimeout is closed (its session logged
// out) at the next call, and past MaxDrivers the least recently used one
// is, so a controller of 10,000 servers holds neither 10,000 sessions on
// the BMCs (which allow only a few each) nor their clients in memory
// (see docs/performance.md). Safe for concurrent use; Close ends every
// session.
type StoreDrivers struct {
	Store  *state.Store
	Logger *slog.Logger
	// MaxDrivers bounds the cache; zero means 256 (more than the
	// reconciler's workers and open consoles together).
	MaxDrivers int
	// IdleTimeout closes drivers unused this long; zero means 5 minutes.
	IdleTimeout time.Duration
	// MinIPMICipherSuite is the site's weakest RMCP+ cipher suite for IPMI
	// BMCs (ipmi.Config.MinCipherSuite: 3 or 17); zero means 3. A server's
	// servers.yaml bmc.minCipherSuite overrides it.
	MinIPMICipherSuite uint8

	mu        sync.Mutex
	drivers   map[string]cachedDriver
	lastSweep time.Time
}

type cachedDriver struct {
	key  string
	drv  bmc.Driver
	used time.Time
}

// evictLocked removes the drivers idle past IdleTimeout (at most once a
// minute) and, while the cache holds MaxDrivers or more, the least recently
// used one; it returns them for closing outside the lock.
func (d *StoreDrivers) evictLocked(now time.Time) []bmc.Driver {
	limit, idle := d.MaxDrivers, d.IdleTimeout
	if limit <= 0 {
		limit = 256
	}
	if idle <= 0 {
		idle = 5 * time.Minute
	}
	var out []bmc.Driver
	if now.Sub(d.lastSweep) >= time.Minute {
		d.lastSweep = now
		for name, c := range d.drivers {
			if now.Sub(c.used) >= idle {
				out = append(out, c.drv)
				delete(d.drivers, name)
			}
		}
	}
	for len(d.drivers) >= limit {
		oldest, at := "", now
		for name, c := range d.drivers {
			if !c.used.After(at) {
				oldest, at = name, c.used
			}
		}
		out = append(out, d.drivers[oldest].drv)
		delete(d.drivers, oldest)
	}
	return out
}

// closeAll logs the evicted drivers out in the background, bounded by a
// timeout: a BMC that does not answer must not hold up the caller.
func closeAll(drvs []bmc.Driver) {
	if len(drvs) == 0 {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, drv := range drvs {
			_ = drv.Close(ctx)
		}
	}()
}

// Driver implements reconciler.Drivers.
// A server without a BMC (auto-enrolled, none attached yet) gets an error
// wrapping bmc.ErrUnsupported (the console answers 501, the UI shows it).
func (d *StoreDrivers) Driver(ctx context.Context, srv state.Server) (bmc.Driver, error) {
	if srv.BMC.Driver == "" {
		return nil, fmt.Errorf("server %s has no BMC (attach one with machinactl server bmc-set %s): %w", srv.Name, srv.Name, bmc.ErrUnsupported)
	}
	cred, err := d.Store.Secret(srv.BMC.Credentials)
	if errors.Is(err, state.ErrNotFound) {
		return nil, fmt.Errorf("credential %q is not in the secret store (machinactl secret set %s): %w", srv.BMC.Credentials, srv.BMC.Credentials, bmc.ErrAuth)
	}
	if err != nil {
		return nil, fmt.Errorf("read credential %q: %w", srv.BMC.Credentials, err)
	}
	// The cache key changes with the BMC settings and with the secret (its
	// hash, kept in memory only), so a rotated password opens a new session.
	var pool *x509.CertPool
	var caPEM string
	if srv.BMC.CABundle != "" {
		ca, err := d.Store.Secret(srv.BMC.CABundle)
		if errors.Is(err, state.ErrNotFound) {
			return nil, fmt.Errorf("CA bundle %q is not in the secret store (machinactl secret set %s with the PEM): %w", srv.BMC.CABundle, srv.BMC.CABundle, redfish.ErrTLS)
		}
		if err != nil {
			return nil, fmt.Errorf("read CA bundle %q: %w", srv.BMC.CABundle, err)
		}
		caPEM = CABundlePEM(ca)
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(caPEM)) {
			return nil, fmt.Errorf("CA bundle %q holds no PEM certificate: %w", srv.BMC.CABundle, redfish.ErrTLS)
		}
	}
	sum := sha256.Sum256([]byte(cred.Username + "\x00" + cred.Password + "\x00" + caPEM))
	minSuite := d.MinIPMICipherSuite
	if srv.BMC.MinCipherSuite != 0 {
		minSuite = srv.BMC.MinCipherSuite
	}
	key := fmt.Sprintf("%s|%s|%s|%v|%s|%s|%s|%d|%x", srv.BMC.Driver, srv.BMC.Address, srv.BMC.SystemID, srv.BMC.InsecureTLS, srv.BMC.Auth, srv.BMC.CABundle, srv.BMC.Credentials, minSuite, sum[:8])
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.drivers == nil {
		d.drivers = map[string]cachedDriver{}
	}
	now := time.Now()
	if c, ok := d.drivers[srv.Name]; ok {
		if c.key == key {
			c.used = now
			d.drivers[srv.Name] = c
			return c.drv, nil
		}
		_ = c.drv.Close(ctx)
		delete(d.drivers, srv.Name)
	}
	closeAll(d.evictLocked(now))
	log := d.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("machine", srv.Name) // the drivers add "bmc" themselves
	var drv bmc.Driver
	switch srv.BMC.Driver {
	case "redfish":
		drv, err = redfish.New(redfish.Config{Endpoint: srv.BMC.Address, SystemID: srv.BMC.SystemID, Insecure: srv.BMC.InsecureTLS,
			Auth: srv.BMC.Auth, RootCAs: pool,
			Username: cred.Username, Password: cred.Password, Logger: log})
	case "ipmi":
		drv, err = ipmi.New(ipmi.Config{Address: srv.BMC.Address, Username: cred.Username, Password: cred.Password, MinCipherSuite: minSuite, Logger: log})
	default:
		return nil, fmt.Errorf("unknown BMC driver %q: %w", srv.BMC.Driver, bmc.ErrUnsupported)
	}
	if err != nil {
		return nil, err
	}
	d.drivers[srv.Name] = cachedDriver{key: key, drv: drv, used: now}
	return drv, nil
}

// Close ends every cached driver's session, at most 32 at a time, and
// returns when all have returned or ctx is done, whichever is first: an
// IPMI Close Session waits for the BMC's answer with the library's
// retries, and one silent BMC after another must not hold a stopping
// controller for seconds each (seen: 12 s for four ipmi_sim sessions).
func (d *StoreDrivers) Close(ctx context.Context) {
	d.mu.Lock()
	drvs := make([]bmc.Driver, 0, len(d.drivers))
	for name, c := range d.drivers {
		drvs = append(drvs, c.drv)
		delete(d.drivers, name)
	}
	d.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 32)
		for _, drv := range drvs {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				_ = drv.Close(ctx)
			})
		}
		wg.Wait()
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// CABundlePEM returns the PEM text of a CA-bundle secret (servers.yaml
// bmc.caBundle): its "pem" extra field when set, else its password field,
// so `machinactl secret set NAME` with the PEM as the secret value works.
func CABundlePEM(c state.Credential) string {
	if p := c.Extra["pem"]; p != "" {
		return p
	}
	return c.Password
}
