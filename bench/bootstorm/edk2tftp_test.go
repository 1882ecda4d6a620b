package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	ptftp "github.com/pin/tftp/v3"

	"github.com/machina-metal/machina/boot/tftp"
)

var loopback = netip.MustParseAddr("127.0.0.1")

// TestEDK2GetWindowed: the storm's EDK2 client against Machina's TFTP
// server gets windowsize 4 granted and the file whole, for a size ending in
// a short block and one that is a whole number of blocks (an empty last
// block, RFC 1350 §6); the probe's tsize matches the bytes received.
func TestEDK2GetWindowed(t *testing.T) {
	root := t.TempDir()
	files := map[string][]byte{"short.efi": randBytes(t, 300*1024+17), "whole.efi": randBytes(t, 7*edk2BlkSize)}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(root, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := tftp.New(tftp.Config{Root: root, Addr: "127.0.0.1:0", ScriptURL: "http://127.0.0.1:1/boot/ipxe"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for name, want := range files {
		res, err := edk2Get(s.Addr().AddrPort(), name, loopback, time.Second, 3)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if res.window != edk2WindowSize || res.size != int64(len(want)) || res.tsize != int64(len(want)) {
			t.Errorf("%s: window %d, %d bytes, tsize %d; want window %d, %d bytes both", name, res.window, res.size, res.tsize, edk2WindowSize, len(want))
		}
	}
	// Each probe is aborted by the client (error 8) and each transfer
	// served, nothing failed or refused. The server counts a transfer when
	// it reads the client's last packet, after edk2Get has returned.
	want := tftp.Stats{Served: 2, Probed: 2, Windowed: 2}
	st := s.Stats()
	for deadline := time.Now().Add(5 * time.Second); st != want && time.Now().Before(deadline); st = s.Stats() {
		time.Sleep(5 * time.Millisecond)
	}
	if st != want {
		t.Errorf("server stats %+v, want %+v", st, want)
	}
}

// TestEDK2GetLockstep: against a server without RFC 7440 (pin/tftp's,
// which like dnsmasq 2.90 leaves windowsize out of its OACK) the client
// falls back to a window of 1 and gets the same bytes.
func TestEDK2GetLockstep(t *testing.T) {
	want := randBytes(t, 200*1024+5)
	srv := ptftp.NewServer(func(name string, rf io.ReaderFrom) error {
		if ts, ok := rf.(ptftp.OutgoingTransfer); ok {
			ts.SetSize(int64(len(want)))
		}
		_, err := rf.ReadFrom(bytes.NewReader(want))
		return err
	}, nil)
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(conn)
	t.Cleanup(srv.Shutdown)
	res, err := edk2Get(conn.LocalAddr().(*net.UDPAddr).AddrPort(), "ipxe.efi", loopback, time.Second, 3)
	if err != nil {
		t.Fatal(err)
	}
	if res.window != 1 || res.size != int64(len(want)) || res.tsize != int64(len(want)) {
		t.Errorf("window %d, %d bytes, tsize %d; want window 1, %d bytes both", res.window, res.size, res.tsize, len(want))
	}
}

func randBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
