package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/state"
)

// TestWriteStatusCases covers what the simulated lab does not reach:
// sealed secrets, an invalid newest revision, failed and stalled servers.
func TestWriteStatusCases(t *testing.T) {
	snap := state.Snapshot{Servers: map[string]state.Server{
		"a": {Name: "a", Lifecycle: state.LifecycleFailed, LastError: "deploy: ramdisk reported\nno disk"},
		"b": {Name: "b", Lifecycle: state.LifecycleDeployed, Stalled: "release:1", LastError: "bmc: 503"},
		"c": {Name: "c", Lifecycle: state.LifecycleReady},
		"d": {Name: "d", Lifecycle: state.LifecycleReady, BMCError: "bmc: login: HTTP 401"},
	}}
	inv := reconciler.InventoryStatus{
		Good:    reconciler.RevisionRef{Commit: "0123456789abcdef0123", Digest: "sha256:fedcba9876543210"},
		Invalid: &reconciler.InvalidRevision{Commit: "89abcdef0123456789ab", Errors: []inventory.FieldError{{File: "servers.yaml", Line: 14, Col: 7, Path: "servers[2].bootMAC", Msg: "not a MAC"}}},
	}
	var b bytes.Buffer
	writeStatus(&b, "http://c", map[string]int{"failed": 1, "deployed": 1, "ready": 1}, true, 3, 0, inv, reconciler.Result{}, snap)
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
	one := reconciler.Result{Steps: []reconciler.Step{{Server: "c", Action: "commission"}}, Held: []reconciler.Step{{Server: "b", Action: "release"}}, Brake: "releases 1 of 3"}
	writeStatus(&b, "http://c", map[string]int{"failed": 1}, true, 3, 0, inv, one,
		state.Snapshot{Servers: map[string]state.Server{"a": snap.Servers["a"]}})
	for _, want := range []string{"Plan:       1 step pending\n", "HELD:       1 step: releases 1 of 3\n", "Attention:  1 server\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	writeStatus(&b, "http://c", nil, true, 1, 2, reconciler.InventoryStatus{}, reconciler.Result{}, state.Snapshot{})
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
	snap := state.Snapshot{Servers: map[string]state.Server{
		"alloc":   {Name: "alloc", Lifecycle: state.LifecycleAllocated},
		"retired": {Name: "retired", Lifecycle: state.LifecycleRetired, BMCError: "bmc: login: HTTP 401"},
		"moving":  {Name: "moving", Lifecycle: state.LifecycleReady},
	}}
	plan := reconciler.Result{
		Steps: []reconciler.Step{{Server: "alloc", Action: reconciler.ActDeploy, Profile: "p", Waits: "image img: import failed: no checksum entry"}},
		Conditions: []reconciler.PlanCondition{
			{Subject: "server/alloc", Type: reconciler.CondImageNotReady, Reason: reconciler.CondImageNotReady, Message: "deploy of profile p waits: image img: import failed: no checksum entry"},
			{Subject: "server/nobmc", Type: "NoBMC", Reason: "NoBMC", Message: "no BMC address"},
			{Subject: "server/moving", Type: "WipePending", Reason: "ReleaseWipe", Message: "wiping"},
		},
	}
	var b bytes.Buffer
	writeStatus(&b, "http://c", map[string]int{"allocated": 1, "retired": 1, "ready": 1}, true, 1, 0, reconciler.InventoryStatus{}, plan, snap)
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
