package gitops

import (
	"fmt"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
)

// Bound on the bytes one status commit pushes: at most
// pushBytesPerServer per changed server plus pushBytesConst, at any fleet
// size (docs/performance.md "Status history").
const (
	pushBytesPerServer = 2048
	pushBytesConst     = 16 << 10
)

// TestStatusPushBytesBound writes a 10,000-server fleet to a real bare
// repository (git-receive-pack over file://), then commits changes of k
// servers and checks the packfile each push sent stays within
// pushBytesPerServer*k + pushBytesConst: a commit's size follows what
// changed, not the fleet (the fan-out folders and the bounded README).
// Byte counts are deterministic for a given snapshot; no timing.
func TestStatusPushBytesBound(t *testing.T) {
	r := newTestRepo(t)
	w := newTestWriter(t, r, nil)
	const n = 10000
	s := bigSnapshot(n, "ready")
	if _, err := w.Write(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	step := 0
	for _, k := range []int{1, 10, 100} {
		step++
		next := bigSnapshot(n, "ready")
		for i := range k {
			// Spread over the fleet: k different fan-out folders, the
			// worst case for the trees.
			j := (i * 7919) % n
			next.Servers[j].Lifecycle = []string{"deploying", "deployed"}[step%2]
			next.Servers[j].Health = fmt.Sprintf("Warning-%d", step)
		}
		res, err := w.Write(t.Context(), next)
		if err != nil || res.Commit == "" {
			t.Fatalf("k=%d: Write = %+v, %v", k, res, err)
		}
		bound := pushBytesPerServer*k + pushBytesConst
		t.Logf("k=%d changed servers of %d: pushed %d bytes (bound %d, %.0f per server above the constant)", k, n, res.PackBytes, bound,
			float64(res.PackBytes-pushBytesConst)/float64(k))
		if res.PackBytes <= 0 || res.PackBytes > bound {
			t.Errorf("k=%d: pushed %d bytes, want 1..%d (%d per changed server + %d)", k, res.PackBytes, bound, pushBytesPerServer, pushBytesConst)
		}
		c := r.remoteCommit(plumbing.NewHash(res.Commit))
		paths := changedPaths(t, c)
		if len(paths) != k+1 { // the k server files and README.md
			t.Errorf("k=%d: commit changes %d files, want %d: %v", k, len(paths), k+1, paths[:min(len(paths), 5)])
		}
	}
}

// TestStatusMigratesFlatLayout checks the first write over a status/
// written in the flat layout of older controllers
// (status/servers/NAME.yaml) moves every server file to
// status/servers/XX/NAME.yaml in one commit that removes the old files
// and says so, without reporting the servers as removed and added.
func TestStatusMigratesFlatLayout(t *testing.T) {
	r := newTestRepo(t)
	s := sampleSnapshot()
	files, _ := renderStatus(s, 10, nil)
	flat := map[string]string{}
	for _, f := range files {
		if name, ok := serverNameOf(f.path); ok {
			flat["status/servers/"+name+".yaml"] = string(f.data)
		} else {
			flat[f.path] = string(f.data)
		}
	}
	r.pull()
	r.commit("status written by an older controller", flat)
	r.push(false)
	w := newTestWriter(t, r, nil)
	res, err := w.Write(t.Context(), s)
	if err != nil || res.Commit == "" {
		t.Fatalf("Write = %+v, %v; want the migration commit", res, err)
	}
	if got, want := firstLine(res.Message), "status: move 3 server files to status/servers/XX/NAME.yaml"; got != want {
		t.Errorf("subject = %q, want %q", got, want)
	}
	if strings.Contains(res.Message, "removed") {
		t.Errorf("migration message reports servers removed:\n%s", res.Message)
	}
	all := remoteFiles(t, r, "status")
	for _, sv := range s.Servers {
		if _, ok := all["status/servers/"+sv.Name+".yaml"]; ok {
			t.Errorf("flat status/servers/%s.yaml kept", sv.Name)
		}
		if _, ok := all[ServerStatusPath(sv.Name)]; !ok {
			t.Errorf("%s missing", ServerStatusPath(sv.Name))
		}
	}
	// Nothing more to do afterwards.
	if res, err := w.Write(t.Context(), s); err != nil || res.Commit != "" {
		t.Errorf("second Write = %+v, %v; want no commit", res, err)
	}
}

// TestReadmeBounded checks status/README.md stays a bounded summary at
// 10,000 servers: counts per lifecycle and zone, and at most
// readmeMaxRows servers that need attention, then "… and N more".
func TestReadmeBounded(t *testing.T) {
	s := bigSnapshot(10000, "ready")
	for i := range s.Servers {
		s.Servers[i].Zone = fmt.Sprintf("zone-%d", i%3)
		if i%10 == 0 {
			s.Servers[i].Lifecycle, s.Servers[i].LastError = "failed", "bmc unreachable"
		}
	}
	files, _ := renderStatus(s, 10, nil)
	var readme string
	for _, f := range files {
		if f.path == "status/README.md" {
			readme = string(f.data)
		}
	}
	if len(readme) > 16<<10 {
		t.Errorf("README.md is %d bytes at 10,000 servers, want <= 16 KiB", len(readme))
	}
	for _, want := range []string{"10000 servers: 1000 failed, 9000 ready.", "| zone-1 | 3333 | 333 failed, 3000 ready |",
		"## Needs attention", "… and 950 more.", "(servers/" + strings.TrimPrefix(ServerStatusPath("r000-n00"), "status/servers/") + ")"} {
		if !strings.Contains(readme, want) {
			t.Errorf("README.md lacks %q", want)
		}
	}
	if strings.Contains(readme, "r000-n01") {
		t.Errorf("README.md lists a healthy server")
	}
}
