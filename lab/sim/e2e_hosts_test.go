package sim_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/bmc/ipmi/ipmisim/ipmisimtest"
	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/state"
)

// gpuSite has five GPU servers (zone-c: the simulated SimGPU 4U carries an
// NVIDIA GPU next to its BMC's ASPEED VGA) and two without (zone-a). The
// profile has no zone: only its selector on the derived label gpu.vendor
// keeps the CPU-only servers out. Its hosts are auto-fenced.
var gpuSite = fstest.MapFS{
	inventory.ServersFile: {Data: []byte(`servers:
  - {name: g1, zone: zone-c, bootMAC: "52:54:00:00:0c:01", bmc: {driver: redfish, address: "https://10.10.3.1", credentials: bmc-redfish}}
  - {name: g2, zone: zone-c, bootMAC: "52:54:00:00:0c:02", bmc: {driver: redfish, address: "https://10.10.3.2", credentials: bmc-redfish}}
  - {name: g3, zone: zone-c, bootMAC: "52:54:00:00:0c:03", bmc: {driver: redfish, address: "https://10.10.3.3", credentials: bmc-redfish}}
  - {name: g4, zone: zone-c, bootMAC: "52:54:00:00:0c:04", bmc: {driver: redfish, address: "https://10.10.3.4", credentials: bmc-redfish}}
  - {name: g5, zone: zone-c, bootMAC: "52:54:00:00:0c:05", bmc: {driver: redfish, address: "https://10.10.3.5", credentials: bmc-redfish}}
  - {name: c1, zone: zone-a, bootMAC: "52:54:00:00:0a:01", labels: {room: a}, bmc: {driver: redfish, address: "https://10.10.1.1", credentials: bmc-redfish}}
  - {name: c2, zone: zone-a, bootMAC: "52:54:00:00:0a:02", bmc: {driver: redfish, address: "https://10.10.1.2", credentials: bmc-redfish}}
`)},
	inventory.ProfilesFile: {Data: []byte(`profiles:
  - name: ml
    image: ubuntu-24.04
    sshKeys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1"]
    count: 7
    fence: auto
    selector:
      matchLabels: {gpu.vendor: nvidia}
      matchExpressions:
        - {key: memory.gib, operator: Gt, values: ["256"]}
`)},
	inventory.ImagesFile: {Data: []byte("images:\n  - {name: ubuntu-24.04, catalog: ubuntu-24.04}\n")},
}

const (
	hbInterval  = time.Second
	lostWindow  = 3 * hbInterval // the default: 3 intervals
	fenceWindow = 15 * time.Second
)

func (r *rig) host(server string) state.Host {
	r.t.Helper()
	hs, err := r.run.Store.Hosts()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, h := range hs {
		if h.Server == server {
			return h
		}
	}
	r.t.Fatalf("no host on server %s", server)
	return state.Host{}
}

func (r *rig) waitHost(server, what string, d time.Duration, cond func(state.Host) bool) state.Host {
	r.t.Helper()
	var h state.Host
	r.waitFor(server+"'s host "+what, d, func(state.Snapshot) bool {
		h = r.host(server)
		return cond(h)
	})
	return h
}

func (r *rig) eventsOf(kind state.EventKind) []state.Event {
	r.t.Helper()
	evs, err := r.run.Store.Events(state.EventQuery{})
	if err != nil {
		r.t.Fatal(err)
	}
	var out []state.Event
	for _, e := range evs {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// TestHostLivenessFencingAndSelection walks host liveness and fencing through the
// simulated lab: a profile selecting by a derived label deploys only the
// GPU servers; a host whose node agent stops is HostLost within the window
// with its power read ("lost, powered on"), and a restarted agent clears it
// (an agent restart, not a reboot); a host is fenced through an IPMI
// fencing device (ipmi_sim, read back off, the password never in
// /proc/*/cmdline while ipmitool runs) and through its Redfish BMC (the
// machine off, never powered on again while fenced); auto-fence is held
// by the safety brake while 3 of 5 hosts are silent at once, and fences
// the one left silent once the others return.
func TestHostLivenessFencingAndSelection(t *testing.T) {
	ipmisimtest.RequireTools(t)
	r := startRig(t, rigOptions{lab: sim.Config{Inventory: gpuSite}, config: func(c *controller.Config) {
		c.Heartbeat, c.HostFenceWindow = hbInterval, fenceWindow
	}})
	gpus := []string{"g1", "g2", "g3", "g4", "g5"}

	// Selection by derived label: the five GPU servers deploy and join,
	// the CPU-only ones stay ready (count 7 cannot be met: a condition).
	r.waitFor("the GPU servers deployed and joined", 4*time.Minute, func(s state.Snapshot) bool {
		for _, n := range gpus {
			if srv := record(s, n); srv.Lifecycle != state.LifecycleDeployed || srv.FinishDeploy || !r.lab.Machine(n).Joined() {
				return false
			}
		}
		return true
	})
	snap, _ := r.run.Store.Snapshot()
	for _, n := range []string{"c1", "c2"} {
		if srv := record(snap, n); srv.Lifecycle != state.LifecycleReady || srv.Allocation != nil {
			t.Errorf("%s (no GPU) is %s, allocation %+v; want ready and never allocated", n, srv.Lifecycle, srv.Allocation)
		}
	}
	if l := record(snap, "g1").Hardware.Labels(); l["gpu.vendor"] != "nvidia" || l["cpu.vendor"] != "intel" || l["cpu.arch"] != "amd64" || l["memory.gib"] != "512" {
		t.Errorf("g1 derived labels %v", l)
	}
	if l := record(snap, "c1").Hardware.Labels(); l["gpu.vendor"] != "" {
		t.Errorf("c1 derived labels %v: the BMC's ASPEED VGA is not a GPU", l)
	}
	plan := r.run.Reconciler.LastPlan()
	if len(plan.Selections) != 1 || !slices.Equal(plan.Selections[0].Matches, gpus) {
		t.Errorf("selections %+v, want ml matching %v", plan.Selections, gpus)
	}
	if txt := plan.Text(); !strings.Contains(txt, "not c1") || !strings.Contains(txt, "gpu.vendor In (nvidia): has none") {
		t.Errorf("plan does not say why c1 is not selected:\n%s", txt)
	}
	for _, n := range gpus {
		r.waitHost(n, "heartbeating with its agent version", 30*time.Second, func(h state.Host) bool { return h.AgentVersion == "sim" && !h.BootedAt.IsZero() })
	}

	// Liveness: stop g1's node agent, the OS keeps running.
	g1 := r.lab.Machine("g1")
	g1.StopNodeAgent()
	h := r.waitHost("g1", "lost, powered on", 30*time.Second, func(h state.Host) bool { return h.Lost != nil && h.Lost.Power == state.PowerOn })
	if took := h.Lost.Detected.Sub(h.Lost.Since); took < lostWindow || took > lostWindow+hbInterval+2*time.Second {
		t.Errorf("marked lost %s after its last heartbeat; want within the window %s (+ one check tick, 2s slack)", took, lostWindow)
	}
	code, body := r.admin(http.MethodGet, "/api/v1/hosts", nil)
	var hl v1.HostList
	if code != http.StatusOK || json.Unmarshal(body, &hl) != nil {
		t.Fatalf("GET /api/v1/hosts: %d %s", code, body)
	}
	for _, x := range hl.Items {
		if x.Server == "g1" && (x.Lost == nil || x.Lost.Summary != "lost, powered on" || x.Online || len(x.Conditions) == 0 || x.Conditions[0].Type != "HostLost") {
			t.Errorf("API host view of g1: %+v", x)
		}
	}
	r.waitStatus("status/hosts/"+h.Name+".yaml", "type: HostLost", "reason: LostPoweredOn")
	if err := g1.StartNodeAgent(); err != nil {
		t.Fatal(err)
	}
	r.waitHost("g1", "back", 30*time.Second, func(h state.Host) bool { return h.Lost == nil })
	if len(r.eventsOf(state.EventHostReturned)) == 0 || len(r.eventsOf(state.EventHostAgentRestarted)) == 0 || len(r.eventsOf(state.EventHostRebooted)) != 0 {
		t.Errorf("events: returned %d, agent restarted %d, rebooted %d; want an agent restart, no reboot",
			len(r.eventsOf(state.EventHostReturned)), len(r.eventsOf(state.EventHostAgentRestarted)), len(r.eventsOf(state.EventHostRebooted)))
	}

	// Fence through an IPMI fencing device (a PDU's IPMI endpoint: an
	// ipmi_sim of its own; the simulated PDU is not wired to g2's power,
	// so its read-back is the device's).
	pdu := ipmisimtest.Start(t)
	pdu.Ipmitool("chassis", "power", "on")
	if _, err := r.run.Store.PutSecret("pdu", state.Credential{Username: "solop", Password: "S3cret-SOL-pw"}, "test"); err != nil {
		t.Fatal(err)
	}
	r.commit("g2: fencing device", func(dir string) {
		path := filepath.Join(dir, inventory.ServersFile)
		b, _ := os.ReadFile(path)
		s := strings.Replace(string(b), "    bmc:\n      driver: redfish\n      address: ", "    fence: {driver: ipmi, address: \""+pdu.Addr()+"\", credentials: pdu}\n    bmc:\n      driver: redfish\n      address: ", 2)
		// Only g2's entry gets the device: undo the first (g1's).
		s = strings.Replace(s, "    fence: {driver: ipmi, address: \""+pdu.Addr()+"\", credentials: pdu}\n", "", 1)
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	r.waitFor("g2's fencing device acting", time.Minute, func(state.Snapshot) bool {
		d := r.run.Reconciler.Desired()
		return d != nil && d.Server("g2") != nil && d.Server("g2").Fence != nil
	})
	stop := make(chan struct{})
	var seen atomic.Int64
	var mu sync.Mutex
	var leaks []string
	scanDone := make(chan struct{})
	portArg := []byte("\x00-p\x00" + strconv.Itoa(pdu.Port) + "\x00")
	go func() {
		defer close(scanDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
			for _, p := range paths {
				b, err := os.ReadFile(p)
				if err != nil {
					continue
				}
				if bytes.Contains(b, []byte("ipmitool")) && bytes.Contains(b, portArg) {
					seen.Add(1)
				}
				if bytes.Contains(b, []byte("S3cret-SOL-pw")) {
					mu.Lock()
					leaks = append(leaks, p+": "+strings.ReplaceAll(string(b), "\x00", " "))
					mu.Unlock()
				}
			}
		}
	}()
	code, body = r.admin(http.MethodPost, "/api/v1/hosts/"+r.host("g2").Name+"/fence", v1.FenceRequest{Reason: "test: PDU fence"})
	close(stop)
	<-scanDone
	var fr v1.FenceResult
	if code != http.StatusOK || json.Unmarshal(body, &fr) != nil || fr.Power != "powered_off" || !strings.HasPrefix(fr.Device, "fence ipmi ") {
		t.Fatalf("fence g2: %d %s", code, body)
	}
	if len(leaks) > 0 {
		t.Errorf("the fencing password is in a command line: %v", leaks)
	}
	if seen.Load() == 0 {
		// Under load (the whole race-enabled suite on two cores) one scan
		// of /proc can outlast ipmitool's run; fence's
		// TestFenceThroughIPMIToolDevice asserts the scan saw it, here a
		// missed scan only says this run's leak check proves less.
		t.Logf("the /proc scan never saw ipmitool running: this run's argv check proves nothing (fence TestFenceThroughIPMIToolDevice carries that proof)")
	}
	if out := pdu.Ipmitool("chassis", "power", "status"); !strings.Contains(out, "is off") {
		t.Errorf("PDU power after the fence: %q, want off", out)
	}
	if h := r.host("g2"); h.Fenced == nil || !strings.HasPrefix(h.Fenced.Actor, "e2e-") || h.Fenced.Reason != "test: PDU fence" {
		t.Errorf("g2 host fence record %+v", h.Fenced)
	}
	code, body = r.admin(http.MethodPost, "/api/v1/hosts/"+r.host("g2").Name+"/unfence", v1.FenceRequest{Reason: "test: done"})
	if code != http.StatusOK {
		t.Fatalf("unfence g2: %d %s", code, body)
	}
	if len(r.eventsOf(state.EventHostFenced)) != 1 || len(r.eventsOf(state.EventHostUnfenced)) != 1 {
		t.Errorf("audit events: fenced %v, unfenced %v", r.eventsOf(state.EventHostFenced), r.eventsOf(state.EventHostUnfenced))
	}

	// Auto-fence and the brake: 3 of 5 hosts silent at once is held.
	for _, n := range []string{"g3", "g4", "g5"} {
		r.lab.Machine(n).StopNodeAgent()
	}
	for _, n := range []string{"g3", "g4", "g5"} {
		r.waitHost(n, "lost", 30*time.Second, func(h state.Host) bool { return h.Lost != nil })
	}
	time.Sleep(lostWindow + fenceWindow + time.Second)
	if held := r.eventsOf(state.EventHostFenceHeld); len(held) == 0 || !strings.Contains(held[0].Message, "3 of 5 hosts are lost") {
		t.Errorf("fence_held events %v; want one saying 3 of 5 hosts are lost", held)
	}
	for _, n := range []string{"g3", "g4", "g5"} {
		if h := r.host(n); h.Fenced != nil {
			t.Errorf("%s auto-fenced while 3 of 5 hosts were lost: %+v", n, h.Fenced)
		}
	}
	// Two come back: one of five lost is within the 20% share, and it is
	// fenced through its Redfish BMC.
	for _, n := range []string{"g3", "g4"} {
		if err := r.lab.Machine(n).StartNodeAgent(); err != nil {
			t.Fatal(err)
		}
	}
	h = r.waitHost("g5", "auto-fenced", time.Minute, func(h state.Host) bool { return h.Fenced != nil })
	if !h.Fenced.Auto || h.Fenced.Actor != state.ActorController || h.Fenced.Device != "bmc" {
		t.Errorf("g5 fence %+v, want automatic through the bmc", h.Fenced)
	}
	r.waitMachine(r.lab.Machine("g5"), sim.PhaseOff)
	forceOff := false
	for _, q := range r.lab.BMC("g5").Requests() {
		forceOff = forceOff || strings.Contains(q.String(), "ForceOff")
	}
	if !forceOff {
		t.Errorf("g5's BMC got no ForceOff")
	}
	for _, n := range []string{"g3", "g4"} {
		if h := r.host(n); h.Lost != nil || h.Fenced != nil {
			t.Errorf("%s after returning: lost %+v fenced %+v", n, h.Lost, h.Fenced)
		}
	}

	// Fence by hand through g1's Redfish BMC; the reconciler never powers
	// it on while fenced.
	code, body = r.admin(http.MethodPost, "/api/v1/hosts/"+r.host("g1").Name+"/fence", v1.FenceRequest{Reason: "test: BMC fence"})
	if code != http.StatusOK || json.Unmarshal(body, &fr) != nil || fr.Device != "bmc" || fr.Power != "powered_off" {
		t.Fatalf("fence g1: %d %s", code, body)
	}
	r.waitMachine(g1, sim.PhaseOff)
	r.waitFor("the plan to show g1 fenced", 30*time.Second, func(state.Snapshot) bool {
		for _, c := range r.run.Reconciler.LastPlan().Conditions {
			if c.Subject == "server/g1" && c.Type == "Fenced" {
				return true
			}
		}
		return false
	})
	time.Sleep(2 * time.Second) // ten reconcile passes
	if p := g1.Phase(); p != sim.PhaseOff {
		t.Errorf("fenced g1 is %s, want off", p)
	}
	if srv, _ := r.run.Store.Server("g1"); srv.Fenced == nil || srv.Power.State != state.PowerOff {
		t.Errorf("g1 record: fenced %+v power %s", srv.Fenced, srv.Power.State)
	}
	t.Logf("ipmitool seen in %d /proc scans during the PDU fence; events: %s", seen.Load(), fmt.Sprint(len(r.eventsOf(state.EventHostFenced))))
}
