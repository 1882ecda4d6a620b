package main

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/machina-metal/machina/gitops"
)

// TestSnapshotFromStatusLayouts: the plan reads the status tree in the
// fan-out layout the controller writes (status/servers/XX/NAME.yaml,
// gitops.ServerStatusPath) and in the flat one older controllers wrote
// (status/servers/NAME.yaml), to the same servers; a server with a file
// in both is refused rather than read twice.
func TestSnapshotFromStatusLayouts(t *testing.T) {
	golden := statusGolden(t)
	other := []byte("name: r2-n01\nlifecycle: failed\n")
	fanned := fstest.MapFS{
		gitops.ServerStatusPath("r1-n01"): {Data: golden},
		gitops.ServerStatusPath("r2-n01"): {Data: other},
		"status/README.md":                {Data: []byte("# Fleet status\n")},
	}
	flat := fstest.MapFS{
		"status/servers/r1-n01.yaml": {Data: golden},
		"status/servers/r2-n01.yaml": {Data: other},
	}
	for name, fsys := range map[string]fstest.MapFS{"fan-out": fanned, "flat": flat} {
		snap, err := snapshotFromStatus(fsys, "status", nil, fixedNow)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(snap.Servers) != 2 || snap.Servers["r1-n01"].Lifecycle != "ready" || snap.Servers["r2-n01"].Lifecycle != "failed" {
			t.Errorf("%s: servers = %v", name, snap.Servers)
		}
	}
	both := fstest.MapFS{
		gitops.ServerStatusPath("r1-n01"): {Data: golden},
		"status/servers/r1-n01.yaml":      {Data: golden},
	}
	if _, err := snapshotFromStatus(both, "status", nil, fixedNow); err == nil || !strings.Contains(err.Error(), "more than one status file") {
		t.Errorf("r1-n01 in both layouts: err = %v, want more than one status file", err)
	}
	misplaced := fstest.MapFS{strings.Replace(gitops.ServerStatusPath("r2-n01"), "r2-n01", "r9-n09", 1): {Data: other}}
	if _, err := snapshotFromStatus(misplaced, "status", nil, fixedNow); err == nil || !strings.Contains(err.Error(), "names server") {
		t.Errorf("file named r9-n09 holding r2-n01: err = %v", err)
	}
}
