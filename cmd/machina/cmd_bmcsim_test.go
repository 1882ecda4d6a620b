package main

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/pem"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmctest"
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

// TestBmcsimModeAndCACert: `machina bmcsim --mode basic-only
// --tls-cert/--tls-key` serves a Basic-only BMC with a CA-issued
// certificate; a driver pinning the CA and falling back to Basic works.
func TestBmcsimModeAndCACert(t *testing.T) {
	t.Setenv("MACHINA_BMCSIM_PASSWORD", "t0psecret")
	ca := bmctest.NewCA(t)
	leaf := ca.Leaf()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "bmc.pem"), filepath.Join(dir, "bmc.key")
	keyDER, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"bmcsim", "--tree", "dell-poweredge-r750-idrac9", "--listen", "127.0.0.1:0", "--mode", "basic-only",
			"--tls-cert", certFile, "--tls-key", keyFile}, strings.NewReader(""), pw, io.Discard)
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
	drv, err := redfish.New(redfish.Config{Endpoint: url, Username: "admin", Password: "t0psecret", RootCAs: ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := drv.PowerState(ctx); err != nil {
		t.Fatalf("CA-pinned, Basic-only: %v", err)
	}
	if drv.AuthScheme() != redfish.AuthBasic {
		t.Errorf("scheme %q, want basic", drv.AuthScheme())
	}
	_ = drv.Close(ctx)
	if code := run(context.Background(), []string{"bmcsim", "--tree", "dell-poweredge-r750-idrac9", "--mode", "nope"}, strings.NewReader(""), io.Discard, io.Discard); code == 0 {
		t.Error("unknown mode accepted")
	}
	cancel()
	<-done
}
