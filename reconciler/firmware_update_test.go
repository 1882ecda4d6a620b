package reconciler

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// testFirmwareImages offers one file per name over an httptest server at
// /fw/<n>/<file>, as the controller's /firmware/ handler does: a
// released offer answers 404. missing makes the file vanish (404) while
// the offer lives, as a file the BMC cannot fetch.
type testFirmwareImages struct {
	srv     *httptest.Server
	files   map[string][]byte // by catalog name
	names   map[string]string // catalog name → file name
	missing bool

	mu        sync.Mutex
	importing bool              // Ready answers an error: the import has not finished
	live      map[string]string // offer path → catalog name
	seq       int
	offers    int
	released  int
}

func newTestFirmwareImages(t *testing.T) *testFirmwareImages {
	fi := &testFirmwareImages{files: map[string][]byte{}, names: map[string]string{}, live: map[string]string{}}
	fi.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fi.mu.Lock()
		name, ok := fi.live[r.URL.Path]
		fi.mu.Unlock()
		if !ok || fi.missing {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(fi.files[name]))
	}))
	t.Cleanup(fi.srv.Close)
	return fi
}

func (fi *testFirmwareImages) add(name, file string, body []byte) string {
	fi.files[name], fi.names[name] = body, file
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (fi *testFirmwareImages) Offer(_ context.Context, name, _ string) (string, func(), error) {
	fi.mu.Lock()
	defer fi.mu.Unlock()
	fi.seq++
	fi.offers++
	p := "/fw/" + strings.Repeat("x", fi.seq) + "/" + fi.names[name]
	fi.live[p] = name
	return fi.srv.URL + p, func() {
		fi.mu.Lock()
		defer fi.mu.Unlock()
		delete(fi.live, p)
		fi.released++
	}, nil
}

func (fi *testFirmwareImages) Ready(name string) error {
	fi.mu.Lock()
	defer fi.mu.Unlock()
	if fi.importing {
		return fmt.Errorf("firmware image %s is downloading", name)
	}
	return nil
}

func (fi *testFirmwareImages) Open(_ context.Context, name, _ string) (io.ReadCloser, string, error) {
	return io.NopCloser(bytes.NewReader(fi.files[name])), fi.names[name], nil
}

// TestFirmwareUpdateThroughBMC runs the firmware step of an allocated
// server whose profile wants a component version against bmcsim's
// Dell iDRAC 9 and stock OpenBMC trees over the real Redfish driver, the BMC fetching the offered file
// itself (bmcsim FetchImages) and restarting after the update (the next
// request dropped, then 503s):
//   - ok: one SimpleUpdate with OperationApplyTime OnReset (iDRAC
//     lists it), one fetch of the offered file with its bytes, the task
//     Pending until the step's one reset, then followed through the
//     BMC's restart, FirmwareInventory read back at 1.9.0, the offer
//     released, no error;
//   - bmcweb push: stock OpenBMC lists no SimpleUpdate, so the verified
//     file is pushed to its MultipartHttpPushUri; read back at 2.16.0;
//   - transfer fails (the file answers 404): the task ends failed
//     (iDRAC: Completed, TaskStatus Critical) with
//     Update.1.0.TransferFailed, the step fails and stalls the
//     server with that reason, and five more passes send nothing more:
//     one SimpleUpdate, one fetch in all; never deployed.
func TestFirmwareUpdateThroughBMC(t *testing.T) {
	for _, c := range []struct {
		name, tree, comp, ver, file string
		missing, push               bool
	}{
		{name: "ok", tree: "dell-poweredge-r750-idrac9", comp: "BIOS", ver: "1.9.0", file: "BIOS_1.9.0.bin"},
		{name: "transfer fails", tree: "dell-poweredge-r750-idrac9", comp: "BIOS", ver: "1.9.0", file: "BIOS_1.9.0.bin", missing: true},
		// Stock bmcweb lists no SimpleUpdate, only MultipartHttpPushUri.
		{name: "bmcweb push", tree: "openbmc-bmcweb-stock", comp: "5d0869c4", ver: "2.16.0", file: "Software_2.16.0.tar", push: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			log := slog.New(slog.NewTextHandler(t.Output(), nil))
			dir, err := bmcsim.TreeDir("", c.tree)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := bmcsim.LoadTree(dir)
			if err != nil {
				t.Fatal(err)
			}
			sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "admin", Password: "pw", Power: bmcsim.NewMemoryPower(true),
				Firmware: bmcsim.Firmware{FetchImages: true, UpdatePolls: 2, RestartRequests: 3}})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(sim)
			defer ts.Close()
			imgs := newTestFirmwareImages(t)
			imgs.missing = c.missing
			body := []byte("a BIOS package for the test\n")
			sum := imgs.add("fw", c.file, body)

			inv := &inventory.Inventory{
				Servers: []inventory.Server{{Name: "s1", Zone: "z", BootMAC: "52:54:00:00:00:01", BootMode: inventory.BootUEFI, Want: inventory.WantDeployed, Profile: "p",
					BMC: inventory.BMC{Driver: inventory.DriverRedfish, Address: ts.URL, Credentials: "c"}}},
				Profiles: []inventory.Profile{{Name: "p", Image: "img", Deploy: inventory.DeployImage,
					Firmware: &inventory.Firmware{Versions: []inventory.FirmwareVersion{{Component: c.comp, Version: c.ver, Image: "fw"}}}}},
				Images:         []inventory.Image{{Name: "img", URL: "http://x/img.raw", Checksum: "sha256:" + strings.Repeat("0", 64)}},
				FirmwareImages: []inventory.FirmwareImage{{Name: "fw", URL: "http://mirror/" + c.file, Checksum: sum, SizeBytes: int64(len(body))}},
				Digest:         "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			}
			st := pinnedAllocated(t, inv)
			ctl, err := New(Config{Store: st, Drivers: simDrivers{url: ts.URL, log: log}, Logger: log, FirmwareImages: imgs, FirmwareTaskPoll: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctl.SetDesired(inv)
			// While the catalog file is still importing the step waits:
			// three passes send nothing and record no failure.
			imgs.importing = true
			for i := 0; i < 3; i++ {
				ctl.Pass(context.Background())
				ctl.wg.Wait()
			}
			if srv, _ := st.Server("s1"); len(sim.Requests()) != 0 || srv.LastError != "" || srv.Stalled != "" {
				t.Fatalf("while importing: %d BMC requests, LastError %q, stalled %q; want none", len(sim.Requests()), srv.LastError, srv.Stalled)
			}
			imgs.mu.Lock()
			imgs.importing = false
			imgs.mu.Unlock()
			passes := 1
			if c.missing {
				passes = 6
			}
			for i := 0; i < passes; i++ {
				res := ctl.Pass(context.Background())
				ctl.wg.Wait()
				if i == 0 && !hasStep(res.Steps, plan.ActFirmware) {
					t.Fatalf("plan %v, want the firmware step", res.Steps)
				}
			}
			srv, err := st.Server("s1")
			if err != nil {
				t.Fatal(err)
			}
			updates, pushes, onReset, resets := 0, 0, 0, 0
			for _, q := range sim.Requests() {
				if q.Method == http.MethodPost && strings.HasSuffix(q.Path, "UpdateService.SimpleUpdate") {
					updates++
					if q.Body["@Redfish.OperationApplyTime"] == "OnReset" {
						onReset++
					}
				}
				if q.Method == http.MethodPost && strings.HasSuffix(q.Path, "ComputerSystem.Reset") && q.Status >= 200 && q.Status < 300 {
					resets++
				}
				if q.Method == http.MethodPost && q.Path == "/redfish/v1/UpdateService/update" {
					pushes++
				}
			}
			fetches := sim.ImageFetches()
			if c.push {
				if updates != 0 || pushes != 1 || len(fetches) != 0 {
					t.Errorf("%d SimpleUpdate, %d pushes, %d fetches; want the one multipart push", updates, pushes, len(fetches))
				}
				if srv.LastError != "" || srv.Stalled != "" || !hasVersion(srv.Firmware, c.comp, c.ver) {
					t.Errorf("LastError %q stalled %q components %+v; want %s at %s", srv.LastError, srv.Stalled, srv.Firmware.Components, c.comp, c.ver)
				}
				return
			}
			if updates != 1 || len(fetches) != 1 {
				t.Fatalf("%d SimpleUpdate requests and %d fetches over %d passes (%+v); want one each", updates, len(fetches), passes, fetches)
			}
			// iDRAC lists OperationApplyTime OnReset for SimpleUpdate: the
			// update is scheduled and runs at the step's one reset.
			if onReset != 1 || resets != 1 {
				t.Errorf("%d SimpleUpdates with OperationApplyTime OnReset, %d resets; want one each", onReset, resets)
			}
			if imgs.offers != 1 || imgs.released != 1 {
				t.Errorf("offers %d released %d; want one offer, released when the update ended", imgs.offers, imgs.released)
			}
			if srv.Lifecycle != state.LifecycleAllocated {
				t.Errorf("lifecycle %s; want allocated (the deploy follows the step)", srv.Lifecycle)
			}
			if !c.missing {
				if want := strings.TrimPrefix(sum, "sha256:"); fetches[0].Err != "" || fetches[0].SHA256 != want {
					t.Errorf("fetch %+v; want the offered file's bytes (%s)", fetches[0], want)
				}
				if srv.LastError != "" || srv.Stalled != "" {
					t.Errorf("LastError %q stalled %q; want none", srv.LastError, srv.Stalled)
				}
				if !hasVersion(srv.Firmware, c.comp, c.ver) {
					t.Errorf("%s not read back at %s (%+v)", c.comp, c.ver, srv.Firmware.Components)
				}
				return
			}
			if fetches[0].Status != http.StatusNotFound {
				t.Errorf("fetch %+v; want the 404 of the missing file", fetches[0])
			}
			if !strings.Contains(srv.LastError, "update BIOS to 1.9.0") || !strings.Contains(srv.LastError, "TransferFailed") || srv.Stalled == "" {
				t.Errorf("LastError %q stalled %q; want the failed update's task message and a stall", srv.LastError, srv.Stalled)
			}
			// The BMC's message echoes the ImageURI; status keeps no offer URI.
			if strings.Contains(srv.LastError, imgs.srv.URL) || !strings.Contains(srv.LastError, "<offered file BIOS_1.9.0.bin>") {
				t.Errorf("LastError %q; want the offer URI redacted", srv.LastError)
			}
		})
	}
}

// hasVersion reports whether the first component listed by Id or Name
// comp (as the plan reads it: iDRAC lists Current-, Installed- and
// Previous- entries named BIOS) runs ver.
func hasVersion(fw *state.Firmware, comp, ver string) bool {
	if fw == nil {
		return false
	}
	for _, fc := range fw.Components {
		if fc.ID == comp || strings.EqualFold(fc.Name, comp) {
			return fc.Version == ver
		}
	}
	return false
}

func hasStep(steps []plan.Step, a plan.Action) bool {
	for _, s := range steps {
		if s.Action == a {
			return true
		}
	}
	return false
}

// TestFirmwareOneStepPerBMC: with PerBMC 2 (a chassis BMC serving
// several servers), a second firmware step against the same BMC address
// waits while one runs (a BMC runs one update at a time and restarts
// after it), other actions still start, and the next firmware step
// starts once the first ends.
func TestFirmwareOneStepPerBMC(t *testing.T) {
	c := &Controller{cfg: Config{Workers: 8, PerBMC: 2, PerRack: 8}, busy: map[string]bool{}, inflight: map[string]plan.Step{},
		bmcUse: map[string]int{}, rackUse: map[string]int{}, fwUse: map[string]bool{}}
	obs := func(n string) *state.Server {
		return &state.Server{Name: n, Rack: "r1", BMC: state.BMCFacts{Address: "https://chassis-1"}}
	}
	fw := func(n string) plan.Step { return plan.Step{Server: n, Action: plan.ActFirmware, Profile: "p"} }
	now := time.Now()
	if c.tryStart(fw("s1"), obs("s1"), now) != started {
		t.Fatal("the first firmware step did not start")
	}
	if c.tryStart(fw("s2"), obs("s2"), now) == started {
		t.Fatal("a second firmware step started against the same BMC")
	}
	if c.tryStart(plan.Step{Server: "s3", Action: plan.ActPowerOn}, obs("s3"), now) != started {
		t.Error("a power step was held by the firmware step (PerBMC 2 allows it)")
	}
	c.unreserve(fw("s1"), obs("s1"))
	if c.tryStart(fw("s2"), obs("s2"), now) != started {
		t.Error("the second firmware step did not start after the first ended")
	}
}

// TestFirmwareOnDeployedAfterApproval: a deployed server (bmcsim's HPE
// iLO 5 tree over the real Redfish driver) whose profile's firmware
// block changed after its deploy. Unapproved, three passes send the BMC
// no BIOS write and no reset (applying would reset the running host);
// once the revision is approved (state.Approve, what `machinactl
// approve` records), one pass writes the setting to bios/settings,
// resets the host once, reads the setting back applied, and the server
// stays deployed.
func TestFirmwareOnDeployedAfterApproval(t *testing.T) {
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	dir, err := bmcsim.TreeDir("", "hpe-proliant-dl385gen10plusv2-ilo5")
	if err != nil {
		t.Fatal(err)
	}
	tr, err := bmcsim.LoadTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "admin", Password: "pw", Power: bmcsim.NewMemoryPower(true)})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim)
	defer ts.Close()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	inv := &inventory.Inventory{
		Servers: []inventory.Server{{Name: "s1", Zone: "z", BootMAC: "52:54:00:00:00:01", BootMode: inventory.BootUEFI, Want: inventory.WantDeployed, Profile: "p",
			BMC: inventory.BMC{Driver: inventory.DriverRedfish, Address: ts.URL, Credentials: "c"}}},
		Profiles: []inventory.Profile{{Name: "p", Image: "img", Deploy: inventory.DeployImage,
			Firmware: &inventory.Firmware{Settings: map[string]any{"AMDPerformanceWorkloadProfile": "Enabled"}}}},
		Images: []inventory.Image{{Name: "img", URL: "http://x/img.raw", Checksum: "sha256:" + strings.Repeat("0", 64)}},
		Digest: "sha256:4a1f0c2e9b7d6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f",
	}
	ws := inv.Servers[0]
	if _, err := st.CreateServer(plan.Record(&ws)); err != nil {
		t.Fatal(err)
	}
	for _, m := range [][2]state.Lifecycle{{state.LifecycleNew, state.LifecycleCommissioning}, {state.LifecycleCommissioning, state.LifecycleReady},
		{state.LifecycleReady, state.LifecycleAllocated}, {state.LifecycleAllocated, state.LifecycleDeploying}, {state.LifecycleDeploying, state.LifecycleDeployed}} {
		if _, err := st.Transition("s1", m[0], m[1], "test"); err != nil {
			t.Fatal(err)
		}
	}
	drivers := simDrivers{url: ts.URL, log: log}
	drv, err := drivers.Driver(context.Background(), state.Server{})
	if err != nil {
		t.Fatal(err)
	}
	fw, err := ReadFirmware(context.Background(), drv, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got := fw.BIOS.Attributes.Value("AMDPerformanceWorkloadProfile"); got == "Enabled" {
		t.Fatalf("fixture: AMDPerformanceWorkloadProfile already %v", got)
	}
	if _, err := st.UpdateServer("s1", func(s *state.Server) error {
		s.Allocation = &state.Allocation{Profile: "p", Reason: plan.ReasonPinned, At: time.Now()}
		s.Firmware = fw
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctl, err := New(Config{Store: st, Drivers: drivers, Logger: log, FirmwareTaskPoll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctl.SetDesired(inv)
	writes := func() (patches, resets int) {
		for _, q := range sim.Requests() {
			if q.Method == http.MethodPatch && strings.Contains(strings.ToLower(q.Path), "bios") {
				patches++
			}
			if q.Method == http.MethodPost && strings.HasSuffix(q.Path, "ComputerSystem.Reset") {
				resets++
			}
		}
		return patches, resets
	}
	for i := 0; i < 3; i++ {
		res := ctl.Pass(context.Background())
		ctl.wg.Wait()
		if i == 0 && (hasStep(res.Steps, plan.ActFirmware) || !hasStep(res.Held, plan.ActFirmware)) {
			t.Fatalf("unapproved: steps %v held %v; want the firmware step held", res.Steps, res.Held)
		}
	}
	if p, r := writes(); p != 0 || r != 0 {
		t.Fatalf("unapproved: %d BIOS writes and %d resets; want none", p, r)
	}
	if err := st.Approve(plan.DigestPrefix(inv.Digest), "test"); err != nil {
		t.Fatal(err)
	}
	res := ctl.Pass(context.Background())
	ctl.wg.Wait()
	if !hasStep(res.Steps, plan.ActFirmware) {
		t.Fatalf("approved: steps %v; want the firmware step", res.Steps)
	}
	srv, err := st.Server("s1")
	if err != nil {
		t.Fatal(err)
	}
	if p, r := writes(); p != 1 || r != 1 {
		t.Errorf("approved: %d BIOS writes and %d resets; want one of each", p, r)
	}
	if srv.LastError != "" || srv.Lifecycle != state.LifecycleDeployed || srv.Firmware.BIOS.Attributes.Value("AMDPerformanceWorkloadProfile") != "Enabled" {
		t.Errorf("after the step: lifecycle %s LastError %q setting %v; want deployed, no error, Enabled", srv.Lifecycle, srv.LastError, srv.Firmware.BIOS.Attributes.Value("AMDPerformanceWorkloadProfile"))
	}
}

// TestFirmwareIPMIUnsupportedNoLoop: an allocated server on an IPMI BMC
// whose profile sets firmware state gets FirmwareUnsupported (reason
// IPMI) on every pass and no step: over five passes no BMC connection is
// opened, nothing is recorded as a failure, and the server stays
// allocated (neither firmware nor deploy is attempted).
func TestFirmwareIPMIUnsupportedNoLoop(t *testing.T) {
	sb := true
	inv := &inventory.Inventory{
		Servers: []inventory.Server{{Name: "s1", Zone: "z", BootMAC: "52:54:00:00:00:01", BootMode: inventory.BootUEFI, Want: inventory.WantDeployed, Profile: "p",
			BMC: inventory.BMC{Driver: inventory.DriverIPMI, Address: "10.0.0.9:623", Credentials: "c"}}},
		Profiles: []inventory.Profile{{Name: "p", Image: "img", Deploy: inventory.DeployImage, Firmware: &inventory.Firmware{SecureBoot: &sb}}},
		Images:   []inventory.Image{{Name: "img", URL: "http://x/img.raw", Checksum: "sha256:" + strings.Repeat("0", 64)}},
		Digest:   "sha256:5a1f0c2e9b7d6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f",
	}
	st := pinnedAllocated(t, inv)
	drivers := &countingDrivers{d: &recordingDriver{on: true}}
	ctl, err := New(Config{Store: st, Drivers: drivers})
	if err != nil {
		t.Fatal(err)
	}
	ctl.SetDesired(inv)
	for i := 0; i < 5; i++ {
		res := ctl.Pass(context.Background())
		ctl.wg.Wait()
		var cond *plan.Condition
		for j, c := range res.Conditions {
			if c.Subject == "server/s1" && c.Type == plan.CondFirmwareUnsupported {
				cond = &res.Conditions[j]
			}
		}
		if cond == nil || cond.Reason != "IPMI" {
			t.Fatalf("pass %d: conditions %+v; want FirmwareUnsupported (IPMI) on s1", i, res.Conditions)
		}
		for _, s := range res.Steps {
			if s.Server == "s1" {
				t.Errorf("pass %d: step %s planned on s1", i, s)
			}
		}
	}
	srv, err := st.Server("s1")
	if err != nil {
		t.Fatal(err)
	}
	if drivers.opened != 0 || srv.LastError != "" || srv.Failures != 0 || srv.Lifecycle != state.LifecycleAllocated {
		t.Errorf("after five passes: %d BMC connections, LastError %q, failures %d, lifecycle %s; want none, none, 0, allocated", drivers.opened, srv.LastError, srv.Failures, srv.Lifecycle)
	}
}

// TestReleaseDeletesOnlyCreatedVolumes: release deletes the RAID volumes
// Machina recorded as created, and only those (bmcsim's Lenovo XCC tree
// over the real Redfish driver; XCC creates and deletes at once, and its
// M.2 controller holds one RAID1 volume over its two drives):
//   - a volume "data" made by someone else, while Machina's record names
//     "M.2/os": no DELETE, "data" still listed, the record emptied;
//   - "os" made and recorded by Machina: one DELETE, gone from the
//     stored read, the record emptied.
func TestReleaseDeletesOnlyCreatedVolumes(t *testing.T) {
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	dir, err := bmcsim.TreeDir("", "lenovo-thinksystem-sr670v2-xcc")
	if err != nil {
		t.Fatal(err)
	}
	tr, err := bmcsim.LoadTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "admin", Password: "pw", Power: bmcsim.NewMemoryPower(false)})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim)
	defer ts.Close()
	ctx := context.Background()
	drv, err := simDrivers{url: ts.URL, log: log}.Driver(ctx, state.Server{})
	if err != nil {
		t.Fatal(err)
	}
	rc := drv.(bmc.RAIDConfigurer)
	ctrls, err := rc.Storage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var drives []string
	for _, c := range ctrls {
		if c.ID == "M.2" {
			for _, d := range c.Drives {
				drives = append(drives, d.ID)
			}
		}
	}
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ws := inventory.Server{Name: "s1", Zone: "z", BootMAC: "52:54:00:00:00:01", BMC: inventory.BMC{Driver: inventory.DriverRedfish, Address: ts.URL, Credentials: "c"}}
	if _, err := st.CreateServer(plan.Record(&ws)); err != nil {
		t.Fatal(err)
	}
	ctl, err := New(Config{Store: st, Drivers: simDrivers{url: ts.URL, log: log}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		volume     string // made on M.2 before the release
		wantDelete int
		wantKept   bool
	}{{"data", 0, true}, {"os", 1, false}} {
		if _, err := rc.CreateVolume(ctx, bmc.VolumeRequest{Controller: "M.2", Name: c.volume, RAIDType: "RAID1", Drives: drives}); err != nil {
			t.Fatalf("create %s: %v", c.volume, err)
		}
		obs, err := st.UpdateServer("s1", func(s *state.Server) error {
			s.Firmware = &state.Firmware{CreatedVolumes: []string{"M.2/os"}}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		sim.ClearRequests()
		x := &stepCtx{step: plan.Step{Server: "s1", Action: plan.ActRelease}, obs: obs, drv: drv, log: log}
		if err := ctl.deleteCreatedVolumes(ctx, x); err != nil {
			t.Fatal(err)
		}
		deletes := 0
		for _, q := range sim.Requests() {
			if q.Method == http.MethodDelete {
				deletes++
			}
		}
		srv, err := st.Server("s1")
		if err != nil {
			t.Fatal(err)
		}
		var vid string
		for _, sc := range srv.Firmware.Storage {
			for _, v := range sc.Volumes {
				if sc.ID == "M.2" && v.Name == c.volume {
					vid = v.ID
				}
			}
		}
		if deletes != c.wantDelete || (vid != "") != c.wantKept || len(srv.Firmware.CreatedVolumes) != 0 {
			t.Errorf("%s: %d DELETEs, still listed %v, created %v; want %d DELETEs, listed %v, none recorded", c.volume, deletes, vid != "", srv.Firmware.CreatedVolumes, c.wantDelete, c.wantKept)
		}
		if vid != "" {
			if _, err := rc.DeleteVolume(ctx, "M.2", vid); err != nil { // the operator's own clean-up
				t.Fatal(err)
			}
		}
	}
}
