package main

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/redfish"
)

func TestBmcsimServesTreeOverHTTPS(t *testing.T) {
	t.Setenv("MACHINA_BMCSIM_PASSWORD", "t0psecret")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"bmcsim", "--tree", "hpe-proliant-dl385gen10plusv2-ilo5", "--listen", "127.0.0.1:0"}, strings.NewReader(""), pw, io.Discard)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	url := ""
	for sc.Scan() {
		if i := strings.Index(sc.Text(), " on https://"); i >= 0 {
			url = sc.Text()[i+4:]
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if url == "" {
		t.Fatalf("no listening line; exit %d", <-done)
	}
	drv, err := redfish.New(redfish.Config{Endpoint: url, Username: "admin", Password: "t0psecret", Insecure: true, PollInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Power(ctx, bmc.PowerActionOff); err != nil {
		t.Fatal(err)
	}
	ps, err := drv.PowerState(ctx)
	if err != nil || ps != bmc.PowerOff {
		t.Fatalf("PowerState = %v, %v", ps, err)
	}
	_ = drv.Close(ctx)
	// TLS is verified by default: the self-signed certificate is refused.
	strict, _ := redfish.New(redfish.Config{Endpoint: url, Username: "admin", Password: "t0psecret", Retries: -1})
	if _, err := strict.PowerState(ctx); err == nil {
		t.Error("self-signed certificate accepted without --insecure")
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d after cancel, want 0", code)
	}
}

func TestBmcsimRejectsBadTree(t *testing.T) {
	code := run(context.Background(), []string{"bmcsim", "--tree", "../etc", "--listen", "127.0.0.1:0"}, strings.NewReader(""), io.Discard, io.Discard)
	if code == 0 {
		t.Error("path-like tree name accepted")
	}
}
