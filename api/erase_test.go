package api_test

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// TestEraseWipeEndpoints: a server released from a profile with erase:
// zero gets a wipe plan naming that method, with a reusable progress
// token; its erase progress is taken while the wipe runs (and shown as the
// server's progress), refused with the image purpose's token; an outcome
// of a disk that cannot do the method keeps the server held with
// WipeUnsupported and the disk named in LastError and the event; a good
// outcome records each disk's method, bytes, duration and verified
// samples on the server and in the wipe.done event.
func TestEraseWipeEndpoints(t *testing.T) {
	f := newFixture(t, state.Options{})
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, ProgressEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	releasedServer(t, f, "r1-n01", "52:54:00:00:00:01")
	if _, err := f.store.UpdateServer("r1-n01", func(s *state.Server) error {
		s.WipeErase, s.WipeStartedAt = v1.EraseZero, time.Now().UTC().Add(-time.Second)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	getPlan := func() v1.WipePlan {
		tok, _, err := f.store.IssueToken(state.TokenSpec{Purpose: state.PurposeWipe, Server: "r1-n01", MAC: "52:54:00:00:00:01"})
		if err != nil {
			t.Fatal(err)
		}
		code, _, body := f.do(t, http.MethodGet, v1.PathAgentWipe, tok, "")
		var plan v1.WipePlan
		if code != http.StatusOK || json.Unmarshal(body, &plan) != nil {
			t.Fatalf("wipe plan: %d %s", code, body)
		}
		return plan
	}
	plan := getPlan()
	if plan.Erase != v1.EraseZero || plan.ProgressToken == "" || plan.ProgressEvery != time.Millisecond {
		t.Fatalf("wipe plan = %+v, want erase zero with a progress token", plan)
	}
	prog := `{"step":"erase","bytesDone":1048576,"bytesTotal":4194304,"rateBytesPerSecond":100}`
	if code, _, body := f.do(t, http.MethodPost, v1.PathAgentProgress, plan.ProgressToken, prog); code != http.StatusNoContent {
		t.Fatalf("erase progress: %d %s", code, body)
	}
	s, _ := f.store.Server("r1-n01")
	if p := s.CurrentProgress(); p == nil || p.Step != v1.StepErase || p.BytesDone != 1<<20 || p.BytesTotal != 4<<20 {
		t.Errorf("current progress = %+v, want erase 1 MiB of 4", p)
	}
	if code, _, body := f.do(t, http.MethodGet, "/api/v1/servers/r1-n01", f.token, ""); code != http.StatusOK || !strings.Contains(string(body), `"step":"erase"`) {
		t.Errorf("API server has no erase progress: %s", body)
	}
	// An image step with the erase token is refused (the token's purpose).
	if code, _, _ := f.do(t, http.MethodPost, v1.PathAgentProgress, plan.ProgressToken, strings.Replace(prog, `"erase"`, `"image-write"`, 1)); code != http.StatusForbidden {
		t.Errorf("image step with the erase progress token: %d, want 403", code)
	}

	bad := `{"bootMAC":"52:54:00:00:00:01","ok":false,"unsupported":true,"reason":"sda (pci-0000:00:1f.2-ata-1): erase secure unsupported on sda: ATA security is frozen","durationNs":1}`
	if code, _, body := f.do(t, http.MethodPost, v1.PathAgentWiped, plan.DoneToken, bad); code != http.StatusNoContent {
		t.Fatalf("unsupported outcome: %d %s", code, body)
	}
	s, _ = f.store.Server("r1-n01")
	if !s.NeedsWipe || !s.WipeUnsupported || s.WipeFailures != 1 || !strings.Contains(s.LastError, "EraseUnsupported: sda (pci-0000:00:1f.2-ata-1): erase secure unsupported on sda: ATA security is frozen") {
		t.Errorf("after an unsupported erase: needsWipe %v unsupported %v failures %d lastError %q", s.NeedsWipe, s.WipeUnsupported, s.WipeFailures, s.LastError)
	}

	plan = getPlan()
	good := `{"bootMAC":"52:54:00:00:00:01","ok":true,"disks":["pci-0000:00:1f.2-ata-1"],"durationNs":5,
		"erased":[{"disk":"pci-0000:00:1f.2-ata-1","name":"sda","method":"zero","bytes":4194304,"durationNs":1500000000,"verifiedSamples":1024}]}`
	if code, _, body := f.do(t, http.MethodPost, v1.PathAgentWiped, plan.DoneToken, good); code != http.StatusNoContent {
		t.Fatalf("good outcome: %d %s", code, body)
	}
	s, _ = f.store.Server("r1-n01")
	want := state.DiskErase{Disk: "pci-0000:00:1f.2-ata-1", Name: "sda", Method: "zero", Bytes: 4 << 20, Duration: 1500 * time.Millisecond, VerifiedSamples: 1024}
	if s.NeedsWipe || s.WipeUnsupported || len(s.LastErase) != 1 || s.LastErase[0] != want {
		t.Errorf("after a good erase: needsWipe %v unsupported %v lastErase %+v", s.NeedsWipe, s.WipeUnsupported, s.LastErase)
	}
	evs, err := f.store.Events(state.EventQuery{Server: "r1-n01"})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, e := range evs {
		if strings.HasPrefix(string(e.Kind), "wipe.") {
			msgs = append(msgs, string(e.Kind)+" "+e.Message)
		}
	}
	wantMsgs := []string{
		"wipe.failed release wipe failed: EraseUnsupported: sda (pci-0000:00:1f.2-ata-1): erase secure unsupported on sda: ATA security is frozen",
		"wipe.done release wipe done: erased pci-0000:00:1f.2-ata-1: zero, 4194304 bytes in 1.5s, 1024 samples verified",
	}
	if strings.Join(msgs, "\n") != strings.Join(wantMsgs, "\n") {
		t.Errorf("wipe events:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(wantMsgs, "\n"))
	}
	// The wipe is over: the progress token is refused with 409.
	if code, _, _ := f.do(t, http.MethodPost, v1.PathAgentProgress, plan.ProgressToken, prog); code != http.StatusConflict {
		t.Errorf("erase progress after the wipe: %d, want 409", code)
	}
}

// TestEraseWipePlanPerDisk: a server released with methods per disk (a
// profile's eraseOverrides, chosen at allocation) gets a wipe plan that
// lists each disk by its commissioning identity with its method, and a
// progress token even when the default is the metadata wipe, since one
// disk is erased in full.
func TestEraseWipePlanPerDisk(t *testing.T) {
	f := newFixture(t, state.Options{})
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, ProgressEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	releasedServer(t, f, "r1-n01", "52:54:00:00:00:01")
	if _, err := f.store.UpdateServer("r1-n01", func(s *state.Server) error {
		s.WipeErase = ""
		s.WipeEraseDisks = []state.EraseDisk{
			{Name: "nvme0n1", ByPath: "pci-0000:3b:00.0-nvme-1", WWN: "eui.0025388b91234567", SizeBytes: 960197124096, Method: "secure"},
			{Name: "sda", Serial: "ZC1ABCDE", SizeBytes: 4000787030016, Method: ""},
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	tok, _, err := f.store.IssueToken(state.TokenSpec{Purpose: state.PurposeWipe, Server: "r1-n01", MAC: "52:54:00:00:00:01"})
	if err != nil {
		t.Fatal(err)
	}
	code, _, body := f.do(t, http.MethodGet, v1.PathAgentWipe, tok, "")
	var plan v1.WipePlan
	if code != http.StatusOK || json.Unmarshal(body, &plan) != nil {
		t.Fatalf("wipe plan: %d %s", code, body)
	}
	want := []v1.EraseDisk{
		{Disk: v1.StorageDiskRef{Name: "nvme0n1", ByPath: "pci-0000:3b:00.0-nvme-1", WWN: "eui.0025388b91234567", SizeBytes: 960197124096}, Method: v1.EraseSecure},
		{Disk: v1.StorageDiskRef{Name: "sda", Serial: "ZC1ABCDE", SizeBytes: 4000787030016}, Method: v1.EraseMetadata},
	}
	if plan.Erase != v1.EraseMetadata || plan.ProgressToken == "" || !reflect.DeepEqual(plan.EraseDisks, want) {
		t.Fatalf("wipe plan = %+v, want metadata by default, a progress token and per disk %+v", plan, want)
	}
}
