package controller

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/reconciler/fleet"
)

// TestIPMIMinCipherSuiteReachesDrivers: Config.IPMIMinCipherSuite
// (machina serve --ipmi-min-cipher-suite) is refused unless 0, 3 or 17,
// and reaches both driver caches (the reconciler's and the sweep's).
func TestIPMIMinCipherSuiteReachesDrivers(t *testing.T) {
	for _, bad := range []uint8{1, 2, 8} {
		w := &wiring{cfg: Config{IPMIMinCipherSuite: bad}, log: slog.New(slog.DiscardHandler)}
		if _, err := w.bmcDrivers(); err == nil || !strings.Contains(err.Error(), "want 3 or 17") {
			t.Errorf("minimum %d: bmcDrivers = %v, want an error", bad, err)
		}
	}
	w := &wiring{cfg: Config{IPMIMinCipherSuite: 17}, log: slog.New(slog.DiscardHandler)}
	if _, err := w.bmcDrivers(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []reconciler.Drivers{w.drivers, w.sweepDrivers} {
		sd, ok := d.(*fleet.StoreDrivers)
		if !ok || sd.MinIPMICipherSuite != 17 {
			t.Errorf("driver cache %T: no minimum 17", d)
		}
	}
}
