package controller

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// powerDriver is a bmc.Driver that reports a fixed power state (the host
// watch's timing test; the loopback and simulated-lab tests use bmcsim and
// ipmi_sim).
type powerDriver struct {
	bmc.Driver
	p bmc.PowerState
}

func (d powerDriver) PowerState(context.Context) (bmc.PowerState, error) { return d.p, nil }

type powerDrivers struct{ p bmc.PowerState }

func (d powerDrivers) Driver(context.Context, state.Server) (bmc.Driver, error) {
	return powerDriver{p: d.p}, nil
}

// TestHostWatchLostWithinWindow: in a synctest bubble with a 1s heartbeat,
// a host silent for less than the 3s window stays found; past it, it is
// lost within one tick, its server's power is read from the BMC and
// recorded ("lost, powered on"), and one heartbeat clears it.
func TestHostWatchLostWithinWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if _, err := st.CreateServer(state.Server{Name: "s1", BootMAC: "52:54:00:00:00:01", BMC: state.BMCFacts{Driver: "ipmi", Address: "x", Credentials: "c"}}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := st.PutHost(state.Host{Name: "h1", Server: "s1", CertFingerprint: "ab", JoinStatus: "joined", LastSeen: start}); err != nil {
			t.Fatal(err)
		}
		log := slog.New(slog.NewTextHandler(t.Output(), nil))
		w := newHostWatch(st, powerDrivers{p: bmc.PowerOn}, &fencer{}, func() *inventory.Inventory { return nil },
			hostWatchConfig{heartbeat: time.Second}, log)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { w.run(ctx); close(done) }()

		time.Sleep(2900 * time.Millisecond)
		synctest.Wait()
		if h, _ := st.Host("h1"); h.Lost != nil {
			t.Fatalf("lost after %s of silence, before the 3s window", time.Since(start))
		}
		time.Sleep(600 * time.Millisecond) // one tick (500ms) past the window
		synctest.Wait()
		h, _ := st.Host("h1")
		if h.Lost == nil {
			t.Fatalf("not lost %s after the last heartbeat (window 3s, tick 500ms)", time.Since(start))
		}
		if got := h.Lost.Describe(); got != "lost, powered on" {
			t.Errorf("lost host: %q, want \"lost, powered on\"", got)
		}
		evs, _ := st.Events(state.EventQuery{})
		var kinds []string
		for _, e := range evs {
			kinds = append(kinds, string(e.Kind))
		}
		if k := strings.Join(kinds, " "); !strings.Contains(k, "host.lost host.lost_power") {
			t.Errorf("events %s: want host.lost then host.lost_power", k)
		}
		if res, err := st.RecordHeartbeat("h1", time.Now(), state.Heartbeat{Uptime: time.Hour}); err != nil || !res.Returned {
			t.Fatalf("heartbeat = %+v, %v; want Returned", res, err)
		}
		time.Sleep(600 * time.Millisecond)
		synctest.Wait()
		if h, _ := st.Host("h1"); h.Lost != nil {
			t.Errorf("still lost after a heartbeat: %+v", h.Lost)
		}
		cancel()
		<-done
	})
}

// TestHeartbeatTellsRebootFromAgentRestart: the same boot time with a new
// agent start is an agent restart (with the version change); a later boot
// time is a reboot; steady heartbeats are neither.
func TestHeartbeatTellsRebootFromAgentRestart(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.PutHost(state.Host{Name: "h1"}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	beat := func(at time.Duration, up, agent time.Duration, ver string) state.HeartbeatResult {
		t.Helper()
		res, err := st.RecordHeartbeat("h1", t0.Add(at), state.Heartbeat{Uptime: up, AgentUptime: agent, AgentVersion: ver})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if r := beat(0, time.Hour, time.Minute, "v1"); r.Rebooted || r.AgentRestarted {
		t.Errorf("first heartbeat: %+v", r)
	}
	if r := beat(30*time.Second, time.Hour+30*time.Second, time.Minute+30*time.Second, "v1"); r.Rebooted || r.AgentRestarted {
		t.Errorf("steady heartbeat: %+v", r)
	}
	if r := beat(60*time.Second, time.Hour+60*time.Second, 2*time.Second, "v2"); r.Rebooted || !r.AgentRestarted || r.OldVersion != "v1" {
		t.Errorf("agent restart with upgrade: %+v, want AgentRestarted from v1", r)
	}
	// A restart a moment after the last one: the uptimes do not tell, the
	// reported process start does.
	res, err := st.RecordHeartbeat("h1", t0.Add(61*time.Second), state.Heartbeat{Uptime: time.Hour + 61*time.Second, AgentUptime: 3 * time.Second,
		AgentStarted: t0.Add(58 * time.Second), AgentVersion: "v2"})
	if err != nil || res.AgentRestarted {
		t.Fatalf("first heartbeat naming its process start: %+v, %v; want no restart (nothing to compare)", res, err)
	}
	res, err = st.RecordHeartbeat("h1", t0.Add(62*time.Second), state.Heartbeat{Uptime: time.Hour + 62*time.Second, AgentUptime: 3 * time.Second,
		AgentStarted: t0.Add(59 * time.Second), AgentVersion: "v2"})
	if err != nil || !res.AgentRestarted || res.Rebooted {
		t.Fatalf("a new process start one second later: %+v, %v; want an agent restart", res, err)
	}
	if r := beat(5*time.Minute, 40*time.Second, 20*time.Second, "v2"); !r.Rebooted || r.AgentRestarted {
		t.Errorf("reboot: %+v, want Rebooted only", r)
	}
	evs, _ := st.Events(state.EventQuery{})
	var msgs []string
	for _, e := range evs {
		msgs = append(msgs, string(e.Kind)+": "+e.Message)
	}
	all := strings.Join(msgs, "\n")
	if !strings.Contains(all, "host.agent_restarted: host h1: node agent restarted on the same boot") || !strings.Contains(all, "version v1 → v2") ||
		!strings.Contains(all, "host.rebooted: host h1 rebooted") {
		t.Errorf("events:\n%s", all)
	}
}

// TestDecideAutoFence: auto-fence takes lost hosts of fence: auto profiles
// past the second window, never more than the brake's share of hosts, and
// none while more than that share is lost at once (a network split).
func TestDecideAutoFence(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	mk := func(n, lost int, fenced int) []state.Host {
		var hs []state.Host
		for i := range n {
			h := state.Host{Name: string(rune('a' + i))}
			if i < lost {
				h.Lost = &state.HostLoss{Since: now.Add(-10 * time.Minute)}
			}
			if i >= n-fenced {
				h.Fenced = &state.Fencing{}
				h.Lost = &state.HostLoss{Since: now.Add(-time.Hour)}
			}
			hs = append(hs, h)
		}
		return hs
	}
	all := func(state.Host) bool { return true }
	for _, tc := range []struct {
		name      string
		hosts     []state.Host
		auto      func(state.Host) bool
		fence     int
		heldMatch string
	}{
		{"one of ten lost", mk(10, 1, 0), all, 1, ""},
		{"split: half lost", mk(10, 5, 0), all, 0, "5 of 10 hosts are lost (50%), more than the safety brake's 20%"},
		{"two lost of ten: at the share", mk(10, 2, 0), all, 2, ""},
		{"share used by fences", mk(10, 1, 2), all, 0, "2 of 10 hosts are fenced already"},
		{"not auto", mk(10, 1, 0), func(state.Host) bool { return false }, 0, ""},
		{"second window not over", func() []state.Host { h := mk(10, 1, 0); h[0].Lost.Since = now.Add(-time.Minute); return h }(), all, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decideAutoFence(tc.hosts, tc.auto, now, 5*time.Minute, 0.2)
			if len(d.fence) != tc.fence || (tc.heldMatch == "") != (d.held == "") || !strings.Contains(d.held, tc.heldMatch) {
				t.Errorf("decideAutoFence = %+v; want %d fenced, held %q", d, tc.fence, tc.heldMatch)
			}
		})
	}
}
