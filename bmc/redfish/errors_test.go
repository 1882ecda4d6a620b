package redfish_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
)

// A refused PATCH names the BMC, the request and the HTTP status, and the
// operation only once.
func TestErrorNamesBMCRequestStatus(t *testing.T) {
	l := newLab(t, treeDMTF, labOpts{on: true, quirks: &bmcsim.Quirks{RejectBootModeInPatch: true}})
	err := l.drv.SetBootOverride(context.Background(), bmc.BootOverride{Device: bmc.BootPXE, Mode: bmc.BootModeLegacy})
	if err == nil {
		t.Fatal("PATCH refused with 400, yet no error")
	}
	msg := err.Error()
	for _, want := range []string{l.url, "PATCH /redfish/v1/Systems/437XR1138R2", "HTTP 400"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not name %q", msg, want)
		}
	}
	if n := strings.Count(msg, "set boot override"); n != 1 {
		t.Errorf("error %q names the operation %d times, want once", msg, n)
	}
}

// The timeout text names the limit that fired: the caller's deadline when
// it is shorter than Config.PowerTimeout (it said "after 5m0s" for a 40 s
// --timeout before the BMC session rework).
func TestTimeoutNamesTheLimitThatFired(t *testing.T) {
	stuck := &bmcsim.MemoryPower{Lag: 1 << 30} // never settles
	stuck.Set(true)
	l := newLab(t, treeOpenBMC, labOpts{on: true, backend: stuck, tune: func(c *redfish.Config) { c.PowerTimeout = 5 * time.Minute }})
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	err := l.drv.Power(ctx, bmc.PowerActionOff)
	if !errors.Is(err, bmc.ErrTimeout) {
		t.Fatalf("Power(off) = %v, want ErrTimeout", err)
	}
	if strings.Contains(err.Error(), "5m0s") || !strings.Contains(err.Error(), "caller's deadline") || !strings.Contains(err.Error(), "still on after") {
		t.Errorf("timeout error %q: want 'still on after <the caller's deadline>', not the 5m power timeout", err)
	}
}

// An error without an HTTP answer names the BMC too, once.
func TestErrorWithoutStatusNamesBMC(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, multiSystemTree(1, true))
	tr, err := bmcsim.LoadTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	l := newLab(t, "", labOpts{tree: tr})
	err = l.drv.SetBootOverride(context.Background(), bmc.BootOverride{Device: bmc.BootPXE})
	if !errors.Is(err, bmc.ErrUnsupported) || strings.Count(err.Error(), l.url) != 1 || !strings.HasPrefix(err.Error(), "redfish "+l.url+": ") {
		t.Fatalf("err = %v, want ErrUnsupported naming %s once", err, l.url)
	}
}
