package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestWriteStatusCases covers what the simulated lab does not reach:
// sealed secrets, an invalid newest revision, failed and stalled servers.
func TestWriteStatusCases(t *testing.T) {
	snap := state.Snapshot{Servers: map[string]*state.Server{
		"a": {Name: "a", Lifecycle: state.LifecycleFailed, LastError: "deploy: ramdisk reported\nno disk"},
		"b": {Name: "b", Lifecycle: state.LifecycleDeployed, Stalled: "release:1", LastError: "bmc: 503"},
		"c": {Name: "c", Lifecycle: state.LifecycleReady},
		"d": {Name: "d", Lifecycle: state.LifecycleReady, BMCError: "bmc: login: HTTP 401"},
	}}
	inv := gitops.InventoryStatus{
		Good:    gitops.RevisionRef{Commit: "0123456789abcdef0123", Digest: "sha256:fedcba9876543210"},
		Invalid: &gitops.InvalidRevision{Commit: "89abcdef0123456789ab", Errors: []inventory.FieldError{{File: "servers.yaml", Line: 14, Col: 7, Path: "servers[2].bootMAC", Msg: "not a MAC"}}},
	}
	var b bytes.Buffer
	writeStatus(&b, "http://c", map[string]int{"failed": 1, "deployed": 1, "ready": 1}, true, 3, 0, inv, plan.Result{}, snap)
	out := b.String()
	for _, want := range []string{
		"Inventory:  INVALID at commit 89abcdef0123 (1 error)",
		"servers.yaml:14:7",
		"acting on the last good commit 0123456789ab (inventory fedcba987654)",
		"Servers:    3: 1 ready, 1 deployed, 1 failed",
		"Secrets:    sealed at rest (3)",
		"Attention:  3 servers",
		"d                BMC unreadable         bmc: login: HTTP 401",
		"a                failed                 deploy: ramdisk reported no disk",
		"b                stalled (deployed)     bmc: 503",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	// One of each: singular nouns ("1 steps" before).
	b.Reset()
	one := plan.Result{Steps: []plan.Step{{Server: "c", Action: "commission"}}, Held: []plan.Step{{Server: "b", Action: "release"}}, Brake: "releases 1 of 3"}
	writeStatus(&b, "http://c", map[string]int{"failed": 1}, true, 3, 0, inv, one,
		state.Snapshot{Servers: map[string]*state.Server{"a": snap.Servers["a"]}})
	for _, want := range []string{"Plan:       1 step pending\n", "HELD:       1 step: releases 1 of 3\n", "Attention:  1 server\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	writeStatus(&b, "http://c", nil, true, 1, 2, gitops.InventoryStatus{}, plan.Result{}, state.Snapshot{})
	for _, want := range []string{"sealing on, but 2 of 3 still UNSEALED", "Servers:    none registered", "Inventory:  no revision read yet"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}

// TestWriteStatusNotMoving: a server waiting for its image (ImageNotReady,
// with the import error) and one the plan cannot commission are named
// under Attention; a retired server's stale "BMC unreadable" is not (issue
// 22: status said "no failed or stalled servers" for a server stuck in
// allocated, and showed retired servers as unreadable).
func TestWriteStatusNotMoving(t *testing.T) {
	snap := state.Snapshot{Servers: map[string]*state.Server{
		"alloc":   {Name: "alloc", Lifecycle: state.LifecycleAllocated},
		"retired": {Name: "retired", Lifecycle: state.LifecycleRetired, BMCError: "bmc: login: HTTP 401"},
		"moving":  {Name: "moving", Lifecycle: state.LifecycleReady},
	}}
	plan := plan.Result{
		Steps: []plan.Step{{Server: "alloc", Action: plan.ActDeploy, Profile: "p", Waits: "image img: import failed: no checksum entry"}},
		Conditions: []plan.Condition{
			{Subject: "server/alloc", Type: plan.CondImageNotReady, Reason: plan.CondImageNotReady, Message: "deploy of profile p waits: image img: import failed: no checksum entry"},
			{Subject: "server/nobmc", Type: "NoBMC", Reason: "NoBMC", Message: "no BMC address"},
			{Subject: "server/moving", Type: "WipePending", Reason: "ReleaseWipe", Message: "wiping"},
		},
	}
	var b bytes.Buffer
	writeStatus(&b, "http://c", map[string]int{"allocated": 1, "retired": 1, "ready": 1}, true, 1, 0, gitops.InventoryStatus{}, plan, snap)
	out := b.String()
	for _, want := range []string{
		"Attention:  2 servers",
		"alloc            ImageNotReady          deploy of profile p waits: image img: import failed: no checksum entry",
		"nobmc            NoBMC                  no BMC address",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "retired          BMC unreadable") || strings.Contains(out, "moving  ") {
		t.Errorf("status names a retired or a moving server under Attention:\n%s", out)
	}
}

// TestHeldRun checks approve's count of released steps: "1 held step
// runs", "2 held steps run".
func TestHeldRun(t *testing.T) {
	if got := heldRun(1); got != "1 held step runs" {
		t.Errorf("heldRun(1) = %q", got)
	}
	if got := heldRun(2); got != "2 held steps run" {
		t.Errorf("heldRun(2) = %q", got)
	}
}

// TestWriteHostStatus: the hosts line counts joined, lost and fenced
// hosts, and each condition gets a line with the lost host's power.
func TestWriteHostStatus(t *testing.T) {
	var b strings.Builder
	writeHostStatus(&b, []v1.Host{
		{Name: "hv1", Online: true},
		{Name: "hv2", Lost: &v1.HostLost{Summary: "lost, powered on"}, Conditions: []v1.HostCondition{{Type: "HostLost", Reason: "LostPoweredOn", Message: "lost, powered on: no heartbeat since 2026-12-01T10:00:00Z"}}},
		{Name: "hv3", Fenced: &v1.HostFence{Actor: "ops"}, Conditions: []v1.HostCondition{{Type: "Fenced", Message: "fenced by ops through bmc: lost"}}},
	})
	got := b.String()
	for _, want := range []string{"Hosts:      3 joined, 1 lost, 1 fenced", "hv2              HostLost   lost, powered on: no heartbeat since", "hv3              Fenced     fenced by ops"} {
		if !strings.Contains(got, want) {
			t.Errorf("writeHostStatus output lacks %q:\n%s", want, got)
		}
	}
	b.Reset()
	writeHostStatus(&b, nil)
	if b.String() != "Hosts:      none joined\n" {
		t.Errorf("no hosts: %q", b.String())
	}
}

// TestLabelsRoundTripThroughStatus: the derived labels a status file
// carries give the same labels back when planned from that status tree.
func TestLabelsRoundTripThroughStatus(t *testing.T) {
	full := &state.Hardware{CPUVendor: "GenuineIntel", Arch: "amd64", MemoryBytes: 500 << 30, InstalledMemoryBytes: 512 << 30,
		GPUs:  []state.GPU{{Vendor: "nvidia"}},
		Disks: []state.Disk{{Name: "nvme0n1", Transport: "nvme"}, {Name: "sda", Transport: "sata"}},
		NICs:  []state.NIC{{Name: "eth0", SpeedMbps: 25000}}}
	want := full.Labels()
	// What a status file keeps: sizes, disk and NIC names, the labels.
	stripped := &state.Hardware{MemoryBytes: 500 << 30, Disks: []state.Disk{{Name: "nvme0n1"}, {Name: "sda"}}, NICs: []state.NIC{{Name: "eth0", SpeedMbps: 25000}}}
	labelsToHardware(stripped, want)
	got := stripped.Labels()
	if len(got) != len(want) {
		t.Fatalf("labels %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("label %s = %q, want %q", k, got[k], v)
		}
	}
}

// TestWriteStatusFailingAndProgress: a server whose finish-deploy keeps
// failing is listed as failing with the plan's Failing condition (action,
// count, next retry, last error), the release that waits behind it on the
// line below with what it waits for, and a deploy's progress has its own
// line (step, share, rate, since when its bytes have not moved, and the
// request the agent is retrying and why). Before,
// status said "no failed, stalled or waiting servers" for the failing
// finish-deploy.
func TestWriteStatusFailingAndProgress(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	snap := state.Snapshot{Servers: map[string]*state.Server{
		"r3-n01": {Name: "r3-n01", Lifecycle: state.LifecycleDeployed, FinishDeploy: true, Failures: 3, RetryAt: t0.Add(time.Minute),
			LastError: "finish-deploy: redfish: 503", InFlight: &state.InFlight{Action: "finish-deploy"}},
		"r1-n02": {Name: "r1-n02", Lifecycle: state.LifecycleDeploying, LifecycleAt: t0.Add(-time.Hour),
			Progress: &state.Progress{Step: "image-write", BytesDone: 10 << 30, BytesTotal: 40 << 30, RateBytesPerSecond: 150e6, At: t0, AdvancedAt: t0.Add(-30 * time.Second)}},
		"r1-n03": {Name: "r1-n03", Lifecycle: state.LifecycleDeploying, LifecycleAt: t0.Add(-time.Hour),
			Progress: &state.Progress{Step: "image-download", BytesDone: 0, BytesTotal: 40 << 30, At: t0, AdvancedAt: t0.Add(-2 * time.Minute),
				Retry: "piece 0 of 10240: controller request stalled for 1m0s, retry 2 of 19 in 500ms"}},
	}}
	res := plan.Result{Conditions: []plan.Condition{
		{Subject: "server/r3-n01", Type: plan.CondFailing, Reason: plan.ReasonActionFailing,
			Message: "finish-deploy failed 3 times in a row; next retry at 2026-11-01T12:01:00Z; last error: finish-deploy: redfish: 503"},
		{Subject: "server/r3-n01", Type: "Waiting", Reason: plan.ReasonBehindAction,
			Message: "release waits for finish-deploy in flight, failing (3 in a row; next retry at 2026-11-01T12:01:00Z)"},
	}}
	plan.SortConditions(res.Conditions)
	var b bytes.Buffer
	writeStatus(&b, "http://c", map[string]int{"deployed": 1, "deploying": 2}, true, 1, 0, gitops.InventoryStatus{}, res, snap)
	out := b.String()
	for _, want := range []string{
		"Attention:  1 server",
		"r3-n01           failing                finish-deploy failed 3 times in a row; next retry at 2026-11-01T12:01:00Z; last error: finish-deploy: redfish: 503",
		"                 waiting                release waits for finish-deploy in flight, failing (3 in a row; next retry at 2026-11-01T12:01:00Z)",
		"Progress:   2 deploys",
		"r1-n02           image-write      25.0% of 40.0 GiB, 150.0 MB/s, reported 2026-11-01T12:00:00Z, no bytes since 2026-11-01T11:59:30Z\n",
		// A deploy whose agent retries a failing request says which and why.
		"r1-n03           image-download    0.0% of 40.0 GiB, 0.0 MB/s, reported 2026-11-01T12:00:00Z, no bytes since 2026-11-01T11:58:00Z, retrying: piece 0 of 10240: controller request stalled for 1m0s, retry 2 of 19 in 500ms",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
}
