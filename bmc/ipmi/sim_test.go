package ipmi

import (
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/binary"
	"github.com/machina-metal/machina/bmc/ipmi/ipmisim/ipmisimtest"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/crypto"
	"github.com/bougou/go-ipmi/pkg/types"
)

// sim wraps ipmisimtest.Sim with the short names these tests use.
type sim struct {
	*ipmisimtest.Sim
	dir  string
	port int
}

func wrapSim(s *ipmisimtest.Sim) *sim      { return &sim{Sim: s, dir: s.Dir, port: s.Port} }
func startSim(t *testing.T) *sim           { return wrapSim(ipmisimtest.Start(t)) }
func requireTools(t *testing.T)            { ipmisimtest.RequireTools(t) }
func freeUDPPort(t *testing.T) int         { return ipmisimtest.FreeUDPPort(t) }
func (s *sim) calls() []string             { return s.Calls() }
func (s *sim) resetCalls()                 { s.ResetCalls() }
func (s *sim) setCalls() []string          { return s.SetCalls() }
func (s *sim) restart()                    { s.Restart() }
func (s *sim) addr() string                { return s.Addr() }
func (s *sim) ipmitool(a ...string) string { return s.Ipmitool(a...) }
func startSimSerial(t *testing.T, serialAddr string) *sim {
	return wrapSim(ipmisimtest.StartSerial(t, serialAddr))
}

// newDriver returns a driver for addr with short test timeouts.
func newDriver(t *testing.T, addr, user, pass string, mod func(*Config)) *Driver {
	t.Helper()
	cfg := Config{
		Address: addr, Username: user, Password: pass,
		// 1s like the defaults: the machine is shared and ipmi_sim runs the
		// chassis_control program synchronously.
		HandshakeTimeout: time.Second, Timeout: time.Second, Retries: 1,
		PowerTimeout: 5 * time.Second, SoftOffTimeout: 2 * time.Second, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&cfg)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	return d
}

// ---- UDP proxy that decrypts, reads and rewrites RMCP+ IPMI messages ----

// proxy relays UDP between one client and ipmi_sim. It watches the RAKP
// exchange (IPMI v2.0 §13.20-13.23), derives the session keys from the
// known password (§13.31-13.32: SIK, K1, K2) for cipher suite 3, and so can
// decrypt (AES-CBC-128, §13.29) and re-sign (HMAC-SHA1-96, §13.28.4) session
// messages: it records requests and applies the rules below.
type proxy struct {
	t        *testing.T
	ln       *net.UDPConn
	backend  *net.UDPAddr
	user     string
	password string

	mu sync.Mutex
	// reject maps a Chassis Control value to the completion code to answer
	// with; the request is rewritten to an undefined control value (06h,
	// which ipmi_sim acknowledges and ignores) so the BMC does nothing.
	reject map[uint8]uint8
	// dropResponses is how many Get Chassis Status responses to drop.
	dropResponses int
	// dropControl maps a Chassis Control value to how many of its
	// responses to drop (the BMC acted; its answer is lost on the way).
	dropControl map[uint8]int
	ctlSeq      map[uint8]uint8 // rqSeq → Chassis Control value, for dropControl
	pending     map[uint8]uint8 // rqSeq → completion code to put in its response
	requests    []ipmiMsg
	client      *net.UDPAddr

	// openSessionAlgs records the authentication algorithm of every RMCP+
	// Open Session Request (01h = RAKP-HMAC-SHA1, suite 3; 03h =
	// RAKP-HMAC-SHA256, suite 17).
	openSessionAlgs []uint8
	// silenceSHA256 drops Open Session Requests proposing RAKP-HMAC-SHA256,
	// like a BMC that ignores cipher suite 17.
	silenceSHA256 bool

	rc, rm []byte // console and BMC random numbers of the current RAKP exchange
	role   uint8
	k1, k2 []byte
}

// ipmiMsg is one IPMI LAN request seen by the proxy.
type ipmiMsg struct {
	NetFn, Cmd, Seq uint8
	Data            []byte
}

func startProxy(t *testing.T, backendPort int, user, password string) *proxy {
	t.Helper()
	ln, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, ln: ln, backend: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: backendPort},
		user: user, password: password, reject: map[uint8]uint8{}, pending: map[uint8]uint8{},
		dropControl: map[uint8]int{}, ctlSeq: map[uint8]uint8{}}
	be, err := net.DialUDP("udp4", nil, p.backend)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	go func() { // client → BMC
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 2048)
		for {
			n, from, err := ln.ReadFromUDP(buf)
			if err != nil {
				return
			}
			p.mu.Lock()
			p.client = from
			pkt := p.onPacket(append([]byte(nil), buf[:n]...), true)
			p.mu.Unlock()
			_, _ = be.Write(pkt)
		}
	}()
	go func() { // BMC → client
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 2048)
		for {
			n, err := be.Read(buf)
			if err != nil {
				return
			}
			p.mu.Lock()
			pkt := p.onPacket(append([]byte(nil), buf[:n]...), false)
			to := p.client
			p.mu.Unlock()
			if pkt != nil && to != nil {
				_, _ = ln.WriteToUDP(pkt, to)
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		be.Close()
		<-done
		<-done
	})
	return p
}

func (p *proxy) port() int { return p.ln.LocalAddr().(*net.UDPAddr).Port }

func (p *proxy) set(f func(p *proxy)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// onPacket inspects one datagram and returns it (possibly rewritten), or nil to drop it.
func (p *proxy) onPacket(pkt []byte, toBMC bool) []byte {
	// RMCP header (4) + auth type 06h + payload type + session ID (4) + seq (4) + length (2).
	if len(pkt) < 16 || pkt[0] != 0x06 || pkt[3] != 0x07 || pkt[4] != 0x06 {
		return pkt
	}
	ptype := pkt[5] & 0x3F
	n := int(binary.LittleEndian.Uint16(pkt[14:16]))
	if 16+n > len(pkt) {
		return pkt
	}
	payload := pkt[16 : 16+n]
	switch {
	case ptype == 0x10 && toBMC && n >= 32: // RMCP+ Open Session Request (table 13-9)
		p.openSessionAlgs = append(p.openSessionAlgs, payload[12])
		if p.silenceSHA256 && payload[12] == 0x03 {
			return nil
		}
		return pkt
	case ptype == 0x12 && toBMC && n >= 28: // RAKP Message 1
		p.rc = append([]byte(nil), payload[8:24]...)
		p.role = payload[24]
		return pkt
	case ptype == 0x13 && !toBMC && n >= 40: // RAKP Message 2
		p.rm = append([]byte(nil), payload[8:24]...)
		_, k1, k2, err := crypto.DeriveSessionKeys(types.AuthAlg_HMAC_SHA1, p.rc, p.rm, p.role, p.user, crypto.PadPassword20([]byte(p.password)))
		if err != nil {
			p.t.Errorf("proxy: derive keys: %v", err)
		}
		p.k1, p.k2 = k1, k2
		return pkt
	case ptype != 0x00 || pkt[5]&0xC0 != 0xC0 || p.k2 == nil: // not an encrypted, signed IPMI message
		return pkt
	}
	plain, err := crypto.DecryptAESPayload(payload, p.k2)
	if err != nil || len(plain) < 7 {
		return pkt
	}
	changed := false
	if toBMC {
		msg := ipmiMsg{NetFn: plain[1] >> 2, Seq: plain[4] >> 2, Cmd: plain[5], Data: append([]byte(nil), plain[6:len(plain)-1]...)}
		p.requests = append(p.requests, msg)
		if msg.NetFn == 0x00 && msg.Cmd == 0x02 && len(msg.Data) == 1 {
			p.ctlSeq[msg.Seq] = msg.Data[0]
			if cc, ok := p.reject[msg.Data[0]]; ok {
				p.pending[msg.Seq] = cc
				plain[6] = 0x06
				plain[len(plain)-1] = checksum(plain[3 : len(plain)-1])
				changed = true
			}
		}
	} else {
		netFn, seq, cmd := plain[1]>>2, plain[4]>>2, plain[5]
		if netFn == 0x01 && cmd == 0x01 && p.dropResponses > 0 {
			p.dropResponses--
			return nil
		}
		if v, ok := p.ctlSeq[seq]; ok && netFn == 0x01 && cmd == 0x02 && p.dropControl[v] > 0 {
			p.dropControl[v]--
			return nil
		}
		if cc, ok := p.pending[seq]; ok && netFn == 0x01 && cmd == 0x02 {
			delete(p.pending, seq)
			// Response: rqAddr netFn chk1 rsAddr seq cmd cc chk2.
			plain[6] = cc
			plain[len(plain)-1] = checksum(plain[3 : len(plain)-1])
			changed = true
		}
	}
	if !changed {
		return pkt
	}
	enc, err := crypto.EncryptAESPayload(plain, p.k2, payload[:16])
	if err != nil || len(enc) != n {
		p.t.Errorf("proxy: re-encrypt: %v (len %d, want %d)", err, len(enc), n)
		return pkt
	}
	copy(payload, enc)
	// Session trailer: integrity pad, pad length, next header, 12-byte AuthCode
	// = HMAC-SHA1(K1, auth type .. next header)[:12].
	mac := hmac.New(sha1.New, p.k1)
	mac.Write(pkt[4 : len(pkt)-12])
	copy(pkt[len(pkt)-12:], mac.Sum(nil)[:12])
	return pkt
}

// checksum is the IPMB two's complement checksum (IPMI v2.0 §13.8).
func checksum(b []byte) uint8 {
	var s uint8
	for _, x := range b {
		s += x
	}
	return -s
}

// sent returns the recorded requests with netFn and cmd.
func (p *proxy) sent(netFn, cmd uint8) [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out [][]byte
	for _, m := range p.requests {
		if m.NetFn == netFn && m.Cmd == cmd {
			out = append(out, m.Data)
		}
	}
	return out
}
