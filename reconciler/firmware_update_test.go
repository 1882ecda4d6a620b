package reconciler

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

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

	mu       sync.Mutex
	live     map[string]string // offer path → catalog name
	seq      int
	offers   int
	released int
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

func (fi *testFirmwareImages) Open(_ context.Context, name, _ string) (io.ReadCloser, string, error) {
	return io.NopCloser(bytes.NewReader(fi.files[name])), fi.names[name], nil
}

// TestFirmwareUpdateThroughBMC runs the firmware step of an allocated
// server whose profile wants BIOS 1.9.0 against bmcsim's Dell iDRAC 9
// tree over the real Redfish driver, the BMC fetching the offered file
// itself (bmcsim FetchImages) and restarting after the update (the next
// request dropped, then 503s):
//   - ok: one SimpleUpdate, one fetch of the offered file with its
//     bytes, the task followed through the restart, FirmwareInventory
//     read back at 1.9.0, the offer released, no error;
//   - transfer fails (the file answers 404): the task ends in Exception
//     with Update.1.0.TransferFailed, the step fails and stalls the
//     server with that reason, and five more passes send nothing more:
//     one SimpleUpdate, one fetch in all; never deployed.
func TestFirmwareUpdateThroughBMC(t *testing.T) {
	for _, c := range []struct {
		name    string
		missing bool
	}{{"ok", false}, {"transfer fails", true}} {
		t.Run(c.name, func(t *testing.T) {
			log := slog.New(slog.NewTextHandler(t.Output(), nil))
			dir, err := bmcsim.TreeDir("", "dell-poweredge-r750-idrac9")
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
			sum := imgs.add("dell-bios", "BIOS_1.9.0.bin", body)

			st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			inv := &inventory.Inventory{
				Servers: []inventory.Server{{Name: "s1", Zone: "z", BootMAC: "52:54:00:00:00:01", BootMode: inventory.BootUEFI, Want: inventory.WantDeployed, Profile: "p",
					BMC: inventory.BMC{Driver: inventory.DriverRedfish, Address: ts.URL, Credentials: "c"}}},
				Profiles: []inventory.Profile{{Name: "p", Image: "img", Deploy: inventory.DeployImage,
					Firmware: &inventory.Firmware{Versions: []inventory.FirmwareVersion{{Component: "BIOS", Version: "1.9.0", Image: "dell-bios"}}}}},
				Images:         []inventory.Image{{Name: "img", URL: "http://x/img.raw", Checksum: "sha256:" + strings.Repeat("0", 64)}},
				FirmwareImages: []inventory.FirmwareImage{{Name: "dell-bios", URL: "http://mirror/BIOS_1.9.0.bin", Checksum: sum, SizeBytes: int64(len(body))}},
				Digest:         "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			}
			ws := inv.Servers[0]
			if _, err := st.CreateServer(plan.Record(&ws)); err != nil {
				t.Fatal(err)
			}
			for _, m := range [][2]state.Lifecycle{{state.LifecycleNew, state.LifecycleCommissioning}, {state.LifecycleCommissioning, state.LifecycleReady}, {state.LifecycleReady, state.LifecycleAllocated}} {
				if _, err := st.Transition("s1", m[0], m[1], "test"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := st.UpdateServer("s1", func(s *state.Server) error {
				s.Allocation = &state.Allocation{Profile: "p", Reason: plan.ReasonPinned, At: time.Now()}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			ctl, err := New(Config{Store: st, Drivers: simDrivers{url: ts.URL, log: log}, Logger: log, FirmwareImages: imgs, FirmwareTaskPoll: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctl.SetDesired(inv)
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
			updates := 0
			for _, q := range sim.Requests() {
				if q.Method == http.MethodPost && strings.HasSuffix(q.Path, "UpdateService.SimpleUpdate") {
					updates++
				}
			}
			fetches := sim.ImageFetches()
			if updates != 1 || len(fetches) != 1 {
				t.Fatalf("%d SimpleUpdate requests and %d fetches over %d passes (%+v); want one each", updates, len(fetches), passes, fetches)
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
				got := ""
				for _, fc := range srv.Firmware.Components {
					if got == "" && strings.EqualFold(fc.Name, "BIOS") {
						got = fc.Version // the first listed, as the plan reads it (iDRAC lists Current-, Installed- and Previous- entries)
					}
				}
				if got != "1.9.0" {
					t.Errorf("BIOS read back %q, want 1.9.0 (%+v)", got, srv.Firmware.Components)
				}
				return
			}
			if fetches[0].Status != http.StatusNotFound {
				t.Errorf("fetch %+v; want the 404 of the missing file", fetches[0])
			}
			if !strings.Contains(srv.LastError, "update BIOS to 1.9.0") || !strings.Contains(srv.LastError, "TransferFailed") || srv.Stalled == "" {
				t.Errorf("LastError %q stalled %q; want the failed update's task message and a stall", srv.LastError, srv.Stalled)
			}
		})
	}
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
	obs := func(n string) state.Server {
		return state.Server{Name: n, Rack: "r1", BMC: state.BMCFacts{Address: "https://chassis-1"}}
	}
	fw := func(n string) plan.Step { return plan.Step{Server: n, Action: plan.ActFirmware, Profile: "p"} }
	now := time.Now()
	if !c.tryStart(fw("s1"), obs("s1"), now) {
		t.Fatal("the first firmware step did not start")
	}
	if c.tryStart(fw("s2"), obs("s2"), now) {
		t.Fatal("a second firmware step started against the same BMC")
	}
	if !c.tryStart(plan.Step{Server: "s3", Action: plan.ActPowerOn}, obs("s3"), now) {
		t.Error("a power step was held by the firmware step (PerBMC 2 allows it)")
	}
	c.unreserve(fw("s1"), obs("s1"))
	if !c.tryStart(fw("s2"), obs("s2"), now) {
		t.Error("the second firmware step did not start after the first ended")
	}
}
