package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/state"
)

// The harness the process-level tests of this package share: they build
// machina, seed a state store for the simulated lab, run `machina serve` as
// child processes, kill them by PID and wait for the fleet to converge.

// buildMachina builds this package into dir/machina with CGO off and the
// given build tags (machinafault for the fault hook), with the go command on
// PATH or else the one of GOROOT (the toolchain running the test), and
// returns its path.
func buildMachina(t testing.TB, dir string, tags ...string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil && os.Getenv("GOROOT") != "" {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	} else if err != nil {
		goBin = peertest.Command(t, "go") // fails naming the toolchain
	}
	bin := filepath.Join(dir, "machina")
	args := []string{"build"}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	build := exec.Command(goBin, append(args, "-o", bin, ".")...)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// seedSimSite stores the simulated lab's BMC password under both of the
// lab inventory's credential names and creates an admin token named
// tokenName, in st (bbolt or etcd), as an operator does before the first
// start. It returns the token.
func seedSimSite(t testing.TB, st *state.Store, lab *sim.Lab, tokenName string) string {
	t.Helper()
	user, pass := lab.Credentials()
	for _, name := range []string{"bmc-redfish", "bmc-ipmi"} {
		if _, err := st.PutSecret(name, state.Credential{Username: user, Password: pass}, state.ActorLocal); err != nil {
			t.Fatal(err)
		}
	}
	tok, _, err := st.CreateAdminToken(tokenName, state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// fastServeFlags make `machina serve` act at test speed over a simulated
// fleet on loopback: one-second polls and passes, no BMC sweep, machine
// rate limits out of the way (every simulated machine is 127.0.0.1), 16
// workers, and silent machines re-netbooted after 30 s.
var fastServeFlags = []string{
	"--poll-interval", "1s", "--reconcile-interval", "1s", "--status-interval", "5s", "--bmc-watch-interval", "-1s",
	"--machine-burst", "100000", "--machine-refill", "1ms", "--max-conns-per-ip", "100000", "--workers", "16", "--per-rack", "16",
	"--machine-silent-after", "30s", "--max-renetboots", "5", "--log-format", "text",
}

// serveProc is one `machina serve` child process writing to its own log.
type serveProc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process has been waited for
	log    string
}

// startServe starts bin with args (and extra environment entries), its
// output in logPath. The process dies with the test process (Pdeathsig) and
// is SIGKILLed by its PID at the test's end if it still runs.
func startServe(t testing.TB, bin string, args, env []string, logPath string) *serveProc {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	p := &serveProc{cmd: cmd, exited: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.exited) }()
	t.Cleanup(p.kill)
	return p
}

// kill SIGKILLs the process by its PID (if it still runs) and waits for it.
func (p *serveProc) kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// killedBySIGKILL reports whether the process has ended by SIGKILL (its own
// fault hook's, or ours).
func (p *serveProc) killedBySIGKILL() bool {
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// waitConverged polls the admin API until all total servers are ready or
// deployed, none failed, and each profile of perProfile has that many
// deployed (booted from disk). It fails the test at the first failed
// server, or when within has passed; it returns the last summary.
func waitConverged(t testing.TB, ctx context.Context, client *v1.Client, total int, perProfile map[string]int, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		servers := listAll(t, ctx, client)
		counts, deployed := map[string]int{}, map[string]int{}
		var failed []string
		for _, s := range servers {
			counts[s.Lifecycle]++
			if s.Lifecycle == "failed" {
				failed = append(failed, s.Name+": "+s.LastError)
			}
			if s.Lifecycle == "deployed" && !s.FinishDeploy && s.Allocation != nil {
				deployed[s.Allocation.Profile]++
			}
		}
		if len(failed) > 0 {
			t.Fatalf("failed servers after the kills: %s", strings.Join(failed, "; "))
		}
		last := fmt.Sprintf("%v, deployed per profile %v", counts, deployed)
		done := len(servers) == total && counts["ready"]+counts["deployed"] == total
		for p, n := range perProfile {
			done = done && deployed[p] == n
		}
		if done {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("not converged within %s of the last kill: %s", within, last)
		}
		time.Sleep(time.Second)
	}
}

// walkEvents calls fn for every event of the controller's log, oldest first.
func walkEvents(t testing.TB, ctx context.Context, client *v1.Client, fn func(v1.Event)) {
	t.Helper()
	var after uint64
	for {
		page, err := client.Events(ctx, after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range page.Events {
			fn(ev)
		}
		if page.Next == 0 {
			return
		}
		after = page.Next
	}
}

// deployedOnce counts each server's moves into deployed and fails the test
// for a server deployed twice or a total other than want.
func deployedOnce(t testing.TB, ctx context.Context, client *v1.Client, want int) map[string]int {
	t.Helper()
	moves := map[string]int{}
	walkEvents(t, ctx, client, func(ev v1.Event) {
		if ev.Kind == string(state.EventTransition) && ev.To == "deployed" {
			moves[ev.Server]++
		}
	})
	for name, n := range moves {
		if n > 1 {
			t.Errorf("%s deployed %d times", name, n)
		}
	}
	if len(moves) != want {
		t.Errorf("%d servers deployed, want %d", len(moves), want)
	}
	return moves
}
