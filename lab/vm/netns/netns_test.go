package netns

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/internal/peertest"
)

func needRoot(t *testing.T) {
	t.Helper()
	peertest.Root(t, "network namespaces")
	peertest.Command(t, "ip")
}

func TestCreateRunClose(t *testing.T) {
	needRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n, err := Create(ctx, Config{
		Prefix:      "m14",
		BridgeAddrs: []netip.Prefix{netip.MustParsePrefix("10.99.14.1/24"), netip.MustParsePrefix("fd99:14::1/64")},
		Taps:        2,
		Logger:      slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = n.Close() })
	if !strings.HasPrefix(n.Name, "m14-") || len(n.Name) != len("m14-")+6 {
		t.Fatalf("Name = %q, want m14-<6 hex>", n.Name)
	}
	if _, err := os.Stat("/run/netns/" + n.Name); err != nil {
		t.Fatalf("namespace not created: %v", err)
	}

	// Bridge and taps are inside the namespace, up, taps enslaved.
	out, err := exec.Command("ip", "-n", n.Name, "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	links := string(out)
	for _, tap := range []string{"tap0", "tap1"} {
		if !strings.Contains(links, ": "+tap+": ") || !strings.Contains(lineOf(links, tap), "master br0") {
			t.Errorf("%s not attached to br0 in:\n%s", tap, links)
		}
	}
	if !strings.Contains(lineOf(links, "br0"), "UP") {
		t.Errorf("br0 not up:\n%s", links)
	}
	// The host does not see them.
	host, _ := exec.Command("ip", "-o", "link", "show").Output()
	if strings.Contains(string(host), n.Name) {
		t.Errorf("host links mention %s", n.Name)
	}

	// A process inside the namespace reaches the bridge address over TCP
	// (socat listener and client, both inside), proving the process runs
	// there with the bridge configured.
	peertest.Command(t, "socat")
	srv, err := n.Start(n.Command(ctx, "socat", "TCP-LISTEN:7014,bind=10.99.14.1,reuseaddr,fork", "SYSTEM:echo served-inside-netns"))
	if err != nil {
		t.Fatal(err)
	}
	// The listener may not be bound yet: socat's retry option on the client
	// side waits for it instead of the test sleeping.
	cl := n.Command(ctx, "socat", "-u", "TCP:10.99.14.1:7014,retry=50,interval=0.1", "-")
	got, err := cl.Output()
	if err != nil {
		t.Fatalf("client in netns: %v", err)
	}
	if strings.TrimSpace(string(got)) != "served-inside-netns" {
		t.Fatalf("client got %q", got)
	}
	// The listener answered, so `ip netns exec` has entered the namespace.
	in, err := n.Contains(srv.Pid())
	if err != nil || !in {
		t.Fatalf("Contains(%d) = %v, %v; want true", srv.Pid(), in, err)
	}
	if in, _ := n.Contains(os.Getpid()); in {
		t.Fatal("test process reported inside the namespace")
	}

	// A long-running process is stopped by Close, and the namespace is gone.
	slCmd := n.Command(context.Background(), "sh", "-c", "echo ready; exec sleep 600")
	stdout, err := slCmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	sl, err := n.Start(slCmd)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("read ready line: %q, %v", line, err)
	}
	pids, err := n.Pids(ctx)
	if err != nil || !contains(pids, sl.Pid()) {
		t.Fatalf("Pids = %v, %v; want to include %d", pids, err, sl.Pid())
	}
	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, p := range []*Process{srv, sl} {
		select {
		case <-p.Done():
		default:
			t.Fatalf("process %d still running after Close", p.Pid())
		}
	}
	if _, err := os.Stat("/run/netns/" + n.Name); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("namespace still present after Close: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := n.Start(n.Command(ctx, "true")); err == nil {
		t.Fatal("Start after Close succeeded")
	}
}

func TestInvalidNames(t *testing.T) {
	for _, c := range []Config{{Prefix: "Bad"}, {Prefix: "a;rm"}, {Bridge: "br0 up"}, {Prefix: strings.Repeat("a", 17)}, {Taps: -1}} {
		if _, err := Create(context.Background(), c); err == nil {
			t.Errorf("Create(%+v) succeeded", c)
		} else if c.Taps == 0 && !errors.Is(err, ErrInvalidName) {
			t.Errorf("Create(%+v) = %v, want ErrInvalidName", c, err)
		}
	}
}

func lineOf(s, dev string) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.Contains(sc.Text(), ": "+dev+": ") || strings.Contains(sc.Text(), ": "+dev+"@") {
			return sc.Text()
		}
	}
	return ""
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
