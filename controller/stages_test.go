package controller

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/state"
)

// TestStagesNamed: Run's start-up is the named stages in this order, each
// with a start function.
func TestStagesNamed(t *testing.T) {
	w, err := newWiring(Config{StatePath: filepath.Join(t.TempDir(), "s.db"), WorkDir: t.TempDir(), Repo: gitops.Remote{URL: "file:///nonexistent"}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range w.stages() {
		if s.start == nil {
			t.Errorf("stage %s has no start function", s.name)
		}
		names = append(names, s.name)
	}
	want := []string{"state", "listen", "events out", "images", "bmc drivers", "executor", "boot", "join", "git", "routes", "ha"}
	if !slices.Equal(names, want) {
		t.Errorf("stages %v, want %v", names, want)
	}
}

// TestFailedStageStopsEarlierOnes: when a stage fails (here the join
// listener's address is taken), Run returns its error and the stops of
// the stages before it have run: the state file can be opened again at
// once (its lock released) and the HTTP listener's port is free.
func TestFailedStageStopsEarlierOnes(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := free.Addr().String()
	free.Close()
	statePath := filepath.Join(t.TempDir(), "state.db")
	err = Run(context.Background(), Config{StatePath: statePath, WorkDir: t.TempDir(), Repo: gitops.Remote{URL: "file:///nonexistent"},
		Listen: httpAddr, JoinListen: taken.Addr().String(), BMCWatchInterval: -1})
	if err == nil || !strings.Contains(err.Error(), "join listen "+taken.Addr().String()) {
		t.Fatalf("Run = %v, want the join listen error", err)
	}
	st, err := state.Open(statePath, state.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("state still locked after the failed start: %v", err)
	}
	st.Close()
	ln, err := net.Listen("tcp", httpAddr)
	if err != nil {
		t.Fatalf("HTTP listener still open after the failed start: %v", err)
	}
	ln.Close()
}
