package sim

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/ipmi"
	"github.com/machina-metal/machina/bmc/redfish"
	"github.com/machina-metal/machina/internal/peertest"
)

// holdLab is a lab of one machine and no controller: its firmware waits
// (BootDelay of an hour), so the only power-off is the one a test asks
// for, as the machine's agent would (powerOffFrom).
func holdLab(t *testing.T, hold time.Duration) (*Lab, *Machine) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	ctx, cancel := context.WithCancel(context.Background())
	l := &Lab{cfg: Config{BootDelay: time.Hour, PowerOffHold: hold, Username: "admin", Password: "sim-password"}, ctx: ctx, cancel: cancel, log: log}
	dir := t.TempDir()
	m := &Machine{Name: "r9-n01", MAC: "52:54:00:00:09:01", lab: l, log: log, phase: PhaseOff,
		root: filepath.Join(dir, "machine", "root"), devDir: filepath.Join(dir, "machine", "dev")}
	t.Cleanup(l.Close)
	return l, m
}

// agentPowersOff plays the machine's agent reporting and powering the
// machine off at once after a power-on: it asks for the power-off of the
// running boot and returns once that took effect or is held (waiting for
// the BMC to read the machine on).
func agentPowersOff(t *testing.T, l *Lab, m *Machine) {
	t.Helper()
	m.mu.Lock()
	gen, on := m.gen, m.on
	m.mu.Unlock()
	if !on {
		t.Error("agentPowersOff: the machine is off")
		return
	}
	l.goRun(func() { m.powerOffFrom(l.ctx, gen) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		m.mu.Lock()
		done := m.offHeld || m.gen != gen
		m.mu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Error("agentPowersOff: the power-off neither took effect nor was held within 30 s")
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// selfOffPower is the machine as a bmcsim power backend whose agent powers
// it off right after a power-on, before the BMC answers the Reset: the
// BMC's first PowerState read after the On comes after that power-off.
type selfOffPower struct {
	*Machine
	t *testing.T
}

func (p selfOffPower) Reset(ctx context.Context, rt string) error {
	if err := p.Machine.Reset(ctx, rt); err != nil {
		return err
	}
	if rt == "On" || rt == "ForceOn" {
		agentPowersOff(p.t, p.lab, p.Machine)
	}
	return nil
}

// TestPowerOnSeenBeforeAgentPowersOff: a simulated machine whose agent
// reports and powers it off before the BMC's first read after a power-on
// (zero boot durations under load; seen in CI as a commission's power
// wait reading off until its 5-minute timeout, on the HPE iLO 5 tree that
// has neither LastResetTime nor BootProgress, and over IPMI, which has
// neither) is still seen on by the driver's power wait: the machine's
// own power-off waits until the BMC has read it on (Config.PowerOffHold).
// The power-on completes through the real Redfish driver (bmcsim over the
// iLO 5 tree) and the real IPMI driver (ipmi_sim, the machine following
// its chassis_control log), each with a 10 s PowerTimeout, and the
// machine is off afterwards. With the hold off the same Redfish power-on
// times out (the reproduction; checked for IPMI by hand: it timed out
// too).
func TestPowerOnSeenBeforeAgentPowersOff(t *testing.T) {
	t.Run("redfish iLO 5", func(t *testing.T) {
		err := redfishPowerOn(t, 0, 10*time.Second)
		if err != nil {
			t.Fatalf("power on = %v, want nil", err)
		}
	})
	t.Run("redfish iLO 5 without the hold", func(t *testing.T) {
		err := redfishPowerOn(t, -1, 2*time.Second)
		if !errors.Is(err, bmc.ErrTimeout) {
			t.Fatalf("power on = %v, want a timeout (the machine powered itself off before the BMC read it)", err)
		}
	})
	t.Run("ipmi", func(t *testing.T) {
		if !IPMIAvailable() {
			peertest.Missing(t, IPMIMissing, "the Debian package openipmi")
		}
		l, m := holdLab(t, 0)
		addr, err := l.startIPMI(m)
		if err != nil {
			t.Fatal(err)
		}
		calls := filepath.Join(l.ipmiSims[0].Dir, "calls.log")
		proxy := holdingProxy(t, addr, func() bool {
			b, _ := os.ReadFile(calls)
			return strings.Contains(string(b), "set power 1")
		}, func() { waitOn(t, m); agentPowersOff(t, l, m) })
		drv, err := ipmi.New(ipmi.Config{Address: proxy, Username: "admin", Password: "sim-password", CipherSuites: []uint8{3},
			PowerTimeout: 10 * time.Second, Timeout: 2 * time.Second, PollInterval: 100 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		defer drv.Close(ctx)
		if err := drv.Power(ctx, bmc.PowerActionOn); err != nil {
			t.Fatalf("power on = %v, want nil", err)
		}
		waitOff(t, m)
	})
}

// redfishPowerOn powers a machine on through the Redfish driver, its BMC
// a bmcsim over the HPE iLO 5 tree (no LastResetTime, no BootProgress),
// its agent powering it off before the BMC answers the Reset; with a
// hold, it checks that the machine is off afterwards.
func redfishPowerOn(t *testing.T, hold, timeout time.Duration) error {
	t.Helper()
	_, m := holdLab(t, hold)
	dir, err := bmcsim.TreeDir("", "hpe-proliant-dl385gen10plusv2-ilo5")
	if err != nil {
		t.Fatal(err)
	}
	tr, err := bmcsim.LoadTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "admin", Password: "sim-password", Power: selfOffPower{Machine: m, t: t}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim)
	defer ts.Close()
	drv, err := redfish.New(redfish.Config{Endpoint: ts.URL, Username: "admin", Password: "sim-password",
		PowerTimeout: timeout, PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer drv.Close(ctx)
	err = drv.Power(ctx, bmc.PowerActionOn)
	if err == nil {
		waitOff(t, m)
	}
	return err
}

// waitOn waits until the machine is on (it follows ipmi_sim's log).
func waitOn(t *testing.T, m *Machine) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for m.Phase() == PhaseOff {
		if time.Now().After(deadline) {
			t.Error("the machine did not power on within 30 s of the BMC's power-on")
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitOff waits until the machine's own power-off took effect.
func waitOff(t *testing.T, m *Machine) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for m.Phase() != PhaseOff {
		if time.Now().After(deadline) {
			t.Fatalf("the machine is %s 30 s after the power-on, want off (its agent powered it off)", m.Phase())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// holdingProxy relays IPMI datagrams between a client and the BMC at
// backend on 127.0.0.1. Once after(), checked per datagram, first holds,
// the datagram that finds it so waits for then() to return before it is
// relayed (and every later one goes at once): the BMC's first read after
// a power-on arrives after what then() did.
func holdingProxy(t *testing.T, backend string, after func() bool, then func()) string {
	t.Helper()
	baddr, err := net.ResolveUDPAddr("udp4", backend)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	up, err := net.DialUDP("udp4", nil, baddr)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		client *net.UDPAddr
		wg     sync.WaitGroup
		once   sync.Once
	)
	wg.Add(2)
	go func() { // client → BMC
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			n, from, err := ln.ReadFromUDP(buf)
			if err != nil {
				return
			}
			mu.Lock()
			client = from
			mu.Unlock()
			if after() {
				once.Do(then)
			}
			if _, err := up.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	go func() { // BMC → client
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			n, err := up.Read(buf)
			if err != nil {
				return
			}
			mu.Lock()
			c := client
			mu.Unlock()
			if c != nil {
				_, _ = ln.WriteToUDP(buf[:n], c)
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		up.Close()
		wg.Wait()
	})
	return ln.LocalAddr().String()
}
