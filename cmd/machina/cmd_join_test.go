package main

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join/node"
	"github.com/machina-metal/machina/state"
	"github.com/spf13/cobra"
)

// TestServeWithJoinListener: ServeConfig.Setup wired with the join
// listener: a token created over the admin API joins a host over TLS.
func TestServeWithJoinListener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := state.Open(path, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	admin, _, err := st.CreateAdminToken("ops", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	apiReady := make(chan net.Addr, 1)
	joinReady := make(chan string, 1)
	jc := JoinServeConfig{Listen: "127.0.0.1:0", OnReady: func(u string) { joinReady <- u }}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	cfg := ServeConfig{StatePath: path, Listen: "127.0.0.1:0", Logger: log, MasterKey: []byte("0123456789abcdef"),
		Setup: jc.Setup(ctx, log, nil), OnReady: func(a net.Addr) { apiReady <- a }}
	done := make(chan error, 1)
	go func() { done <- cfg.Run(ctx) }()
	var addr net.Addr
	select {
	case addr = <-apiReady:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	joinURL := <-joinReady
	c, _ := v1.NewClient("http://"+addr.String(), admin)
	tok, err := c.CreateEnrolmentToken(t.Context(), v1.EnrolmentRequest{Site: "lab1", TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	if tok.JoinURL != joinURL {
		t.Fatalf("token join URL %s, want %s", tok.JoinURL, joinURL)
	}
	if _, err := node.Join(t.Context(), node.JoinConfig{URL: tok.JoinURL, Fingerprint: tok.CAFingerprint, Token: tok.Token, Dir: t.TempDir(),
		Facts: v1.HostFacts{Hostname: "hv9", MemoryBytes: 4 << 30}}); err != nil {
		t.Fatalf("Join: %v", err)
	}
	hosts, err := c.Hosts(t.Context())
	if err != nil || len(hosts.Items) != 1 || hosts.Items[0].Name != "hv9" || hosts.Items[0].Site != "lab1" {
		t.Fatalf("Hosts = %+v, %v", hosts, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	// The CA survives restarts: its key is sealed in the store.
	st, err = state.Open(path, state.Options{MasterKey: []byte("0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if rec, err := st.CA(); err != nil || !rec.Sealed {
		t.Fatalf("stored CA sealed=%v err=%v", rec.Sealed, err)
	}
}

func TestJoinFlagsAndUnspecifiedListen(t *testing.T) {
	var jc JoinServeConfig
	cmd := &cobra.Command{Use: "serve"}
	jc.register(cmd)
	if err := cmd.ParseFlags([]string{"--join-listen", "0.0.0.0:0", "--node-binary", "/usr/lib/machina/machina-node"}); err != nil {
		t.Fatal(err)
	}
	if jc.Listen != "0.0.0.0:0" || jc.NodeBinary != "/usr/lib/machina/machina-node" || jc.URL != "" {
		t.Fatalf("flags = %+v", jc)
	}
	st, err := state.Open(filepath.Join(t.TempDir(), "s.db"), state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Listening on every address needs --join-url: hosts must be told where to go.
	err = jc.Setup(t.Context(), nil, nil)(st, nil)
	if err == nil || !strings.Contains(err.Error(), "--join-url") {
		t.Fatalf("Setup on 0.0.0.0 without URL = %v, want an error naming --join-url", err)
	}
}
