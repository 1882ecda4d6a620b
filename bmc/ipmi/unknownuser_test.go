package ipmi

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/machina-metal/machina/bmc"
)

// startRAKP1Dropper relays UDP between one client and the BMC at
// backendPort and drops every RMCP+ RAKP Message 1 (payload type 12h) on
// its way to the BMC: the BMC then behaves like one that stays silent for
// a user name it does not know (pyghmi's BMC, so virtualbmc, does so)
// instead of answering RAKP Message 2 with status 0Dh. It returns the
// relay's port.
func startRAKP1Dropper(t *testing.T, backendPort int) int {
	t.Helper()
	ln, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	be, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: backendPort})
	if err != nil {
		t.Fatal(err)
	}
	var client *net.UDPAddr
	clientc := make(chan *net.UDPAddr, 1)
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 2048)
		for {
			n, from, err := ln.ReadFromUDP(buf)
			if err != nil {
				return
			}
			select {
			case clientc <- from:
			default:
			}
			pkt := buf[:n]
			// RMCP header (4 bytes, class 07h), auth type 06h (RMCP+), payload type.
			if n > 5 && pkt[3] == 0x07 && pkt[4] == 0x06 && pkt[5]&0x3F == 0x12 {
				continue
			}
			_, _ = be.Write(pkt)
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 2048)
		for {
			n, err := be.Read(buf)
			if err != nil {
				return
			}
			select {
			case client = <-clientc:
			default:
			}
			if client != nil {
				_, _ = ln.WriteToUDP(buf[:n], client)
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		be.Close()
		<-done
		<-done
	})
	return ln.LocalAddr().(*net.UDPAddr).Port
}

// TestUnknownUserSilentAtRAKP1IsAuthError: a BMC that answers Get Channel
// Authentication Capabilities and Open Session but never RAKP Message 1
// (how some BMCs refuse an unknown user name) gives bmc.ErrAuth naming the
// user, not ErrUnreachable, and never the password. Before, every suite
// timing out was reported as unreachable.
func TestUnknownUserSilentAtRAKP1IsAuthError(t *testing.T) {
	s := startSim(t)
	port := startRAKP1Dropper(t, s.port)
	d := newDriver(t, net.JoinHostPort("127.0.0.1", itoa(port)), "nosuchuser", "no-such-secret", nil)
	_, err := d.PowerState(testCtx(t))
	if !errors.Is(err, bmc.ErrAuth) || errors.Is(err, bmc.ErrUnreachable) {
		t.Fatalf("PowerState = %v; want ErrAuth and not ErrUnreachable", err)
	}
	if !strings.Contains(err.Error(), `"nosuchuser"`) || strings.Contains(err.Error(), "no-such-secret") {
		t.Errorf("error %q: want the user named and no password", err)
	}
}
