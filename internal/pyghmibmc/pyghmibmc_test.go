package pyghmibmc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/ipmi"
)

// fakeQMP is a qemu QMP server on a unix socket, enough for the QMP power
// backend: greeting, qmp_capabilities, query-status, cont, stop,
// system_reset. running is qemu's run state (-S: paused at start).
type fakeQMP struct {
	mu      sync.Mutex
	running bool
	cmds    []string
}

func (q *fakeQMP) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go q.conn(c)
	}
}

func (q *fakeQMP) conn(c net.Conn) {
	defer c.Close()
	enc := json.NewEncoder(c)
	_ = enc.Encode(map[string]any{"QMP": map[string]any{"version": map[string]any{}, "capabilities": []string{}}})
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		var req struct{ Execute string }
		if json.Unmarshal(sc.Bytes(), &req) != nil {
			return
		}
		q.mu.Lock()
		q.cmds = append(q.cmds, req.Execute)
		var ret any = map[string]any{}
		switch req.Execute {
		case "query-status":
			st := "paused"
			if q.running {
				st = "running"
			}
			ret = map[string]any{"running": q.running, "status": st}
		case "cont":
			q.running = true
		case "stop":
			q.running = false
		}
		q.mu.Unlock()
		_ = enc.Encode(map[string]any{"return": ret})
	}
}

func (q *fakeQMP) commands() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []string
	for _, c := range q.cmds {
		if c != "qmp_capabilities" && c != "query-status" {
			out = append(out, c)
		}
	}
	return out
}

// TestQMPPowerBackend: the power backend is pluggable; pointed at a qemu
// QMP socket (as the VM lab would), power on is "cont" of the paused
// machine, a reset "system_reset", off "stop" then "system_reset", and
// the power state is query-status's running.
func TestQMPPowerBackend(t *testing.T) {
	Require(t)
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	q := &fakeQMP{}
	go q.serve(ln)
	b := Start(t, Config{Power: "qmp:" + sock})
	d, err := ipmi.New(ipmi.Config{Address: b.Addr(), Username: "admin", Password: "password", PowerTimeout: 5 * time.Second,
		PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	defer d.Close(context.Background())
	if ps, err := d.PowerState(ctx); err != nil || ps != bmc.PowerOff {
		t.Fatalf("paused machine: PowerState = %v, %v; want off", ps, err)
	}
	if err := d.Power(ctx, bmc.PowerActionOn); err != nil {
		t.Fatal(err)
	}
	if err := d.Power(ctx, bmc.PowerActionReset); err != nil && !errors.Is(err, bmc.ErrUnverified) {
		t.Fatal(err)
	}
	if err := d.Power(ctx, bmc.PowerActionOff); err != nil {
		t.Fatal(err)
	}
	if want := []string{"cont", "system_reset", "stop", "system_reset"}; !slices.Equal(q.commands(), want) {
		t.Errorf("QMP commands %q, want %q", q.commands(), want)
	}
}
