package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/ramdisk/agent/agenttest"
)

func testLogger(t *testing.T) *slog.Logger { return slog.New(slog.NewTextHandler(t.Output(), nil)) }

// qemuMachine materialises the qemu-q35 tree plus a dev folder whose "vda"
// is a sparse file of the size sysfs claims (1 GiB).
func qemuMachine(t *testing.T) (root, dev string) {
	root = machineRoot(t, "qemu-q35")
	dev = t.TempDir()
	f, err := os.Create(filepath.Join(dev, "vda"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(1 << 30)
	f.Close()
	return root, dev
}

func TestRunnerCommissionAgainstReferenceController(t *testing.T) {
	root, dev := qemuMachine(t)
	ctl := agenttest.NewController(agenttest.ControllerConfig{CommissionToken: "tok-commission"})
	srv := httptest.NewServer(ctl)
	defer srv.Close()
	r := &Runner{
		Client: &v1.AgentClient{BaseURL: srv.URL}, Token: "tok-commission", BootMAC: "52:54:00:12:34:56",
		Root: root, DevDir: dev, Logger: testLogger(t),
		Tests: CommissionConfig{MemoryTestBytes: 8 << 20, DiskReadBytes: 1 << 20, NetworkTestBytes: 2 << 20},
	}
	ack, err := r.Commission(context.Background())
	if err != nil {
		t.Fatalf("Commission: %v", err)
	}
	if ack.Lifecycle != "ready" {
		t.Fatalf("ack = %+v, want ready", ack)
	}
	reps := ctl.Reports()
	if len(reps) != 1 {
		t.Fatalf("controller stored %d reports", len(reps))
	}
	rep := reps[0]
	var names []string
	for _, tr := range rep.Tests {
		names = append(names, tr.Name)
		if !tr.Passed {
			t.Errorf("test %s failed: %s", tr.Name, tr.Reason)
		}
	}
	if strings.Join(names, ",") != "cpu,memory,disk,network" {
		t.Errorf("tests = %v", names)
	}
	if rep.Tests[3].Metrics["bytes"] != 2<<20 || rep.Tests[2].Metrics["disks"] != 1 {
		t.Errorf("metrics = %v / %v", rep.Tests[3].Metrics, rep.Tests[2].Metrics)
	}
	if rep.Facts.DMI.SystemUUID != "6a1f0e3c-1111-4222-8333-444455556666" || rep.BootMAC != "52:54:00:12:34:56" {
		t.Errorf("report facts/mac = %+v %s", rep.Facts.DMI, rep.BootMAC)
	}
	// the token is single-use
	if _, err := r.Commission(context.Background()); !errors.Is(err, v1.ErrAgentTokenRefused) {
		t.Errorf("second report with the same token: err = %v, want ErrAgentTokenRefused", err)
	}
}

func TestRunnerCommissionReportsFailedTest(t *testing.T) {
	root, dev := qemuMachine(t)
	os.WriteFile(filepath.Join(root, "sys/devices/system/cpu/present"), []byte("0-3\n"), 0o644)
	os.Remove(filepath.Join(dev, "vda"))
	ctl := agenttest.NewController(agenttest.ControllerConfig{CommissionToken: "t"})
	srv := httptest.NewServer(ctl)
	defer srv.Close()
	r := &Runner{Client: &v1.AgentClient{BaseURL: srv.URL}, Token: "t", Root: root, DevDir: dev,
		Tests: CommissionConfig{MemoryTestBytes: 1 << 20, NetworkTestBytes: 1 << 10}}
	ack, err := r.Commission(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ack.Lifecycle != "failed" || !strings.Contains(ack.Reason, "cpu") || !strings.Contains(ack.Reason, "present") {
		t.Errorf("ack = %+v, want failed on cpu (4 present, 2 online)", ack)
	}
	rep := ctl.Reports()[0]
	if rep.Tests[2].Passed || !strings.Contains(rep.Tests[2].Reason, "vda") {
		t.Errorf("disk test = %+v, want failure naming vda", rep.Tests[2])
	}
}

func TestReferenceControllerRefusesBadReports(t *testing.T) {
	ctl := agenttest.NewController(agenttest.ControllerConfig{CommissionToken: "t"})
	srv := httptest.NewServer(ctl)
	defer srv.Close()
	post := func(body []byte, tok string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+v1.PathAgentReport, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	big := append([]byte(`{"bootMAC":"`), bytes.Repeat([]byte("a"), v1.MaxReportBytes)...)
	big = append(big, `"}`...)
	for name, c := range map[string]struct {
		body []byte
		tok  string
		want int
	}{
		"oversized":     {big, "t", http.StatusRequestEntityTooLarge},
		"malformed":     {[]byte(`{"bootMAC":`), "t", http.StatusBadRequest},
		"unknown field": {[]byte(`{"bootMAC":"x","evil":1}`), "t", http.StatusBadRequest},
		"trailing":      {[]byte(`{"bootMAC":"x"} {}`), "t", http.StatusBadRequest},
		"bad token":     {[]byte(`{"bootMAC":"x"}`), "nope", http.StatusUnauthorized},
	} {
		if got := post(c.body, c.tok); got != c.want {
			t.Errorf("%s: status %d, want %d", name, got, c.want)
		}
	}
	if n := len(ctl.Reports()); n != 0 {
		t.Errorf("refused reports stored: %d", n)
	}
	if ev := ctl.Events(); len(ev) != 5 {
		t.Errorf("events = %v, want 5 refusals", ev)
	}
	// the token survived the refused attempts
	if got := post([]byte(`{"bootMAC":"x","facts":{"cpu":{},"memory":{"totalBytes":1},"disks":[],"nics":[],"dmi":{}},"tests":[]}`), "t"); got != http.StatusOK {
		t.Errorf("valid report after refusals: %d", got)
	}
}

func TestRunnerDeployAgainstReferenceController(t *testing.T) {
	need(t, "sgdisk", "sfdisk", "blkid", "mtype")
	root, dev := qemuMachine(t)
	img := makeGPTImage(t, 16<<20)
	for _, mode := range []struct {
		name  string
		limit int64
	}{{"memory", 0}, {"two-pass", -1}} {
		t.Run(mode.name, func(t *testing.T) {
			ctl := agenttest.NewController(agenttest.ControllerConfig{
				DeployToken: "tok-deploy", Image: img,
				Plan: v1.Plan{Seed: testSeed, ReadBack: true, RootDevice: v1.RootDeviceHint{Serial: "machina-vm0"}},
			})
			srv := httptest.NewServer(ctl)
			defer srv.Close()
			ctl.SetBaseURL(srv.URL)
			r := &Runner{Client: &v1.AgentClient{BaseURL: srv.URL}, Token: "tok-deploy", BootMAC: "52:54:00:12:34:56",
				Root: root, DevDir: dev, MemoryLimit: mode.limit, Logger: testLogger(t)}
			res, err := r.Deploy(context.Background())
			if err != nil {
				t.Fatalf("Deploy: %v", err)
			}
			if !res.OK || res.DiskName != "vda" || res.Disk != "pci-0000:00:04.0" || res.Mode != mode.name || res.BytesWritten != int64(len(img)) {
				t.Errorf("result = %+v", res)
			}
			done := ctl.Done()
			if len(done) != 1 || !done[0].OK {
				t.Fatalf("controller done = %+v", done)
			}
			seeds := findNoCloudSeed(t, filepath.Join(dev, "vda"))
			if len(seeds) != 1 {
				t.Fatalf("%d seeds", len(seeds))
			}
			checkSeedContent(t, seeds[0].files)
		})
	}
}

func TestRunnerDeployRefusesKernelNameHintAndReportsIt(t *testing.T) {
	root, dev := qemuMachine(t)
	ctl := agenttest.NewController(agenttest.ControllerConfig{DeployToken: "d", Image: []byte("x"),
		Plan: v1.Plan{Seed: testSeed, RootDevice: v1.RootDeviceHint{DeviceName: "/dev/vda"}}})
	srv := httptest.NewServer(ctl)
	defer srv.Close()
	ctl.SetBaseURL(srv.URL)
	before := fileSum(t, filepath.Join(dev, "vda"))
	r := &Runner{Client: &v1.AgentClient{BaseURL: srv.URL}, Token: "d", Root: root, DevDir: dev}
	_, err := r.Deploy(context.Background())
	if !errors.Is(err, ErrKernelNameHint) {
		t.Fatalf("err = %v, want ErrKernelNameHint", err)
	}
	done := ctl.Done()
	if len(done) != 1 || done[0].OK || !strings.Contains(done[0].Reason, "kernel name") {
		t.Errorf("done = %+v", done)
	}
	if after := fileSum(t, filepath.Join(dev, "vda")); before != after {
		t.Error("disk changed")
	}
}

func TestMemoryTest(t *testing.T) {
	m, err := MemoryTest(context.Background(), 4<<20)
	if err != nil || m["bytes"] != 4<<20 || m["MBps"] <= 0 {
		t.Fatalf("MemoryTest = %v, %v", m, err)
	}
}

// fileSum hashes a (possibly large, sparse) file without loading it.
func fileSum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestRunnerReportSurvivesControllerRestart: the controller answers the
// report with 503 twice and then drops the connection once (a restart)
// before accepting it; the agent retries and the report lands exactly once.
// A refused token is final at once.
func TestRunnerReportSurvivesControllerRestart(t *testing.T) {
	root, dev := qemuMachine(t)
	ctl := agenttest.NewController(agenttest.ControllerConfig{CommissionToken: "tok"})
	var mu sync.Mutex
	reports := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.HasSuffix(req.URL.Path, "/report") {
			mu.Lock()
			reports++
			n := reports
			mu.Unlock()
			switch n {
			case 1, 2:
				http.Error(w, "restarting", http.StatusServiceUnavailable)
				return
			case 3:
				hj, ok := w.(http.Hijacker)
				if !ok {
					t.Error("no hijacker")
					return
				}
				c, _, _ := hj.Hijack()
				c.Close()
				return
			}
		}
		ctl.ServeHTTP(w, req)
	}))
	defer srv.Close()
	r := &Runner{Client: &v1.AgentClient{BaseURL: srv.URL}, Token: "tok", Root: root, DevDir: dev, Logger: testLogger(t),
		Tests: CommissionConfig{MemoryTestBytes: 1 << 20, NetworkTestBytes: 1 << 10}}
	ack, err := r.Commission(context.Background())
	if err != nil {
		t.Fatalf("Commission: %v", err)
	}
	if len(ctl.Reports()) != 1 || ack.Lifecycle == "" || reports != 4 {
		t.Errorf("reports stored %d, attempts %d, ack %+v; want 1 stored after 4 attempts", len(ctl.Reports()), reports, ack)
	}
	t0 := time.Now()
	if _, err := r.Commission(context.Background()); !errors.Is(err, v1.ErrAgentTokenRefused) || time.Since(t0) > 5*time.Second {
		t.Errorf("used-up token: err %v after %s, want ErrAgentTokenRefused at once", err, time.Since(t0))
	}
}
