package state_test

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"github.com/machina-metal/machina/internal/etcdtest"
	"github.com/machina-metal/machina/state"
)

const (
	crashEnv       = "MACHINA_STATE_CRASH_CHILD"
	crashServers   = 8
	crashTotal     = 10_000
	crashPerServer = crashTotal / crashServers
)

// crashCycle is a closed loop of legal moves.
var crashCycle = []state.Lifecycle{state.LifecycleNew, state.LifecycleCommissioning, state.LifecycleReady,
	state.LifecycleAllocated, state.LifecycleDeploying, state.LifecycleDeployed, state.LifecycleRetired}

func TestMain(m *testing.M) {
	if path := os.Getenv(crashEnv); path != "" {
		os.Exit(crashChild(path))
	}
	os.Exit(etcdtest.Main(m))
}

// crashChild is the re-executed test binary: it performs crashTotal
// transitions over crashServers servers (one goroutine each; every eighth
// move through Apply, the rest through ApplyBatched) and prints a line
// after each commit.
func crashChild(path string) int {
	s, err := state.Open(path, state.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		return 3
	}
	for i := range crashServers {
		if _, err := s.CreateServer(state.Server{Name: fmt.Sprintf("c%d", i)}); err != nil {
			fmt.Fprintln(os.Stderr, "child create:", err)
			return 3
		}
	}
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	var wg sync.WaitGroup
	failed := false
	for i := range crashServers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("c%d", i)
			for j := range crashPerServer {
				m := state.Move{Server: name, From: crashCycle[j%len(crashCycle)], To: crashCycle[(j+1)%len(crashCycle)], Reason: strconv.Itoa(j)}
				var err error
				if j%8 != 0 {
					_, err = s.ApplyBatched(m)
				} else {
					_, err = s.Apply(m)
				}
				mu.Lock()
				if err != nil {
					fmt.Fprintln(os.Stderr, "child transition:", err)
					failed = true
				} else {
					fmt.Fprintln(out, "ok")
					out.Flush() // the parent counts only what a committed (fsynced) call reported
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if failed {
		return 4
	}
	return 0
}

// TestCrashSIGKILL runs a child doing 10,000 transitions, kills it with
// SIGKILL after a random number of reported commits, reopens the file and
// checks integrity, durability (every reported commit is present) and that
// every server's lifecycle equals its last event.
func TestCrashSIGKILL(t *testing.T) {
	seed := rand.Uint64()
	killAt := 1 + int(seed%uint64(crashTotal-1))
	t.Logf("killing after %d reported transitions (seed %d)", killAt, seed)
	path := filepath.Join(t.TempDir(), "crash.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashEnv+"="+path)
	cmd.Stderr = t.Output()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	seen := 0
	for seen < killAt && sc.Scan() {
		seen++
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Logf("kill: %v (child already exited)", err)
	}
	for sc.Scan() { // drain what was in flight
	}
	werr := cmd.Wait()
	t.Logf("child: %v after %d reported transitions", werr, seen)
	if seen < killAt {
		t.Fatalf("child reported only %d transitions before exiting: %v", seen, werr)
	}

	s := openAt(t, path, state.Options{})
	if err := s.Check(); err != nil {
		t.Fatalf("integrity after SIGKILL: %v", err)
	}
	transitions := 0
	for i := range crashServers {
		name := fmt.Sprintf("c%d", i)
		srv, err := s.Server(name)
		if err != nil {
			t.Fatalf("Server(%s) after crash: %v", name, err)
		}
		evs := allEvents(t, s, state.EventQuery{Server: name})
		if len(evs) == 0 {
			t.Fatalf("%s: no events", name)
		}
		last := evs[len(evs)-1]
		if last.To != srv.Lifecycle {
			t.Errorf("%s: lifecycle %s but last event %+v", name, srv.Lifecycle, last)
		}
		if srv.Revision != uint64(1+transitionsOf(evs, last)) {
			t.Errorf("%s: revision %d, last event reason %q", name, srv.Revision, last.Message)
		}
		transitions += transitionsOf(evs, last)
	}
	if transitions < seen {
		t.Errorf("file holds %d transitions, child reported %d committed", transitions, seen)
	}
	t.Logf("file holds %d transitions", transitions)
}

// transitionsOf returns how many transitions the server had made, from the
// reason (the move index) written in its last event.
func transitionsOf(evs []state.Event, last state.Event) int {
	if last.Kind != state.EventTransition {
		return 0
	}
	j, err := strconv.Atoi(last.Message)
	if err != nil {
		return -1
	}
	return j + 1
}
