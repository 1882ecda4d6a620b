package gitops

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// TestRenderCacheRendersOnlyChanged: with the writer's render cache, a
// second render renders again exactly the servers whose status changed
// (and a new one), reuses the bytes of the others (the same slice, not a
// re-rendering), drops a removed server, and gives the same files and
// blob ids as a full render without the cache; a new event limit renders
// every server again.
func TestRenderCacheRendersOnlyChanged(t *testing.T) {
	s := bigSnapshot(60, "ready")
	var c renderCache
	first, errs := renderStatus(s, 10, &c)
	if len(errs) != 0 || c.renders != 60 {
		t.Fatalf("first render: %d servers rendered, errors %v; want all 60, none", c.renders, errs)
	}
	firstData := map[string][]byte{}
	for _, f := range first {
		firstData[f.path] = f.data
	}
	s.Servers = append(s.Servers[:0:0], s.Servers...) // the caller replaces, never changes in place
	s.Servers[3].Lifecycle = "deployed"
	s.Servers[17].Events = append([]StatusEvent{{Time: t0.Add(1), Type: "Normal", Reason: "PowerChanged", Message: "on"}}, s.Servers[17].Events...)
	s.Servers[40].Hardware.NICs = []NIC{{Name: "eno2", MAC: "52:54:00:ff:ff:02"}}
	removed := s.Servers[59].Name
	s.Servers[59] = bigSnapshot(1, "new").Servers[0]
	s.Servers[59].Name = "zz-new"
	changed := map[string]bool{s.Servers[3].Name: true, s.Servers[17].Name: true, s.Servers[40].Name: true, "zz-new": true}

	second, _ := renderStatus(s, 10, &c)
	if c.renders != len(changed) {
		t.Errorf("second render rendered %d servers, want the %d changed", c.renders, len(changed))
	}
	full, _ := renderStatus(s, 10, nil)
	if len(second) != len(full) {
		t.Fatalf("cached render has %d files, full render %d", len(second), len(full))
	}
	for i, f := range second {
		if f.path != full[i].path || string(f.bytes()) != string(full[i].data) {
			t.Fatalf("file %d: cached render %s differs from the full render's %s", i, f.path, full[i].path)
		}
		if !f.hash.IsZero() && f.hash != plumbing.ComputeHash(plumbing.BlobObject, f.bytes()) {
			t.Errorf("%s: kept blob id %s is not its bytes' id", f.path, f.hash)
		}
		name, isServer := serverNameOf(f.path)
		if !isServer {
			continue
		}
		_, had := firstData[f.path]
		switch reused := had && f.data == nil; {
		case changed[name] && reused:
			t.Errorf("%s changed but its file was not rendered again", name)
		case !changed[name] && !reused:
			t.Errorf("%s did not change but its file was rendered again", name)
		}
	}
	if _, ok := c.m[removed]; ok {
		t.Errorf("%s left the fleet but the cache keeps its file", removed)
	}
	if renderStatus(s, 5, &c); c.renders != 60 {
		t.Errorf("with another event limit %d servers were rendered again, want all 60", c.renders)
	}
}

// TestStatusWriterCommitsFullRender: the status writer, which renders
// only changed servers after its first write, commits over several writes
// (changes, a server added and one removed, a write with nothing changed,
// a write onto a remote reset to before any status) exactly the files a
// full render of each snapshot gives, rendering only the changed servers'
// files (the reset's blobs are rendered again for the pack, not counted).
func TestStatusWriterCommitsFullRender(t *testing.T) {
	r := newTestRepo(t)
	seed := r.remoteHead("main")
	w := newTestWriter(t, r, nil)
	s := bigSnapshot(40, "ready")
	for step := range 5 {
		if step == 4 {
			// An operator force-pushes main back to before any status
			// and the remote prunes what is unreachable: the next write's
			// base lacks every kept blob, so their bytes are rendered
			// again for the pack though no status changed.
			r.resetTo(seed)
			r.push(true)
			if out, err := exec.Command("git", "-C", r.bare, "gc", "--quiet", "--prune=now").CombinedOutput(); err != nil {
				t.Fatalf("git gc on the remote (Debian package git): %v\n%s", err, out)
			}
		}
		s.Servers = append(s.Servers[:0:0], s.Servers...)
		switch step {
		case 1:
			s.Servers[5].Lifecycle, s.Servers[6].LastError = "commissioning", "bmc unreachable"
		case 2:
			s.Servers = append(s.Servers[1:], bigSnapshot(1, "new").Servers[0])
			s.Servers[len(s.Servers)-1].Name = "zz-added"
		}
		if _, err := w.Write(t.Context(), s); err != nil {
			t.Fatalf("write %d: %v", step, err)
		}
		if wantRenders := map[int]int{0: 40, 1: 2, 2: 1, 3: 0, 4: 0}[step]; w.rendered.renders != wantRenders {
			t.Errorf("write %d rendered %d server files, want %d", step, w.rendered.renders, wantRenders)
		}
		full, _ := renderStatus(s, w.cfg.MaxEvents, nil)
		want := map[string]string{}
		for _, f := range full {
			want[f.path] = string(f.data)
		}
		tree, err := r.remoteCommit(r.remoteHead("main")).Tree()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		err = tree.Files().ForEach(func(f *object.File) error {
			if !strings.HasPrefix(f.Name, statusDir+"/") {
				return nil
			}
			body, err := f.Contents()
			got[f.Name] = body
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("write %d: committed %d status files, full render %d", step, len(got), len(want))
		}
		for p, body := range want {
			if got[p] != body {
				t.Fatalf("write %d: committed %s differs from the full render:\n%s", step, p, diffLines(got[p], body))
			}
		}
	}
}

// diffLines names the first line where a and b differ.
func diffLines(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d: committed %q, full render %q", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("%d lines committed, %d rendered", len(al), len(bl))
}

// TestRenderCacheSkippedNames: with a server whose name cannot be a file
// name and a duplicate among the others, a second cached render reuses
// the others' files, and each reused file's bytes (rendered again from the
// status it points to) are those of its own server, as a full render
// gives them.
func TestRenderCacheSkippedNames(t *testing.T) {
	s := bigSnapshot(12, "ready")
	s.Servers[4].Name = "../bad"
	s.Servers[8].Name = s.Servers[7].Name
	var c renderCache
	if _, errs := renderStatus(s, 10, &c); len(errs) != 2 {
		t.Fatalf("first render: errors %v, want the bad name and the duplicate", errs)
	}
	second, _ := renderStatus(s, 10, &c)
	if c.renders != 0 {
		t.Fatalf("second render rendered %d servers, want none", c.renders)
	}
	full, _ := renderStatus(s, 10, nil)
	if len(second) != len(full) {
		t.Fatalf("cached render has %d files, full render %d", len(second), len(full))
	}
	for i, f := range second {
		if f.path != full[i].path || string(f.bytes()) != string(full[i].data) {
			t.Fatalf("file %d (%s): the reused file's bytes differ from the full render's", i, f.path)
		}
	}
}
