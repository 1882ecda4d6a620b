package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// TestScanLogAllowList: the bench fails on a controller WARN or ERROR line
// its allow-list does not name; an allowed one is counted apart, and an
// ERROR line is never allowed by a warning's entry.
func TestScanLogAllowList(t *testing.T) {
	path := filepath.Join(t.TempDir(), "controller.log")
	log := strings.Join([]string{
		`time=2026-12-06T06:04:51Z level=INFO msg="controller listening"`,
		`time=2026-12-06T06:04:51Z level=WARN msg="secrets are stored unsealed: set MACHINA_API_KEY_MASTER_KEY to encrypt them at rest"`,
		`time=2026-12-06T06:04:52Z level=WARN msg="host lost: no heartbeat" host=s00008`,
		`time=2026-12-06T06:04:53Z level=ERROR msg="secrets are stored unsealed" err=x`,
	}, "\n") + "\n"
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := scanLog(path, controllerAllowed)
	if err != nil {
		t.Fatal(err)
	}
	if got.warns != 1 || got.errs != 1 || got.allowed["secrets are stored unsealed"] != 1 || len(got.unexpected) != 2 ||
		!strings.Contains(got.unexpected[0], "host lost: no heartbeat") {
		t.Fatalf("scanLog = %+v; want the lost host's warning and the error unexpected, the unsealed warning allowed", got)
	}
	if _, err := scanLog(filepath.Join(t.TempDir(), "missing.log"), nil); err == nil {
		t.Error("scanLog of a missing log = nil error")
	}
}

// TestBoltTxID: the commit count read from a bbolt file's meta pages is
// bbolt's own transaction ID.
func TestBoltTxID(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists([]byte("b")); return err }); err != nil {
			t.Fatal(err)
		}
	}
	var want int
	_ = db.View(func(tx *bolt.Tx) error { want = tx.ID(); return nil })
	if got := boltTxID(path); got != int64(want) || want < 5 {
		t.Errorf("boltTxID = %d, want %d (at least 5)", got, want)
	}
	db.Close()
}

// TestSignalStopsChildren: a bench stopped by SIGTERM stops the child it
// started (here a `sleep` standing in for `machina serve`, one that
// ignores SIGTERM so the grace ends in SIGKILL) by its PID, removes its
// recorded folder and exits 128+15. Before, the child kept running.
func TestSignalStopsChildren(t *testing.T) {
	if os.Getenv("SCALE_SIGNAL_CHILD") != "" {
		dir := os.Getenv("SCALE_SIGNAL_DIR")
		stopOnSignal(running, 200*time.Millisecond, syscall.SIGTERM)
		running.removeAtExit(dir)
		cmd := exec.Command("sh", "-c", `trap "" TERM; exec sleep 300`)
		if err := running.start(cmd); err != nil {
			t.Fatal(err)
		}
		fmt.Println(cmd.Process.Pid)
		_ = running.wait(cmd)
		t.Fatal("the child exited by itself")
	}
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bench, out := startSelf(t, "TestSignalStopsChildren", "SCALE_SIGNAL_CHILD=1", "SCALE_SIGNAL_DIR="+dir)
	var pid int
	if _, err := fmt.Fscan(out, &pid); err != nil || pid <= 0 {
		_ = bench.Process.Kill()
		_ = bench.Wait()
		t.Fatalf("reading the child's PID: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	// The shell has exec'd sleep once its comm says so; the trap is set
	// before, so a SIGTERM sent now is ignored by the child.
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if strings.TrimSpace(string(b)) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d never ran sleep (comm %q)", pid, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	termAndWait(t, bench, out)
	// The bench exited: its child, if killed, was reparented and reaped,
	// or is a zombie for the moment; either way it runs no more.
	if alive(pid) {
		t.Errorf("child %d still running after the bench was stopped by SIGTERM", pid)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("recorded folder %s not removed: stat err %v", dir, err)
	}
}

// TestMetricLabelled reads one labelled sample of a Prometheus text
// exposition (the etcd request counters etcdDetail prints).
func TestMetricLabelled(t *testing.T) {
	m := []byte("# HELP machina_state_etcd_requests_total x\n" +
		"machina_state_etcd_requests_total{kind=\"txn\"} 1234\n" +
		"machina_state_etcd_requests_total{kind=\"update_range\"} 5\n" +
		"machina_state_etcd_request_seconds_total{kind=\"txn\"} 2.5\n")
	for _, c := range []struct {
		name, label string
		want        float64
	}{
		{"machina_state_etcd_requests_total", "txn", 1234},
		{"machina_state_etcd_requests_total", "update_range", 5},
		{"machina_state_etcd_request_seconds_total", "txn", 2.5},
		{"machina_state_etcd_requests_total", "revision", 0},
		{"machina_state_etcd_request", "txn", 0},
	} {
		if got := metricLabelled(m, c.name, c.label); got != c.want {
			t.Errorf("metricLabelled(%s, %s) = %v, want %v", c.name, c.label, got, c.want)
		}
	}
}

// TestCheckFileLimit: a size whose BMC listeners cannot fit this
// process's RLIMIT_NOFILE is refused before it starts, naming the limit
// and what is needed; one that fits is not.
func TestCheckFileLimit(t *testing.T) {
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = min(old.Cur, 4096)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_NOFILE, &old) })
	if err := checkFileLimit(1000); err != nil {
		t.Errorf("1,000 servers under %d open files: %v", low.Cur, err)
	}
	err := checkFileLimit(50000)
	if err == nil || !strings.Contains(err.Error(), "needs about 52000 open files") || !strings.Contains(err.Error(), fmt.Sprintf("RLIMIT_NOFILE is %d", low.Cur)) {
		t.Errorf("50,000 servers under %d open files: %v, want a refusal naming 52000 and the limit", low.Cur, err)
	}
}

// TestSignalStopsInProcessWriters: a bench stopped by SIGTERM while its
// own goroutines write into a recorded folder (the simulated lab's
// set-up writing machine trees) cancels them and waits for them before it
// removes the folder, so the folder is gone when the bench has exited.
// Before, the writers went on and created it again (a stopped
// 50,000-server set-up left 4.3 GB behind).
func TestSignalStopsInProcessWriters(t *testing.T) {
	if dir := os.Getenv("SCALE_WRITER_DIR"); dir != "" {
		stopOnSignal(running, 5*time.Second, syscall.SIGTERM)
		running.removeAtExit(dir)
		go func() {
			_ = running.inProcess(context.Background(), func(ctx context.Context) error {
				for i := 0; ctx.Err() == nil; i++ {
					d := filepath.Join(dir, "machines", strconv.Itoa(i%500), "root")
					if err := os.MkdirAll(d, 0o755); err != nil {
						continue // the folder is being removed under us
					}
					_ = os.WriteFile(filepath.Join(d, "f"), []byte("x"), 0o644)
					if i == 1000 {
						fmt.Println("writing")
					}
				}
				return ctx.Err()
			})
		}()
		select {}
	}
	dir := filepath.Join(t.TempDir(), "lab")
	bench, out := startSelf(t, "TestSignalStopsInProcessWriters", "SCALE_WRITER_DIR="+dir)
	var word string
	if _, err := fmt.Fscan(out, &word); err != nil || word != "writing" {
		_ = bench.Process.Kill()
		_ = bench.Wait()
		t.Fatalf("the child never said it was writing: %q, %v", word, err)
	}
	termAndWait(t, bench, out)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("folder %s written by an in-process writer is still there after the bench stopped: stat err %v", dir, err)
	}
}

// startSelf re-executes this test binary running only test, with env
// added, and returns it started with its standard output.
func startSelf(t *testing.T, test string, env ...string) (*exec.Cmd, io.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^"+test+"$")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// termAndWait sends the re-executed bench SIGTERM, reads its output to
// the end and checks it exited with status 128+SIGTERM, as stopOnSignal
// makes it.
func termAndWait(t *testing.T, bench *exec.Cmd, out io.Reader) {
	t.Helper()
	if err := bench.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, out)
	err := bench.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGTERM) {
		t.Errorf("bench exit = %v, want status %d", err, 128+int(syscall.SIGTERM))
	}
}
