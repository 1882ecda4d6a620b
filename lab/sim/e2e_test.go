package sim_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-git/go-git/v5"

	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/lab/sim/simtest"
	"github.com/machina-metal/machina/state"
)

// harness is the simulated lab with a controller running in-process.
type harness struct {
	t   *testing.T
	lab *sim.Lab
	run *controller.Running
}

func startHarness(t *testing.T, cfg sim.Config) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	cfg.Dir = filepath.Join(dir, "lab")
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg.Logger = log.With("lab", "sim")
	lab, err := sim.Start(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	requireIPMIPeers(t, lab, cancel)
	h := &harness{t: t, lab: lab}
	ccfg := simtest.Config(dir, lab, log.With("lab", "controller"))
	ccfg.JoinListen = "127.0.0.1:0"
	ccfg.OnReady = func(r *controller.Running) {
		if err := simtest.PutLabSecrets(r.Store, lab); err != nil {
			t.Error(err)
		}
		lab.SetController(r.URL)
	}
	c, err := simtest.Start(ccfg)
	if err != nil {
		cancel()
		lab.Close()
		t.Fatal(err)
	}
	h.run = c.Run
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("controller: %v", err)
		}
		cancel()
		lab.Close()
	})
	return h
}

// requireIPMIPeers ends t naming the Debian package openipmi when the lab's
// IPMI servers fell back to Redfish because ipmi_sim is missing (tests that
// want Redfish everywhere set RedfishOnly, which is not a fallback for want
// of a peer). It closes lab and calls stop first.
func requireIPMIPeers(t *testing.T, lab *sim.Lab, stop func()) {
	t.Helper()
	var names []string
	for name, why := range lab.RedfishFallbacks() {
		if why == sim.IPMIMissing {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return
	}
	sort.Strings(names)
	stop()
	lab.Close()
	peertest.Missing(t, fmt.Sprintf("ipmi_sim not in PATH: the example's IPMI servers (%s) would run Redfish BMCs", strings.Join(names, ", ")), "the Debian packages openipmi and ipmitool")
}

// waitFor polls cond until it holds or the deadline passes.
func (h *harness) waitFor(what string, d time.Duration, cond func(state.Snapshot) bool) state.Snapshot {
	h.t.Helper()
	deadline := time.Now().Add(d)
	for {
		snap, err := h.run.Store.Snapshot()
		if err != nil {
			h.t.Fatal(err)
		}
		if cond(snap) {
			return snap
		}
		if time.Now().After(deadline) {
			var lines []string
			for name, s := range snap.Servers {
				inflight := ""
				if s.InFlight != nil {
					inflight = " inflight=" + s.InFlight.Action
				}
				lines = append(lines, fmt.Sprintf("%s=%s(%s%s)", name, s.Lifecycle, s.LastError, inflight))
			}
			h.t.Fatalf("timed out after %s waiting for %s; servers: %s\nplan:\n%s", d, what, strings.Join(lines, " "), h.run.Reconciler.LastPlan().Text())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func count(snap state.Snapshot, lc state.Lifecycle) int {
	n := 0
	for _, s := range snap.Servers {
		if s.Lifecycle == lc {
			n++
		}
	}
	return n
}

// TestExampleSiteEndToEnd: the example site goes new → commissioning →
// ready, the profiles' counts are deployed through the real agent with
// verify-before-write, and status commits record it.
func TestExampleSiteEndToEnd(t *testing.T) {
	h := startHarness(t, sim.Config{})
	// 11 servers commission (r3-n03 is retired in the example).
	h.waitFor("11 servers ready or deployed", 3*time.Minute, func(s state.Snapshot) bool {
		return count(s, state.LifecycleReady)+count(s, state.LifecycleAllocated)+count(s, state.LifecycleDeploying)+count(s, state.LifecycleDeployed) == 11
	})
	// hypervisor count 2 (zone-a) and storage count 1 (zone-b) deploy.
	snap := h.waitFor("3 servers deployed", 3*time.Minute, func(s state.Snapshot) bool {
		n := 0
		for _, srv := range s.Servers {
			if srv.Lifecycle == state.LifecycleDeployed && !srv.FinishDeploy {
				n++
			}
		}
		return n == 3
	})
	ipmiReady := 0
	for _, s := range snap.Servers {
		if s.BMC.Driver == "ipmi" && s.Hardware != nil {
			ipmiReady++ // commissioned through OpenIPMI's ipmi_sim
		}
	}
	if ipmiReady < 3 {
		t.Errorf("%d IPMI servers commissioned, want the example's 3 (r1-n04, r1-n05, r2-n03) through ipmi_sim", ipmiReady)
	}
	byProfile := map[string]int{}
	for _, s := range snap.Servers {
		if s.Lifecycle == state.LifecycleDeployed {
			byProfile[s.Allocation.Profile]++
			if m := h.lab.Machine(s.Name); m.Phase() != sim.PhaseOS {
				// the machine rebooted after the write and booted its disk
				h.waitMachine(m, sim.PhaseOS)
			}
		}
		if s.Lifecycle == state.LifecycleReady && s.Hardware == nil {
			t.Errorf("%s is ready without hardware facts", s.Name)
		}
	}
	if byProfile["hypervisor"] != 2 || byProfile["storage"] != 1 {
		t.Errorf("deployed by profile = %v, want hypervisor 2, storage 1", byProfile)
	}
	// The storage host's seed carries its profile's network layout
	// (networks.yaml, servers.yaml's fixed addresses) rendered for the NIC
	// its commissioning found; a hypervisor keeps DHCP on its boot NIC.
	for _, s := range snap.Servers {
		if s.Lifecycle != state.LifecycleDeployed {
			continue
		}
		seed := h.lab.Machine(s.Name).Seed()
		if seed == nil {
			t.Errorf("%s: no seed recorded", s.Name)
			continue
		}
		var want []string
		switch s.Allocation.Profile {
		case "storage":
			ws := h.run.Reconciler.Desired().Server(s.Name)
			want = []string{`set-name: "uplink0"`, `macaddress: "` + s.BootMAC + `"`, `"` + ws.Network.Addresses["uplink0"][0] + `/24"`,
				`storage0:`, `id: 130`, `"` + ws.Network.Addresses["storage0"][1] + `/64"`, `via: "10.20.0.1"`}
		case "hypervisor":
			want = []string{`macaddress: "` + s.BootMAC + `"`, "dhcp4: true"}
		}
		for _, w := range want {
			if !strings.Contains(seed.NetworkConfig, w) {
				t.Errorf("%s (%s): network-config lacks %s:\n%s", s.Name, s.Allocation.Profile, w, seed.NetworkConfig)
			}
		}
	}
	// Each deployed machine booted its OS, which joined over pinned TLS.
	deadline := time.Now().Add(time.Minute)
	for {
		hosts, err := h.run.Store.Hosts()
		if err != nil {
			t.Fatal(err)
		}
		joined, name := 0, ""
		for _, host := range hosts {
			if host.JoinStatus == "joined" {
				joined++
				name = host.Name
			}
		}
		if joined == 3 {
			// Which servers a count allocates depends on which were ready
			// first: read the status of one that joined.
			h.waitStatus("status/hosts/"+name+".yaml", "joined")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d hosts joined, want 3: %+v", joined, hosts)
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.waitStatus(gitops.ServerStatusPath("r1-n01"), "lifecycle:")
	// README.md is the fleet's summary: every server counted, by zone.
	h.waitStatus("status/README.md", "12 servers: ", "| zone-a |")
}

func (h *harness) waitMachine(m *sim.Machine, p sim.Phase) {
	h.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for m.Phase() != p {
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: phase %s, want %s", m.Name, m.Phase(), p)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitStatus waits until the bare repository's main branch has path with
// text in it (a status commit from the controller).
func (h *harness) waitStatus(path string, texts ...string) string {
	h.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if body, ok := readHead(h.lab.RepoURL, path); ok && containsAll(body, texts) {
			return body
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("no status commit with %s containing all of %q", path, texts)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func readHead(repoURL, path string) (string, bool) {
	repo, err := git.PlainOpen(strings.TrimPrefix(repoURL, "file://"))
	if err != nil {
		return "", false
	}
	ref, err := repo.Head()
	if err != nil {
		return "", false
	}
	c, err := repo.CommitObject(ref.Hash())
	if err != nil {
		return "", false
	}
	f, err := c.File(path)
	if err != nil {
		return "", false
	}
	s, err := f.Contents()
	return s, err == nil
}
