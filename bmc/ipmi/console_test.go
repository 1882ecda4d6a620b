package ipmi

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/console"
)

// standInIPMITool replaces ipmitool for the SOL round trip: it announces the
// session like ipmitool does and echoes what is typed, as a getty would. It
// records its argv and whether the password reached it through the
// environment.
const standInIPMITool = `#!/bin/sh
D=$(dirname "$0")
printf '%s\n' "$@" > "$D/argv"
[ -n "$IPMI_PASSWORD" ] && echo yes > "$D/env-password"
echo "[SOL Session operational.  Use ~? for help]"
exec cat
`

// TestSOLRoundTripOverWebSocket: bytes typed on the WebSocket go through the
// console handler, the ipmi driver's SOL console (the ipmitool process) and
// come back; the session is opened against ipmi_sim first.
func TestSOLRoundTripOverWebSocket(t *testing.T) {
	s := startSim(t)
	tool := filepath.Join(t.TempDir(), "ipmitool")
	if err := os.WriteFile(tool, []byte(standInIPMITool), 0o755); err != nil {
		t.Fatal(err)
	}
	d := newDriver(t, s.addr(), "admin", "password", func(c *Config) { c.IPMITool = tool })
	events := make(chan console.Event, 8)
	h, err := console.New(console.Config{
		Opener: console.DriverOpener(func(ctx context.Context, name string) (bmc.Driver, error) {
			if name != "ipmi-node" {
				return nil, console.ErrServerNotFound
			}
			return d, nil
		}),
		Authenticate: func(r *http.Request) (string, error) {
			if r.Header.Get("Authorization") != "Bearer t" {
				return "", errors.New("no")
			}
			return "ops", nil
		},
		Audit: func(_ context.Context, e console.Event) { events <- e },
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(console.Pattern, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/api/v1/servers/ipmi-node/console",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer t"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if e := <-events; e.Action != "console.open" || e.Principal != "ops" {
		t.Errorf("open event = %+v", e)
	}
	const typed = "uname -a\r\n"
	if err := c.Write(ctx, websocket.MessageBinary, []byte(typed)); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for len(got) < len(typed) {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read after %q: %v", got, err)
		}
		got = append(got, b...)
	}
	if string(got) != typed {
		t.Errorf("echo = %q, want %q", got, typed)
	}
	argv, _ := os.ReadFile(filepath.Join(filepath.Dir(tool), "argv"))
	if strings.Contains(string(argv), "password") || !strings.Contains(string(argv), "-E") {
		t.Errorf("stand-in ipmitool argv = %q: want -E and no password", argv)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(tool), "env-password")); err != nil {
		t.Errorf("password did not reach ipmitool through IPMI_PASSWORD")
	}
	c.Close(websocket.StatusNormalClosure, "")
	if e := <-events; e.Action != "console.close" {
		t.Errorf("close event = %+v", e)
	}
}

// TestSOLRoundTripThroughIPMISim is the end-to-end console: bytes typed on
// the WebSocket go through the console handler, ipmitool's SOL session
// (password via IPMI_PASSWORD), ipmi_sim's SOL, and the simulated host's
// serial port (a TCP listener here that echoes like a getty), and come back.
func TestSOLRoundTripThroughIPMISim(t *testing.T) {
	t.Parallel()
	requireTools(t)
	serial, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer serial.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := serial.Accept()
		if err != nil {
			return
		}
		accepted <- c
		_, _ = io.Copy(c, c) // echo, like a terminal with echo on
	}()
	s := startSimSerial(t, serial.Addr().String())
	// ipmi_sim connects at start (and retries about every 10 s).
	var host net.Conn
	select {
	case host = <-accepted:
		defer host.Close()
	case <-time.After(30 * time.Second):
		t.Fatal("ipmi_sim did not connect to the serial port within 30s")
	}

	d := newDriver(t, s.addr(), "admin", "password", nil)
	h, err := console.New(console.Config{
		Opener:       console.DriverOpener(func(ctx context.Context, name string) (bmc.Driver, error) { return d, nil }),
		Authenticate: func(r *http.Request) (string, error) { return "ops", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(console.Pattern, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/api/v1/servers/node-9/console", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	const typed = "echo machina\r"
	if err := c.Write(ctx, websocket.MessageBinary, []byte(typed)); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for !strings.Contains(string(got), typed) {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read after %q: %v", got, err)
		}
		got = append(got, b...)
	}
	t.Logf("console output: %q", got)
	c.Close(websocket.StatusNormalClosure, "")
}
