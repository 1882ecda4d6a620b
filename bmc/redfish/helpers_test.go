package redfish_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
)

// trees shares parsed fixture trees across tests, as the simulated lab will.
var trees bmcsim.Trees

// Tree folder names (fixtures/redfish/<name>).
const (
	treeDMTF       = "dmtf-public-rackmount1"
	treeDell       = "dell-poweredge-r750-idrac9"
	treeHPE        = "hpe-proliant-dl385gen10plusv2-ilo5"
	treeLenovo     = "lenovo-thinksystem-sr670v2-xcc"
	treeSupermicro = "supermicro-sys821ge-tnhr-x13"
	treeOpenBMC    = "openbmc-bmcweb-stock"
)

var allTrees = []string{treeDMTF, treeDell, treeHPE, treeLenovo, treeSupermicro, treeOpenBMC}

// lab is one emulator on a loopback listener with a driver pointed at it.
type lab struct {
	sim   *bmcsim.Server
	power *bmcsim.MemoryPower
	url   string
	drv   *redfish.Driver
}

type labOpts struct {
	on       bool
	quirks   *bmcsim.Quirks
	lockout  int
	password string // driver's password; "" means the right one
	tune     func(*redfish.Config)
	tree     *bmcsim.Tree
	backend  bmcsim.PowerBackend // replaces the MemoryPower when set
}

// newLabPower is newLab over tr with quirks q and power backend p.
func newLabPower(t *testing.T, tr *bmcsim.Tree, q bmcsim.Quirks, p bmcsim.PowerBackend) *lab {
	t.Helper()
	return newLab(t, "", labOpts{on: true, tree: tr, quirks: &q, backend: p})
}

func loadTree(t *testing.T, name string) *bmcsim.Tree {
	t.Helper()
	dir, err := bmcsim.TreeDir("", name)
	if err != nil {
		t.Fatalf("TreeDir(%q): %v (run scripts/sync-fixtures.sh)", name, err)
	}
	tr, err := trees.Load(dir)
	if err != nil {
		t.Fatalf("Load(%s): %v", dir, err)
	}
	return tr
}

func newLab(t *testing.T, tree string, o labOpts) *lab {
	t.Helper()
	tr := o.tree
	if tr == nil {
		tr = loadTree(t, tree)
	}
	pw := bmcsim.NewMemoryPower(o.on)
	var backend bmcsim.PowerBackend = pw
	if o.backend != nil {
		backend = o.backend
	}
	sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "admin", Password: "s3cret", Quirks: o.quirks, Power: backend, LockoutThreshold: o.lockout})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim)
	t.Cleanup(ts.Close)
	cfg := redfish.Config{
		Endpoint: ts.URL, Username: "admin", Password: "s3cret",
		PollInterval: time.Millisecond, RetryBase: time.Millisecond,
		PowerTimeout: 5 * time.Second, SoftOffTimeout: 50 * time.Millisecond,
		Timeout: 5 * time.Second, TaskTimeout: 5 * time.Second, ResetEvidenceTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if o.password != "" {
		cfg.Password = o.password
	}
	if o.tune != nil {
		o.tune(&cfg)
	}
	drv, err := redfish.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l := &lab{sim: sim, power: pw, url: ts.URL, drv: drv}
	t.Cleanup(func() { _ = drv.Close(context.Background()) })
	return l
}

// writes returns the recorded non-GET requests other than session logins
// and logouts, as "METHOD /path {json}" strings.
func (l *lab) writes() []string {
	var out []string
	for _, r := range l.sim.Requests() {
		if r.Method == http.MethodGet || r.Method == http.MethodHead || strings.Contains(strings.ToLower(r.Path), "/sessionservice/sessions") {
			continue
		}
		s := r.String()
		if r.IfMatch != "" {
			s += " If-Match"
		}
		out = append(out, s)
	}
	return out
}

// simLab is an emulator on loopback for tests that make several drivers.
type simLab struct {
	sim *bmcsim.Server
	url string
}

func newLabWith(t *testing.T, sim *bmcsim.Server) *simLab {
	t.Helper()
	ts := httptest.NewServer(sim)
	t.Cleanup(ts.Close)
	return &simLab{sim: sim, url: ts.URL}
}

func (l *simLab) driver(t *testing.T, password string) *redfish.Driver {
	t.Helper()
	return l.driverWith(t, password, "")
}

// driverWith is driver with Config.Auth set to auth.
func (l *simLab) driverWith(t *testing.T, password, auth string) *redfish.Driver {
	t.Helper()
	drv, err := redfish.New(redfish.Config{Endpoint: l.url, Username: "admin", Password: password, Auth: auth,
		PollInterval: time.Millisecond, RetryBase: time.Millisecond, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drv.Close(context.Background()) })
	return drv
}
