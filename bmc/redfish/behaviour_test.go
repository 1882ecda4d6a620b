package redfish_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
)

func TestFaultUnavailableRetried(t *testing.T) {
	l := newLab(t, treeDell, labOpts{on: false})
	// Two 503s (one with Retry-After: 1) on the Reset, then success.
	l.sim.Inject(bmcsim.Fault{Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset", Kind: bmcsim.FaultUnavailable, Times: 1})
	l.sim.Inject(bmcsim.Fault{Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset", Kind: bmcsim.FaultUnavailable, Times: 1, RetryAfter: time.Second})
	start := time.Now()
	if err := l.drv.Power(context.Background(), bmc.PowerActionOn); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < time.Second {
		t.Errorf("Retry-After: 1 not honoured: done after %v", el)
	}
	want := []string{
		`POST /redfish/v1/Systems/System.Embedded.1/Actions/ComputerSystem.Reset {"ResetType":"On"}`,
		`POST /redfish/v1/Systems/System.Embedded.1/Actions/ComputerSystem.Reset {"ResetType":"On"}`,
		`POST /redfish/v1/Systems/System.Embedded.1/Actions/ComputerSystem.Reset {"ResetType":"On"}`,
	}
	if diff := cmp.Diff(want, l.writes()); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	if !l.power.On() {
		t.Error("machine not on")
	}
}

func TestFaultUnavailableExhausted(t *testing.T) {
	l := newLab(t, treeDell, labOpts{on: false, tune: func(c *redfish.Config) { c.Retries = 2 }})
	l.sim.Inject(bmcsim.Fault{PathSuffix: "/Actions/ComputerSystem.Reset", Kind: bmcsim.FaultBadGateway})
	err := l.drv.Power(context.Background(), bmc.PowerActionOn)
	if !errors.Is(err, bmc.ErrTransient) || !bmc.IsTransient(err) {
		t.Fatalf("err = %v, want ErrTransient", err)
	}
	var be *bmc.BMCError
	if !errors.As(err, &be) || be.Status != 502 {
		t.Fatalf("err = %#v, want *bmc.BMCError with status 502", err)
	}
	if n := len(l.writes()); n != 3 {
		t.Errorf("sent %d resets, want 3 (1 + 2 retries)", n)
	}
}

func TestFaultTaskMonitorFollowed(t *testing.T) {
	l := newLab(t, treeSupermicro, labOpts{on: false})
	l.sim.Inject(bmcsim.Fault{PathSuffix: "/Actions/ComputerSystem.Reset", Kind: bmcsim.FaultAccepted, TaskPolls: 3})
	if err := l.drv.Power(context.Background(), bmc.PowerActionOn); err != nil {
		t.Fatal(err)
	}
	polls := 0
	for _, r := range l.sim.Requests() {
		if strings.HasPrefix(r.Path, "/redfish/v1/TaskService/TaskMonitors/") {
			polls++
		}
	}
	if polls != 4 {
		t.Errorf("task monitor polled %d times, want 4 (3 Running + Completed)", polls)
	}
}

func TestFaultTaskFails(t *testing.T) {
	l := newLab(t, treeSupermicro, labOpts{on: false})
	l.sim.Inject(bmcsim.Fault{PathSuffix: "/Actions/ComputerSystem.Reset", Kind: bmcsim.FaultAccepted, TaskPolls: 1, TaskFails: true})
	err := l.drv.Power(context.Background(), bmc.PowerActionOn)
	var be *bmc.BMCError
	if !errors.As(err, &be) || be.Code != "TaskException" || !strings.Contains(be.Message, "failed") {
		t.Fatalf("err = %v, want task exception with the BMC's message", err)
	}
	if l.power.On() {
		t.Error("failed task changed power")
	}
}

func TestFaultDroppedResetReReadsPower(t *testing.T) {
	l := newLab(t, treeHPE, labOpts{on: false})
	l.sim.Inject(bmcsim.Fault{Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset", Kind: bmcsim.FaultDrop, Times: 1})
	if err := l.drv.Power(context.Background(), bmc.PowerActionOn); err != nil {
		t.Fatal(err)
	}
	// The dropped reset is followed by a GET of the System (power re-read)
	// before the second reset.
	var seq []string
	for _, r := range l.sim.Requests() {
		if r.Path == "/redfish/v1/Systems/1" || strings.HasSuffix(r.Path, "ComputerSystem.Reset") {
			seq = append(seq, r.Method+" "+r.Path)
		}
	}
	i := indexOf(seq, "POST /redfish/v1/Systems/1/Actions/ComputerSystem.Reset")
	if i < 0 || i+2 >= len(seq) || seq[i+1] != "GET /redfish/v1/Systems/1" || seq[i+2] != "POST /redfish/v1/Systems/1/Actions/ComputerSystem.Reset" {
		t.Errorf("sequence %v: want reset, GET system, reset", seq)
	}
	if !l.power.On() {
		t.Error("machine not on")
	}
}

func TestFaultAppliedResetAnswerLostNotRepeated(t *testing.T) {
	// The BMC applies the reset but the connection drops before the
	// answer: the driver re-reads power, sees On, and sends nothing more.
	l := newLab(t, treeHPE, labOpts{on: false})
	l.sim.Inject(bmcsim.Fault{Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset", Kind: bmcsim.FaultDropAfter, Times: 1})
	if err := l.drv.Power(context.Background(), bmc.PowerActionOn); err != nil {
		t.Fatal(err)
	}
	if got := len(l.writes()); got != 1 {
		t.Errorf("resets sent = %d, want 1", got)
	}
	if n := l.power.Resets["On"]; n != 1 {
		t.Errorf("backend got %d On resets, want 1", n)
	}
}

func TestTimedOutResetReReadsBeforeResending(t *testing.T) {
	// FaultSlow holds the reset past the client timeout; the emulator
	// drops it unapplied when the client goes away. The driver re-reads
	// power (still Off) before sending it again.
	l := newLab(t, treeHPE, labOpts{on: false, tune: func(c *redfish.Config) { c.Timeout = 200 * time.Millisecond }})
	l.sim.Inject(bmcsim.Fault{Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset", Kind: bmcsim.FaultSlow, Delay: 10 * time.Second, Times: 1})
	if err := l.drv.Power(context.Background(), bmc.PowerActionOn); err != nil {
		t.Fatal(err)
	}
	if got := len(l.writes()); got != 2 {
		t.Errorf("resets sent = %d, want 2 (timed out one, then one after re-read)", got)
	}
	if !l.power.On() {
		t.Error("machine not on")
	}
}

func TestSlowGETRetried(t *testing.T) {
	l := newLab(t, treeDMTF, labOpts{on: true, tune: func(c *redfish.Config) { c.Timeout = 100 * time.Millisecond }})
	l.sim.Inject(bmcsim.Fault{Method: "GET", PathSuffix: "/Systems/437XR1138R2", Kind: bmcsim.FaultSlow, Delay: 5 * time.Second, Times: 1})
	ps, err := l.drv.PowerState(context.Background())
	if err != nil || ps != bmc.PowerOn {
		t.Fatalf("PowerState() = %v, %v; want on", ps, err)
	}
}

func TestDroppedGETRetried(t *testing.T) {
	l := newLab(t, treeOpenBMC, labOpts{on: false})
	l.sim.Inject(bmcsim.Fault{Method: "GET", PathSuffix: "/Systems/system", Kind: bmcsim.FaultDrop, Times: 2})
	ps, err := l.drv.PowerState(context.Background())
	if err != nil || ps != bmc.PowerOff {
		t.Fatalf("PowerState() = %v, %v; want off after two dropped connections", ps, err)
	}
}

func TestConcurrentUse(t *testing.T) {
	// One driver used from several goroutines (the reconciler serialises
	// per server, but status reads may overlap): one session, no races.
	l := newLab(t, treeDell, labOpts{on: true})
	errc := make(chan error, 8)
	for range 8 {
		go func() {
			_, err := l.drv.PowerState(context.Background())
			errc <- err
		}()
	}
	for range 8 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if n := l.sim.Sessions(); n != 1 {
		t.Errorf("sessions = %d, want 1", n)
	}
}

func TestUnreachable(t *testing.T) {
	drv, err := redfish.New(redfish.Config{Endpoint: "http://127.0.0.1:1", Username: "a", Password: "b", Retries: -1, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = drv.PowerState(context.Background())
	if !errors.Is(err, bmc.ErrUnreachable) {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
}

func TestSessionReusedRecreatedOn401AndDeleted(t *testing.T) {
	l := newLab(t, treeDell, labOpts{on: true})
	ctx := context.Background()
	for range 3 {
		if _, err := l.drv.PowerState(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := countLogins(l.sim); n != 1 {
		t.Errorf("logins after 3 calls = %d, want 1 (session reused)", n)
	}
	l.sim.ExpireSessions()
	if _, err := l.drv.PowerState(ctx); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if n := countLogins(l.sim); n != 2 {
		t.Errorf("logins after expiry = %d, want 2", n)
	}
	// Expiry injected in the middle of an operation.
	l.sim.Inject(bmcsim.Fault{Method: "POST", PathSuffix: "ComputerSystem.Reset", Kind: bmcsim.FaultExpireSession, Times: 1})
	if err := l.drv.Power(ctx, bmc.PowerActionOff); err != nil {
		t.Fatalf("power off across expiry: %v", err)
	}
	if n := l.sim.Sessions(); n != 1 {
		t.Errorf("live sessions = %d, want 1", n)
	}
	if err := l.drv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := l.sim.Sessions(); n != 0 {
		t.Errorf("live sessions after Close = %d, want 0", n)
	}
	if err := l.drv.Close(ctx); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for _, r := range l.sim.Requests() {
		if r.Auth == "basic" {
			t.Errorf("basic auth used with sessions available: %v", r)
		}
	}
}

func countLogins(sim *bmcsim.Server) int {
	n := 0
	for _, r := range sim.Requests() {
		if r.Method == "POST" && strings.EqualFold(r.Path, "/redfish/v1/SessionService/Sessions") {
			n++
		}
	}
	return n
}

func TestBasicAuthFallback(t *testing.T) {
	l := newLab(t, treeOpenBMC, labOpts{on: false, quirks: &bmcsim.Quirks{NoSessions: true}})
	if err := l.drv.Power(context.Background(), bmc.PowerActionOn); err != nil {
		t.Fatal(err)
	}
	basic := 0
	for _, r := range l.sim.Requests() {
		if r.Auth == "basic" {
			basic++
		}
		if r.Auth == "session" {
			t.Errorf("session auth used: %v", r)
		}
	}
	if basic == 0 {
		t.Error("no request used basic auth")
	}
}

func TestWrongPasswordAndLockout(t *testing.T) {
	tr := loadTree(t, treeDell)
	sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "admin", Password: "right", LockoutThreshold: 3})
	if err != nil {
		t.Fatal(err)
	}
	l := newLabWith(t, sim)
	for i := range 3 {
		drv := l.driver(t, "wrong")
		_, err := drv.PowerState(context.Background())
		if !errors.Is(err, bmc.ErrAuth) {
			t.Fatalf("attempt %d: err = %v, want ErrAuth", i, err)
		}
	}
	if !sim.Locked() {
		t.Fatal("account not locked after 3 failures")
	}
	_, err = l.driver(t, "right").PowerState(context.Background())
	if !errors.Is(err, bmc.ErrAuth) {
		t.Fatalf("locked account: err = %v, want ErrAuth", err)
	}
	if n := countLogins(sim); n != 4 {
		t.Errorf("login attempts = %d, want 4 (ErrAuth is not retried)", n)
	}
	for _, r := range sim.Requests() {
		if b, _ := json.Marshal(r.Body); strings.Contains(string(b), "wrong") || strings.Contains(string(b), "right") {
			t.Errorf("password recorded in clear: %s", b)
		}
	}
}

func TestETagRequiredAfter428(t *testing.T) {
	// Supermicro bodies carry @odata.etag; make the emulator insist on
	// If-Match. The driver's Supermicro row does not send it up front.
	q := bmcsim.DefaultQuirks("Supermicro")
	q.RequireIfMatch = true
	l := newLab(t, treeSupermicro, labOpts{on: true, quirks: &q})
	if err := l.drv.SetBootOverride(context.Background(), bmc.BootOverride{Device: bmc.BootPXE}); err != nil {
		t.Fatal(err)
	}
	var st []int
	for _, r := range l.sim.Requests() {
		if r.Method == "PATCH" {
			st = append(st, r.Status)
			if r.Status == 204 && r.IfMatch == "" {
				t.Errorf("successful PATCH without If-Match")
			}
		}
	}
	if diff := cmp.Diff([]int{428, 204}, st); diff != "" {
		t.Errorf("PATCH statuses (-want +got):\n%s", diff)
	}
}

func TestETagGzipSuffixNormalised(t *testing.T) {
	q := bmcsim.DefaultQuirks("Lenovo")
	q.ETagGzipSuffix = true
	l := newLab(t, treeLenovo, labOpts{on: true, quirks: &q})
	if err := l.drv.SetBootOverride(context.Background(), bmc.BootOverride{Device: bmc.BootPXE}); err != nil {
		t.Fatal(err)
	}
	var ims []string
	for _, r := range l.sim.Requests() {
		if r.Method == "PATCH" {
			ims = append(ims, r.IfMatch+" "+itoa(r.Status))
		}
	}
	if len(ims) != 2 || !strings.Contains(ims[0], "-gzip") || !strings.HasSuffix(ims[0], "412") || strings.Contains(ims[1], "-gzip") || !strings.HasSuffix(ims[1], "204") {
		t.Errorf("PATCH If-Match/status = %v; want -gzip 412, then normalised 204", ims)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func TestETagDisabled(t *testing.T) {
	q := bmcsim.DefaultQuirks("Lenovo")
	l := newLab(t, treeLenovo, labOpts{on: true, quirks: &q, tune: func(c *redfish.Config) { c.DisableETag = true }})
	err := l.drv.SetBootOverride(context.Background(), bmc.BootOverride{Device: bmc.BootPXE})
	var be *bmc.BMCError
	if !errors.As(err, &be) || be.Status != 428 {
		t.Fatalf("err = %v, want the BMC's 428", err)
	}
	for _, r := range l.sim.Requests() {
		if r.IfMatch != "" {
			t.Errorf("If-Match sent with ETags disabled: %v", r)
		}
	}
}

// TestOnceNotHonoured: a BMC that stores Continuous for Once, or keeps its
// old override, yields a *bmc.OnceError saying what it did and what it is
// set to now, instead of a bare mismatch after the PATCH applied.
func TestOnceNotHonoured(t *testing.T) {
	for _, tc := range []struct {
		name    string
		set     func(*bmcsim.Quirks)
		outcome bmc.OnceOutcome
		got     bmc.BootOverride
	}{
		{"coerced", func(q *bmcsim.Quirks) { q.StoreContinuousForOnce = true }, bmc.OnceCoerced, bmc.BootOverride{Device: bmc.BootPXE, Persistent: true, Mode: bmc.BootModeUEFI}},
		{"ignored", func(q *bmcsim.Quirks) { q.IgnoreOnce = true }, bmc.OnceIgnored, bmc.BootOverride{}},
		{"honoured", func(*bmcsim.Quirks) {}, bmc.OnceHonoured, bmc.BootOverride{Device: bmc.BootPXE, Mode: bmc.BootModeUEFI}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := bmcsim.DefaultQuirks("Dell")
			tc.set(&q)
			l := newLab(t, treeDell, labOpts{on: true, quirks: &q})
			err := l.drv.SetBootOverride(context.Background(), bmc.BootOverride{Device: bmc.BootPXE})
			var oe *bmc.OnceError
			if tc.outcome == bmc.OnceHonoured {
				if err != nil {
					t.Fatal(err)
				}
			} else {
				if !errors.As(err, &oe) || !errors.Is(err, bmc.ErrOnceNotHonoured) {
					t.Fatalf("err = %v, want *bmc.OnceError", err)
				}
				if oe.Outcome != tc.outcome {
					t.Errorf("Outcome = %s, want %s", oe.Outcome, tc.outcome)
				}
			}
			got, err := l.drv.BootOverride(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.got {
				t.Errorf("BMC now set to %+v, want %+v", got, tc.got)
			}
			if oe != nil && oe.Got != got {
				t.Errorf("OnceError.Got = %+v, read %+v", oe.Got, got)
			}
		})
	}
}

func TestBootModeRevertCaught(t *testing.T) {
	// Supermicro reverts the mode when a PATCH leaves it out; the quirk row
	// makes the driver send it. Prove the read back would catch the revert
	// by serving the same tree under another manufacturer's name.
	tr := loadTree(t, treeSupermicro)
	q := bmcsim.DefaultQuirks("Supermicro")
	l := newLab(t, "", labOpts{on: true, quirks: &q, tree: tr})
	if err := l.drv.SetBootOverride(context.Background(), bmc.BootOverride{Device: bmc.BootPXE}); err != nil {
		t.Fatalf("with quirk: %v", err)
	}
	got := l.sim.Get("/redfish/v1/Systems/1")["Boot"].(map[string]any)["BootSourceOverrideMode"]
	if got != "UEFI" {
		t.Errorf("mode after PATCH = %v, want UEFI kept", got)
	}
	// A Dell tree with the Supermicro revert behaviour: the Dell row does
	// not send the mode, so the revert shows up as a mismatch.
	l2 := newLab(t, treeDell, labOpts{on: true, quirks: &q})
	err := l2.drv.SetBootOverride(context.Background(), bmc.BootOverride{Device: bmc.BootPXE, Mode: bmc.BootModeUEFI})
	if !errors.Is(err, bmc.ErrMismatch) || !strings.Contains(err.Error(), "BootSourceOverrideMode want UEFI") {
		t.Fatalf("err = %v, want mode mismatch", err)
	}
}

func TestInsertMediaAddsAskedParameter(t *testing.T) {
	// An AMI-style BMC asks for TransferProtocolType (sushy
	// *_required_error.json); the driver adds it and nothing else.
	q := bmcsim.DefaultQuirks("HPE")
	q.RequireInsertParams = []string{"TransferProtocolType"}
	l := newLab(t, treeHPE, labOpts{on: true, quirks: &q})
	if err := l.drv.InsertMedia(context.Background(), isoURL); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`POST /redfish/v1/Managers/1/VirtualMedia/2/Actions/VirtualMedia.InsertMedia {"Image":"` + isoURL + `"}`,
		`POST /redfish/v1/Managers/1/VirtualMedia/2/Actions/VirtualMedia.InsertMedia {"Image":"` + isoURL + `","TransferProtocolType":"HTTP"}`,
	}
	if diff := cmp.Diff(want, l.writes()); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
}

func TestEjectWhenImageKept(t *testing.T) {
	// Some BMCs keep Image after an eject; Inserted=false/NotConnected is
	// what counts, so a second eject sends nothing and insert does not
	// eject again.
	q := bmcsim.DefaultQuirks("Dell")
	q.KeepImageAfterEject = true
	l := newLab(t, treeDell, labOpts{on: true, quirks: &q})
	ctx := context.Background()
	if err := l.drv.InsertMedia(ctx, isoURL); err != nil {
		t.Fatal(err)
	}
	if err := l.drv.EjectMedia(ctx); err != nil {
		t.Fatal(err)
	}
	l.sim.ClearRequests()
	if err := l.drv.EjectMedia(ctx); err != nil {
		t.Fatal(err)
	}
	if w := l.writes(); len(w) != 0 {
		t.Errorf("second eject sent %v", w)
	}
}

func TestInsertReplacesInsertedMedium(t *testing.T) {
	l := newLab(t, treeDell, labOpts{on: true})
	ctx := context.Background()
	if err := l.drv.InsertMedia(ctx, isoURL); err != nil {
		t.Fatal(err)
	}
	l.sim.ClearRequests()
	other := "https://10.0.0.1/other.iso"
	if err := l.drv.InsertMedia(ctx, other); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`POST /redfish/v1/Systems/System.Embedded.1/VirtualMedia/1/Actions/VirtualMedia.EjectMedia {}`,
		`POST /redfish/v1/Systems/System.Embedded.1/VirtualMedia/1/Actions/VirtualMedia.InsertMedia {"Image":"` + other + `"}`,
	}
	if diff := cmp.Diff(want, l.writes()); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
}

func TestResetTypeFallbackWithoutAllowableValues(t *testing.T) {
	// A System that lists no AllowableValues and refuses PowerCycle: the
	// driver tries PowerCycle, then falls back to ForceRestart.
	dir := t.TempDir()
	writeTree(t, dir, multiSystemTree(1, false))
	tr, err := bmcsim.LoadTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	l := newLab(t, "", labOpts{on: true, tree: tr, quirks: &bmcsim.Quirks{RefuseResetTypes: []string{"PowerCycle"}}})
	// The generated tree has no LastResetTime: accepted, not proven.
	if err := l.drv.Power(context.Background(), bmc.PowerActionCycle); err != nil && !errors.Is(err, bmc.ErrUnverified) {
		t.Fatal(err)
	}
	want := []string{
		`POST /redfish/v1/Systems/s0/Actions/ComputerSystem.Reset {"ResetType":"PowerCycle"}`,
		`POST /redfish/v1/Systems/s0/Actions/ComputerSystem.Reset {"ResetType":"ForceRestart"}`,
	}
	if diff := cmp.Diff(want, l.writes()); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
}

// An empty Systems collection says so, not "no system with the given ID"
// when no ID was given.
func TestEmptySystemsCollection(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, multiSystemTree(0, false))
	tr, err := bmcsim.LoadTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	l := newLab(t, "", labOpts{tree: tr})
	_, err = l.drv.PowerState(context.Background())
	if !errors.Is(err, redfish.ErrNoSystems) || strings.Contains(err.Error(), "given ID") || !strings.Contains(err.Error(), "lists no systems") {
		t.Fatalf("empty Systems: %v, want ErrNoSystems saying the BMC lists none", err)
	}
}

func TestSystemSelectionFailsClosed(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, multiSystemTree(3, false))
	tr, err := bmcsim.LoadTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id      string
		wantErr error
	}{
		{"", redfish.ErrAmbiguousSystem},
		{"nope", redfish.ErrNoSuchSystem},
		{"s1", nil},
	} {
		t.Run("id="+tc.id, func(t *testing.T) {
			l := newLab(t, "", labOpts{on: false, tree: tr, tune: func(c *redfish.Config) { c.SystemID = tc.id }})
			ctx := context.Background()
			errs := []error{
				l.drv.Power(ctx, bmc.PowerActionOn),
				l.drv.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootPXE}),
			}
			for _, err := range errs {
				if tc.wantErr == nil && err != nil {
					t.Fatal(err)
				}
				if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
			}
			if tc.wantErr != nil {
				if w := l.writes(); len(w) != 0 {
					t.Errorf("writes sent despite failed selection: %v", w)
				}
				return
			}
			want := []string{
				`POST /redfish/v1/Systems/s1/Actions/ComputerSystem.Reset {"ResetType":"On"}`,
				`PATCH /redfish/v1/Systems/s1 {"Boot":{"BootSourceOverrideEnabled":"Once","BootSourceOverrideTarget":"Pxe"}}`,
			}
			if diff := cmp.Diff(want, l.writes()); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNoBootOverrideIsUnsupportedUpFront(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, multiSystemTree(1, true))
	tr, err := bmcsim.LoadTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	l := newLab(t, "", labOpts{on: true, tree: tr})
	err = l.drv.SetBootOverride(context.Background(), bmc.BootOverride{Device: bmc.BootPXE})
	if !errors.Is(err, bmc.ErrUnsupported) {
		t.Fatalf("err = %v, want ErrUnsupported", err)
	}
	if w := l.writes(); len(w) != 0 {
		t.Errorf("writes = %v, want none", w)
	}
}

func TestSoftOffFallsBackToForceOff(t *testing.T) {
	l := newLab(t, treeLenovo, labOpts{on: true})
	l.power.IgnoreGraceful = true // the OS ignores the ACPI request
	if err := l.drv.Power(context.Background(), bmc.PowerActionSoftOff); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`POST /redfish/v1/Systems/1/Actions/ComputerSystem.Reset {"ResetType":"GracefulShutdown"}`,
		`POST /redfish/v1/Systems/1/Actions/ComputerSystem.Reset {"ResetType":"ForceOff"}`,
	}
	if diff := cmp.Diff(want, l.writes()); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	if l.power.On() {
		t.Error("machine still on")
	}
}

func TestCycleWithoutRestartTypes(t *testing.T) {
	// A BMC that lists only On and ForceOff: cycle is ForceOff, wait for
	// Off, then On. No other ResetType is sent.
	dir := t.TempDir()
	files := multiSystemTree(1, false)
	sys := files["redfish/v1/Systems/s0"].(map[string]any)
	sys["Actions"].(map[string]any)["#ComputerSystem.Reset"].(map[string]any)["ResetType@Redfish.AllowableValues"] = []any{"On", "ForceOff"}
	writeTree(t, dir, files)
	tr, err := bmcsim.LoadTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	l := newLab(t, "", labOpts{on: true, tree: tr})
	l.power.Lag = 2 // power changes show after two reads
	if err := l.drv.Power(context.Background(), bmc.PowerActionCycle); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`POST /redfish/v1/Systems/s0/Actions/ComputerSystem.Reset {"ResetType":"ForceOff"}`,
		`POST /redfish/v1/Systems/s0/Actions/ComputerSystem.Reset {"ResetType":"On"}`,
	}
	if diff := cmp.Diff(want, l.writes()); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	if !l.power.On() {
		t.Error("machine not on after cycle")
	}
	// Soft-off has no GracefulShutdown here: straight to ForceOff.
	l.sim.ClearRequests()
	if err := l.drv.Power(context.Background(), bmc.PowerActionSoftOff); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{want[0]}, l.writes()); diff != "" {
		t.Errorf("soft-off writes (-want +got):\n%s", diff)
	}
}

// TestPowerTimeout: a BMC that never reports the new state times out naming
// both states. The 500 ms limit leaves room for the first PowerState read
// under -race on a loaded machine (with 30 ms the read was cut short and the
// error said "still unknown").
func TestPowerTimeout(t *testing.T) {
	// The BMC never reports the new state, nor a host start
	// (LastResetTime/BootProgress would count as one: waitPower).
	q := bmcsim.DefaultQuirks("Dell")
	q.NoLastResetTime = true
	l := newLab(t, treeDell, labOpts{on: false, quirks: &q, tune: func(c *redfish.Config) { c.PowerTimeout = 500 * time.Millisecond }})
	l.power.Lag = 1 << 30
	err := l.drv.Power(context.Background(), bmc.PowerActionOn)
	if !errors.Is(err, bmc.ErrTimeout) || !strings.Contains(err.Error(), "want on, still off") {
		t.Fatalf("err = %v, want ErrTimeout naming both states", err)
	}
}

func TestBootPatch400ButApplied(t *testing.T) {
	q := bmcsim.DefaultQuirks("Dell")
	q.BootPatchAnswers400 = true
	l := newLab(t, treeDell, labOpts{on: true, quirks: &q})
	if err := l.drv.SetBootOverride(context.Background(), bmc.BootOverride{Device: bmc.BootDisk}); err != nil {
		t.Fatalf("read back matched, yet: %v", err)
	}
}

// A 503 on session login is a busy BMC, not a missing session service:
// it is retried and a session is still used (it fell back to Basic before
// the Redfish emulator a third-party lab ran, which hid a flapping session service behind Basic auth).
func TestSessionLoginBusyIsRetriedNotBasic(t *testing.T) {
	l := newLab(t, treeDMTF, labOpts{on: true})
	l.sim.Inject(bmcsim.Fault{Method: "POST", PathSuffix: "/SessionService/Sessions", Kind: bmcsim.FaultUnavailable, Times: 1})
	if _, err := l.drv.PowerState(context.Background()); err != nil {
		t.Fatal(err)
	}
	last := l.sim.Requests()[len(l.sim.Requests())-1]
	if last.Auth != "session" || l.drv.AuthScheme() != redfish.AuthSession {
		t.Errorf("last request auth = %q, scheme %q, want session", last.Auth, l.drv.AuthScheme())
	}
}

func TestPinnedCA(t *testing.T) {
	tr := loadTree(t, treeOpenBMC)
	sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "admin", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(sim)
	defer ts.Close()
	pool := x509.NewCertPool()
	pool.AddCert(ts.Certificate())
	for _, tc := range []struct {
		name string
		cfg  redfish.Config
		ok   bool
	}{
		{"verified by default", redfish.Config{}, false},
		{"pinned CA", redfish.Config{RootCAs: pool}, true},
		{"insecure opt-out", redfish.Config{Insecure: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			c.Endpoint, c.Username, c.Password, c.Retries = ts.URL, "admin", "pw", -1
			drv, err := redfish.New(c)
			if err != nil {
				t.Fatal(err)
			}
			defer drv.Close(context.Background())
			_, err = drv.PowerState(context.Background())
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && (!errors.Is(err, redfish.ErrTLS) || bmc.IsTransient(err)) {
				t.Errorf("TLS failure = %v, want ErrTLS, not transient", err)
			}
		})
	}
}

// multiSystemTree is a minimal Redfish tree with n Systems s0..s(n-1) whose
// Reset lists no AllowableValues; noBoot drops the Boot object.
func multiSystemTree(n int, noBoot bool) map[string]any {
	files := map[string]any{
		"redfish/v1": map[string]any{"@odata.id": "/redfish/v1", "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
			"Systems": map[string]any{"@odata.id": "/redfish/v1/Systems"}, "SessionService": map[string]any{"@odata.id": "/redfish/v1/SessionService"},
			"Links": map[string]any{"Sessions": map[string]any{"@odata.id": "/redfish/v1/SessionService/Sessions"}}},
		"redfish/v1/SessionService/Sessions": map[string]any{"@odata.id": "/redfish/v1/SessionService/Sessions", "Members": []any{}},
	}
	var ms []any
	for i := range n {
		id := "s" + itoa(i)
		p := "/redfish/v1/Systems/" + id
		ms = append(ms, map[string]any{"@odata.id": p})
		sys := map[string]any{"@odata.id": p, "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem", "Id": id,
			"Manufacturer": 42, "Model": "Synthetic", "PowerState": "Off",
			"Status":  map[string]any{"Health": "Warning"},
			"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{"target": p + "/Actions/ComputerSystem.Reset"}},
		}
		if !noBoot {
			sys["Boot"] = map[string]any{"BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None"}
		}
		files["redfish/v1/Systems/"+id] = sys
	}
	files["redfish/v1/Systems"] = map[string]any{"@odata.id": "/redfish/v1/Systems", "Members": ms}
	return files
}

func writeTree(t *testing.T, dir string, files map[string]any) {
	t.Helper()
	for p, body := range files {
		d := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(body)
		if err := os.WriteFile(filepath.Join(d, "index.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func indexOf(s []string, v string) int {
	for i, e := range s {
		if e == v {
			return i
		}
	}
	return -1
}

// TestCloseClosesKeepAlive: Close ends the driver's keep-alive connection
// to the BMC at once (a controller with thousands of BMCs evicts drivers
// from its cache and must not keep their sockets for IdleConnTimeout).
// Before the fix the wrapping transport hid CloseIdleConnections.
func TestCloseClosesKeepAlive(t *testing.T) {
	for _, basic := range []bool{false, true} {
		var quirks *bmcsim.Quirks
		if basic {
			quirks = &bmcsim.Quirks{NoSessions: true} // Basic auth fallback: no session to log out of
		}
		sim, err := bmcsim.New(bmcsim.Config{Tree: loadTree(t, treeDell), Username: "admin", Password: "s3cret", Power: bmcsim.NewMemoryPower(true), Quirks: quirks})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		open := map[net.Conn]bool{}
		ts := httptest.NewUnstartedServer(sim)
		ts.Config.ConnState = func(c net.Conn, s http.ConnState) {
			mu.Lock()
			defer mu.Unlock()
			switch s {
			case http.StateNew:
				open[c] = true
			case http.StateClosed, http.StateHijacked:
				delete(open, c)
			}
		}
		ts.Start()
		t.Cleanup(ts.Close)
		drv, err := redfish.New(redfish.Config{Endpoint: ts.URL, Username: "admin", Password: "s3cret", PollInterval: time.Millisecond, RetryBase: time.Millisecond, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := drv.PowerState(context.Background()); err != nil {
			t.Fatal(err)
		}
		count := func() int { mu.Lock(); defer mu.Unlock(); return len(open) }
		if count() == 0 {
			t.Fatalf("basic=%v: no connection open after a call", basic)
		}
		_ = drv.Close(context.Background())
		deadline := time.Now().Add(3 * time.Second) // IdleConnTimeout is 15 s
		for count() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("basic=%v: %d connection(s) still open 3 s after Close", basic, count())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
