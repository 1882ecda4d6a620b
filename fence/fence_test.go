package fence_test

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/ipmi/ipmisim/ipmisimtest"
	"github.com/machina-metal/machina/bmc/redfish"
	"github.com/machina-metal/machina/fence"
)

// ipmiSimPassword is the ipmi_sim account used here (ipmisim.Start's
// solop, an administrator): distinctive enough to find in /proc.
const ipmiSimUser, ipmiSimPassword = "solop", "S3cret-SOL-pw"

// scanCmdlines reads every /proc/PID/cmdline until stop is closed,
// counting the ipmitool processes that talk to port and returning any
// command line holding secret.
func scanCmdlines(t *testing.T, port int, secret string, stop <-chan struct{}) (seen *atomic.Int64, leaks func() []string) {
	t.Helper()
	seen = &atomic.Int64{}
	var mu sync.Mutex
	var leaked []string
	done := make(chan struct{})
	portArg := []byte("\x00-p\x00" + strconv.Itoa(port) + "\x00")
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
			for _, p := range paths {
				b, err := os.ReadFile(p)
				if err != nil || len(b) == 0 {
					continue
				}
				if bytes.Contains(b, []byte("ipmitool")) && bytes.Contains(b, portArg) {
					seen.Add(1)
				}
				if bytes.Contains(b, []byte(secret)) {
					mu.Lock()
					leaked = append(leaked, p+": "+strings.ReplaceAll(string(b), "\x00", " "))
					mu.Unlock()
				}
			}
		}
	}()
	return seen, func() []string { <-done; mu.Lock(); defer mu.Unlock(); return leaked }
}

// TestFenceThroughIPMIToolDevice: an IPMI fencing device (OpenIPMI's
// ipmi_sim on loopback) is powered off by ipmitool and read back off; the
// password is never in any process's command line while ipmitool runs
// (/proc scanned throughout, and ipmitool seen running at least once).
func TestFenceThroughIPMIToolDevice(t *testing.T) {
	sim := ipmisimtest.Start(t)
	sim.Ipmitool("chassis", "power", "on")
	if out := sim.Ipmitool("chassis", "power", "status"); !strings.Contains(out, "is on") {
		t.Fatalf("ipmi_sim power status = %q, want on", out)
	}
	dev := &fence.IPMITool{Address: sim.Addr(), Username: ipmiSimUser, Password: ipmiSimPassword}
	stop := make(chan struct{})
	seen, leaks := scanCmdlines(t, sim.Port, ipmiSimPassword, stop)
	err := fence.Fence(context.Background(), dev, fence.Options{Timeout: 30 * time.Second, Poll: 100 * time.Millisecond})
	close(stop)
	if err != nil {
		t.Fatalf("Fence = %v, want nil", err)
	}
	if l := leaks(); len(l) > 0 {
		t.Errorf("the fencing password is in a command line: %v", l)
	}
	if seen.Load() == 0 {
		t.Errorf("the /proc scan never saw ipmitool running: the scan proves nothing")
	}
	if out := sim.Ipmitool("chassis", "power", "status"); !strings.Contains(out, "is off") {
		t.Errorf("after Fence, ipmi_sim power status = %q, want off", out)
	}
	var off bool
	for _, c := range sim.SetCalls() {
		off = off || strings.Contains(c, "power 0")
	}
	if !off {
		t.Errorf("ipmi_sim chassis calls %v: no power off reached the chassis", sim.SetCalls())
	}
	t.Logf("ipmitool seen in %d /proc scans", seen.Load())
}

// TestFenceIPMIToolRefusals: a device that acknowledges the power off and
// does nothing (ipmi_sim's stuck chassis) fails with ErrNotOff; a wrong
// password fails as bmc.ErrAuth without the password in the error.
func TestFenceIPMIToolRefusals(t *testing.T) {
	sim := ipmisimtest.Start(t)
	sim.Ipmitool("chassis", "power", "on")
	if err := os.WriteFile(filepath.Join(sim.Dir, "stuck"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dev := &fence.IPMITool{Address: sim.Addr(), Username: ipmiSimUser, Password: ipmiSimPassword}
	err := fence.Fence(context.Background(), dev, fence.Options{Timeout: 3 * time.Second, Poll: 200 * time.Millisecond})
	if !errors.Is(err, fence.ErrNotOff) || !strings.Contains(err.Error(), "last read on") {
		t.Fatalf("Fence on a stuck chassis = %v, want ErrNotOff naming the last read (on)", err)
	}
	bad := &fence.IPMITool{Address: sim.Addr(), Username: ipmiSimUser, Password: "wrong-pw-123", Timeout: 10 * time.Second}
	if _, err := bad.PowerState(context.Background()); err == nil || strings.Contains(err.Error(), "wrong-pw-123") {
		t.Fatalf("PowerState with a wrong password = %v, want an error without the password", err)
	}
}

// TestFenceThroughRedfishBMC: the server's own Redfish BMC (bmcsim over a
// real vendor tree) is powered off with ForceOff and read back off.
func TestFenceThroughRedfishBMC(t *testing.T) {
	var trees bmcsim.Trees
	dir, err := bmcsim.TreeDir("", "dell-poweredge-r750-idrac9")
	if err != nil {
		t.Fatal(err)
	}
	power := bmcsim.NewMemoryPower(true)
	sim, err := trees.New(dir, bmcsim.Config{Username: "root", Password: "calvin", Power: power})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(sim)
	defer ts.Close()
	drv, err := redfish.New(redfish.Config{Endpoint: ts.URL, Insecure: true, Username: "root", Password: "calvin"})
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Close(context.Background())
	if err := fence.Fence(context.Background(), fence.BMC{Driver: drv}, fence.Options{Timeout: 30 * time.Second, Poll: 50 * time.Millisecond}); err != nil {
		t.Fatalf("Fence = %v", err)
	}
	if power.On() {
		t.Fatal("the simulated server is still on after Fence")
	}
	forceOff := false
	for _, r := range sim.Requests() {
		forceOff = forceOff || (r.Method == "POST" && strings.Contains(r.String(), "ForceOff"))
	}
	if !forceOff {
		t.Errorf("no Redfish ForceOff reached the BMC: %v", sim.Requests())
	}
	p, err := drv.PowerState(context.Background())
	if err != nil || p != bmc.PowerOff {
		t.Errorf("PowerState after Fence = %v, %v; want off", p, err)
	}
}
