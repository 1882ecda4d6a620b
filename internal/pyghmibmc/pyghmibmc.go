// Package pyghmibmc runs a test BMC on pyghmi's pyghmi.ipmi.bmc.Bmc class
// (Debian python3-pyghmi), the class VirtualBMC builds on: a third-party
// IPMI v2.0 / RMCP+ peer for the bmc/ipmi driver's tests. The BMC process
// itself is internal/pyghmibmc/bmcproc (see there for the pyghmi and
// VirtualBMC behaviour it has and its power backends); this package adds
// the test helpers Start and Require and aliases bmcproc's names.
// Test helper: no product package imports it.
package pyghmibmc

import (
	"testing"

	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/internal/pyghmibmc/bmcproc"
)

// Python and Module: see bmcproc.
const (
	Python = bmcproc.Python
	Module = bmcproc.Module
)

// Config and BMC: see bmcproc.
type (
	Config = bmcproc.Config
	BMC    = bmcproc.BMC
)

// Launch starts a BMC: see bmcproc.Launch.
func Launch(cfg Config) (*BMC, error) { return bmcproc.Launch(cfg) }

// Require ends t (fail, or skip in the quick mode) when Debian's python3
// or python3-pyghmi is missing.
func Require(t testing.TB) {
	t.Helper()
	peertest.File(t, Python, "python3")
	peertest.File(t, Module, "python3-pyghmi")
}

// Start launches a test BMC for t in a fresh directory (cfg.Dir is
// replaced), stopped by its PID when t ends. Power starts off.
func Start(t testing.TB, cfg Config) *BMC {
	t.Helper()
	Require(t)
	cfg.Dir = t.TempDir()
	b, err := Launch(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}
