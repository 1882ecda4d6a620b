package controller

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/ipmi"
	"github.com/machina-metal/machina/bmc/redfish"
	"github.com/machina-metal/machina/state"
)

// StoreDrivers opens BMC drivers with credentials from the store's secrets.
// One driver per server is cached (one Redfish session per BMC) and
// replaced when the server's BMC settings or the secret change. Safe for
// concurrent use; Close ends every session.
type StoreDrivers struct {
	Store  *state.Store
	Logger *slog.Logger

	mu      sync.Mutex
	drivers map[string]cachedDriver
}

type cachedDriver struct {
	key string
	drv bmc.Driver
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
	sum := sha256.Sum256([]byte(cred.Username + "\x00" + cred.Password))
	key := fmt.Sprintf("%s|%s|%s|%v|%s|%x", srv.BMC.Driver, srv.BMC.Address, srv.BMC.SystemID, srv.BMC.InsecureTLS, srv.BMC.Credentials, sum[:8])
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.drivers == nil {
		d.drivers = map[string]cachedDriver{}
	}
	if c, ok := d.drivers[srv.Name]; ok {
		if c.key == key {
			return c.drv, nil
		}
		_ = c.drv.Close(ctx)
		delete(d.drivers, srv.Name)
	}
	log := d.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("machine", srv.Name) // the drivers add "bmc" themselves
	var drv bmc.Driver
	switch srv.BMC.Driver {
	case "redfish":
		drv, err = redfish.New(redfish.Config{Endpoint: srv.BMC.Address, SystemID: srv.BMC.SystemID, Insecure: srv.BMC.InsecureTLS,
			Username: cred.Username, Password: cred.Password, Logger: log})
	case "ipmi":
		drv, err = ipmi.New(ipmi.Config{Address: srv.BMC.Address, Username: cred.Username, Password: cred.Password, Logger: log})
	default:
		return nil, fmt.Errorf("unknown BMC driver %q: %w", srv.BMC.Driver, bmc.ErrUnsupported)
	}
	if err != nil {
		return nil, err
	}
	d.drivers[srv.Name] = cachedDriver{key: key, drv: drv}
	return drv, nil
}

// Close ends every cached driver's session.
func (d *StoreDrivers) Close(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, c := range d.drivers {
		_ = c.drv.Close(ctx)
		delete(d.drivers, name)
	}
}
