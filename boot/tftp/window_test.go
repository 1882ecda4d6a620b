package tftp

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/machina-metal/machina/boot/internal/netnstest"
)

// rawClient is a minimal TFTP client written for these tests, as no
// installed client sends windowsize (tftp-hpa and the pin/tftp client do
// not; curl does not either). It speaks RFC 1350 with the RFC 7440
// receiver rules: ACK after every windowsize blocks received in order and
// after the last block; on a gap, ACK the last block received in order;
// on a block it already has (a resent window), ACK the last in-order
// block again.
type rawClient struct {
	t    *testing.T
	conn *net.UDPConn
	srv  *net.UDPAddr // port 69's stand-in
	tid  *net.UDPAddr // the transfer's address, from the first answer
	// dropData: ignore DATA block b the first time it arrives (a lost
	// packet). dropACK: do not send the ACK for block b the first time.
	dropData, dropACK map[uint16]bool
	// guard bounds each wait for a packet; a transfer needing a longer
	// server retransmission timeout fails the test.
	guard time.Duration

	dups, gaps int // blocks received twice; gap ACKs sent
}

func newRawClient(t *testing.T, addr string) *rawClient {
	t.Helper()
	srv, err := net.ResolveUDPAddr("udp4", addr)
	must(t, err)
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	must(t, err)
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, conn: c, srv: srv, dropData: map[uint16]bool{}, dropACK: map[uint16]bool{}, guard: 3 * time.Second}
}

func rrqPacket(name, mode string, opts ...string) []byte {
	b := []byte{0, opRRQ}
	for _, s := range append([]string{name, mode}, opts...) {
		b = append(append(b, s...), 0)
	}
	return b
}

func ackPacket(n uint16) []byte { return []byte{0, opACK, byte(n >> 8), byte(n)} }

func (c *rawClient) send(p []byte) {
	to := c.tid
	if to == nil {
		to = c.srv
	}
	if _, err := c.conn.WriteToUDP(p, to); err != nil {
		c.t.Fatal(err)
	}
}

// recv returns the next packet from the transfer's TID (or, before the
// first answer, from any port of the server host).
func (c *rawClient) recv() []byte {
	buf := make([]byte, 65536)
	must(c.t, c.conn.SetReadDeadline(time.Now().Add(c.guard)))
	n, from, err := c.conn.ReadFromUDP(buf)
	if err != nil {
		c.t.Fatalf("waiting for a packet: %v", err)
	}
	if c.tid == nil {
		c.tid = from
	} else if from.Port != c.tid.Port {
		c.t.Fatalf("packet from port %d, transfer is on %d (two TIDs for one request)", from.Port, c.tid.Port)
	}
	return buf[:n]
}

// parseOACK returns the OACK's options, or nil if p is not an OACK.
func parseOACK(p []byte) map[string]string {
	if len(p) < 2 || binary.BigEndian.Uint16(p) != opOACK {
		return nil
	}
	f := strings.Split(string(p[2:]), "\x00")
	m := map[string]string{}
	for i := 0; i+1 < len(f); i += 2 {
		m[f[i]] = f[i+1]
	}
	return m
}

// get sends an RRQ with opts and receives the file with blksize bs and
// windowsize ws (those the OACK grants, when it grants them).
func (c *rawClient) get(name string, opts ...string) (data []byte, oack map[string]string) {
	c.t.Helper()
	c.send(rrqPacket(name, "octet", opts...))
	bs, ws := 512, 1
	p := c.recv()
	if oack = parseOACK(p); oack != nil {
		if v, ok := oack["blksize"]; ok {
			bs, _ = strconv.Atoi(v)
		}
		if v, ok := oack["windowsize"]; ok {
			ws, _ = strconv.Atoi(v)
		}
		c.send(ackPacket(0))
		p = c.recv()
	}
	expected := uint64(1)
	inWindow := 0
	gapAcked := false
	for {
		op := binary.BigEndian.Uint16(p)
		if op == opERROR {
			c.t.Fatalf("server error %d: %q", binary.BigEndian.Uint16(p[2:]), p[4:])
		}
		if op != opDATA {
			c.t.Fatalf("opcode %d, want DATA", op)
		}
		b := binary.BigEndian.Uint16(p[2:])
		payload := p[4:]
		switch ahead := b - uint16(expected); {
		case c.dropData[b]:
			delete(c.dropData, b)
		case ahead == 0:
			data = append(data, payload...)
			expected++
			inWindow++
			gapAcked = false
			last := len(payload) < bs
			if last || inWindow == ws {
				inWindow = 0
				if c.dropACK[b] {
					delete(c.dropACK, b)
				} else {
					c.send(ackPacket(b))
				}
			}
			if last {
				return data, oack
			}
		case ahead < 0x8000: // a block past the one expected: a gap
			if !gapAcked {
				c.gaps++
				gapAcked = true
				inWindow = 0
				c.send(ackPacket(uint16(expected - 1)))
			}
		default: // a block already received: the server resent a window
			c.dups++
			c.send(ackPacket(uint16(expected - 1)))
		}
		p = c.recv()
	}
}

func writeFile(t *testing.T, f *fixture, name string, size int) []byte {
	t.Helper()
	b := make([]byte, size)
	_, _ = rand.Read(b)
	must(t, os.WriteFile(filepath.Join(f.root, name), b, 0o644))
	return b
}

// TestWindowSize: RFC 7440 negotiation and transfer with the final block
// short, full (followed by an empty block) and empty, and the OACK
// carrying blksize, tsize and windowsize as granted.
func TestWindowSize(t *testing.T) {
	f := newFixture(t, Config{MaxWindowSize: 16})
	for _, tc := range []struct {
		name      string
		size      int
		ws, grant string
	}{
		{"short-last", 4*512 + 100, "4", "4"},
		{"full-last", 8 * 512, "4", "4"},
		{"empty", 0, "4", "4"},
		{"capped", 40*512 + 1, "64", "16"},
		{"one", 3*512 + 7, "1", "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := writeFile(t, f, tc.name+".bin", tc.size)
			c := newRawClient(t, f.addr)
			got, oack := c.get(tc.name+".bin", "blksize", "512", "tsize", "0", "windowsize", tc.ws)
			if !bytes.Equal(got, want) {
				t.Fatalf("got %d bytes, want %d identical", len(got), len(want))
			}
			if d := cmp.Diff(map[string]string{"blksize": "512", "tsize": strconv.Itoa(tc.size), "windowsize": tc.grant}, oack); d != "" {
				t.Fatalf("OACK (-want +got):\n%s", d)
			}
			if c.dups != 0 || c.gaps != 0 {
				t.Fatalf("clean transfer had %d duplicate blocks, %d gaps", c.dups, c.gaps)
			}
		})
	}
	// Four of the five ran with a window over one block; "one" did not.
	waitFor(t, func() bool { return f.srv.Stats().Served == 5 })
	if st := f.srv.Stats(); st.Windowed != 4 {
		t.Errorf("stats %+v: want Windowed 4 of 5 served", st)
	}
}

// TestWindowLostACK: the client's ACK for the first window is lost; the
// server resends the window after its timeout, the client re-ACKs, and the
// file arrives whole.
func TestWindowLostACK(t *testing.T) {
	f := newFixture(t, Config{Timeout: 100 * time.Millisecond})
	want := writeFile(t, f, "w.bin", 10*512+3)
	c := newRawClient(t, f.addr)
	c.dropACK[4] = true
	got, _ := c.get("w.bin", "blksize", "512", "windowsize", "4")
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d identical", len(got), len(want))
	}
	if c.dups != 4 {
		t.Fatalf("client saw %d resent blocks, want the 4 of the first window", c.dups)
	}
	waitFor(t, func() bool { return f.srv.Stats().Served == 1 })
	if st := f.srv.Stats(); st.Failed != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestWindowGap: block 2 of the first window is lost; the client ACKs
// block 1 when block 3 arrives and the server restarts the window at 2 at
// once. The server's timeout (5 s) is longer than the client's guard (2 s),
// so a transfer that waited for the timeout fails.
func TestWindowGap(t *testing.T) {
	f := newFixture(t, Config{Timeout: 5 * time.Second})
	want := writeFile(t, f, "g.bin", 10*512+3)
	c := newRawClient(t, f.addr)
	c.guard = 2 * time.Second
	c.dropData[2] = true
	got, _ := c.get("g.bin", "blksize", "512", "windowsize", "4")
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d identical", len(got), len(want))
	}
	if c.gaps != 1 {
		t.Fatalf("gaps = %d, want 1", c.gaps)
	}
}

// TestLockstepLostACK: without windowsize, a lost ACK makes the server
// resend that one block after its timeout (RFC 1350).
func TestLockstepLostACK(t *testing.T) {
	f := newFixture(t, Config{Timeout: 100 * time.Millisecond})
	want := writeFile(t, f, "l.bin", 3*512+10)
	c := newRawClient(t, f.addr)
	c.dropACK[2] = true
	got, oack := c.get("l.bin")
	if oack != nil {
		t.Fatalf("OACK %v for a request without options (RFC 2347: DATA 1 comes first)", oack)
	}
	if !bytes.Equal(got, want) || c.dups != 1 {
		t.Fatalf("got %d bytes (identical: %v), %d resent blocks, want 1", len(got), bytes.Equal(got, want), c.dups)
	}
}

// TestBlockRollover: a transfer of more than 65535 blocks rolls the block
// number over to 0 and keeps going (8-byte blocks, window 64).
func TestBlockRollover(t *testing.T) {
	f := newFixture(t, Config{})
	want := writeFile(t, f, "big.bin", 65536*8+5)
	got, _ := newRawClient(t, f.addr).get("big.bin", "blksize", "8", "windowsize", "64")
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d identical", len(got), len(want))
	}
}

// TestOptionHandling: option names and the mode are case-insensitive,
// out-of-range values are declined (left out of the OACK), unknown
// options are ignored, blksize is capped at MaxBlockSize.
func TestOptionHandling(t *testing.T) {
	f := newFixture(t, Config{MaxBlockSize: 1024})
	want := writeFile(t, f, "o.bin", 5000)
	c := newRawClient(t, f.addr)
	c.send(rrqPacket("o.bin", "OCTET", "BlkSize", "4096", "WINDOWSIZE", "0", "timeout", "3", "TSIZE", "0"))
	if d := cmp.Diff(map[string]string{"blksize": "1024", "tsize": "5000"}, parseOACK(c.recv())); d != "" {
		t.Fatalf("OACK (-want +got):\n%s", d)
	}
	c.send(errorPacket(codeBadOptions, "done")) // end it now rather than at the server's timeout
	c2 := newRawClient(t, f.addr)
	got, _ := c2.get("o.bin", "blksize", "1024", "windowsize", "70000")
	if !bytes.Equal(got, want) {
		t.Fatal("transfer with a declined windowsize")
	}
}

// TestRepeatedRequest: an RRQ sent twice (the client retransmitting before
// the first answer) starts one transfer, not two.
func TestRepeatedRequest(t *testing.T) {
	f := newFixture(t, Config{})
	want := writeFile(t, f, "r.bin", 2000)
	c := newRawClient(t, f.addr)
	c.send(rrqPacket("r.bin", "octet", "tsize", "0"))
	got, _ := c.get("r.bin", "tsize", "0") // recv fails on a packet from a second TID
	if !bytes.Equal(got, want) {
		t.Fatal("content differs")
	}
	if st := f.srv.Stats(); st.Served+st.Failed > 1 {
		t.Fatalf("stats %+v: two transfers for one client port", st)
	}
}

// TestRefusals: write requests, unknown modes and malformed requests get
// TFTP errors (4: illegal operation) from a new TID; a client aborting after
// the OACK (EDK2 reading tsize, error 8) ends the transfer and frees its
// per-client slot.
func TestRefusals(t *testing.T) {
	f := newFixture(t, Config{MaxPerClient: 1})
	for name, p := range map[string][]byte{
		"wrq":        append([]byte{0, opWRQ}, "x\x00octet\x00"...),
		"mail":       rrqPacket("undionly.kpxe", "mail"),
		"no-value":   append(rrqPacket("undionly.kpxe", "octet"), "blksize\x00"...),
		"no-mode":    append([]byte{0, opRRQ}, "undionly.kpxe\x00"...),
		"empty-name": rrqPacket("", "octet"),
	} {
		t.Run(name, func(t *testing.T) {
			c := newRawClient(t, f.addr)
			c.send(p)
			r := c.recv()
			if binary.BigEndian.Uint16(r) != opERROR || binary.BigEndian.Uint16(r[2:]) != codeIllegalOp || c.tid.Port == c.srv.Port {
				t.Fatalf("answer %q from port %d, want ERROR 4 from a new TID", r, c.tid.Port)
			}
		})
	}
	for i := range uint64(2) { // the second abort needs the slot the first one freed
		c := newRawClient(t, f.addr)
		c.send(rrqPacket("undionly.kpxe", "octet", "tsize", "0"))
		if o := parseOACK(c.recv()); o["tsize"] != strconv.Itoa(len(f.big)) {
			t.Fatalf("OACK %v", o)
		}
		c.send(errorPacket(codeBadOptions, "user aborted the transfer"))
		waitFor(t, func() bool { return f.srv.Stats().Probed == i+1 })
	}
	got, _ := newRawClient(t, f.addr).get("undionly.kpxe")
	if !bytes.Equal(got, f.big) {
		t.Fatal("transfer after the aborts")
	}
	if st := f.srv.Stats(); st.Limited != 0 || st.Failed != 0 {
		t.Fatalf("stats %+v: an aborted transfer kept its slot, or a size probe counted as failed", st)
	}
}

// waitFor polls cond (a counter the server updates after the client's
// last packet) for up to 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not reached in 5 s")
}

// TestCurlClient downloads with curl's TFTP client (libcurl: blksize and
// tsize options), a third implementation besides tftp-hpa and pin/tftp.
func TestCurlClient(t *testing.T) {
	bin := netnstest.RequireCommand(t, "curl")
	f := newFixture(t, Config{})
	for _, bs := range []string{"512", "1428"} {
		out := filepath.Join(t.TempDir(), "got")
		if b, err := exec.Command(bin, "-sS", "--tftp-blksize", bs, "-o", out, "tftp://"+f.addr+"/undionly.kpxe").CombinedOutput(); err != nil {
			t.Fatalf("curl: %v\n%s", err, b)
		}
		got, err := os.ReadFile(out)
		must(t, err)
		if !bytes.Equal(got, f.big) {
			t.Fatalf("curl blksize %s got %d bytes, want %d identical", bs, len(got), len(f.big))
		}
	}
	err := exec.Command(bin, "-sS", "-o", filepath.Join(t.TempDir(), "x"), "tftp://"+f.addr+"/outside-rel").Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("curl fetched a symlink out of the root: %v", err)
	}
}

// FuzzParseRequest: parseRequest never panics, and what it accepts is a
// read or write request whose filename is the packet's first field, with
// option values inside their RFC ranges. Seeds: testdata/fuzz/FuzzParseRequest.
func FuzzParseRequest(f *testing.F) {
	f.Add(rrqPacket("undionly.kpxe", "octet", "blksize", "1428", "tsize", "0"))
	f.Add(rrqPacket("ipxe.efi", "OCTET", "windowsize", "4", "BLKSIZE", "1468", "tsize", "0"))
	f.Fuzz(func(t *testing.T, p []byte) {
		if len(p) > 4*maxRequest {
			return
		}
		r, err := parseRequest(p)
		if err != nil {
			if !errors.Is(err, errMalformed) {
				t.Fatalf("error %v does not wrap errMalformed", err)
			}
			return
		}
		first, _, _ := bytes.Cut(p[2:], []byte{0})
		switch {
		case r.op != opRRQ && r.op != opWRQ:
			t.Fatalf("accepted opcode %d", r.op)
		case r.filename == "" || r.filename != string(first):
			t.Fatalf("filename %q, packet's first field %q", r.filename, first)
		case strings.ContainsRune(r.mode, 0) || r.mode != strings.ToLower(r.mode) || r.mode == "":
			t.Fatalf("mode %q", r.mode)
		case r.blksize != 0 && (r.blksize < minBlockSize || r.blksize > maxBlockSize):
			t.Fatalf("blksize %d out of range", r.blksize)
		case r.windowsize < 0 || r.windowsize > maxWindowSize:
			t.Fatalf("windowsize %d out of range", r.windowsize)
		}
	})
}

// TestMaxActiveQueues: with MaxActive 1, a second request waits (no
// answer, not refused) while the first transfer runs, and is answered as
// soon as the first ends.
func TestMaxActiveQueues(t *testing.T) {
	f := newFixture(t, Config{MaxActive: 1, Timeout: 5 * time.Second})
	c1, c2 := newRawClient(t, f.addr), newRawClient(t, f.addr)
	c1.send(rrqPacket("undionly.kpxe", "octet", "tsize", "0"))
	if parseOACK(c1.recv()) == nil {
		t.Fatal("first request: no OACK")
	}
	c2.send(rrqPacket("undionly.kpxe", "octet", "tsize", "0"))
	must(t, c2.conn.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	if n, _, err := c2.conn.ReadFromUDP(make([]byte, 1024)); err == nil {
		t.Fatalf("second request answered (%d bytes) while the first runs", n)
	}
	c1.send(errorPacket(codeBadOptions, "aborted"))
	if o := parseOACK(c2.recv()); o["tsize"] != strconv.Itoa(len(f.big)) {
		t.Fatalf("second request after the first ended: OACK %v", o)
	}
	c2.send(errorPacket(codeBadOptions, "aborted"))
	waitFor(t, func() bool { return f.srv.Stats().Probed == 2 })
	if st := f.srv.Stats(); st.Limited != 0 {
		t.Fatalf("stats %+v: the waiting request was refused", st)
	}
}

// TestMaxActiveWaitsAtMostTimeout: a waiting request starts after one
// Timeout even while MaxActive transfers still run, before its client
// would give up.
func TestMaxActiveWaitsAtMostTimeout(t *testing.T) {
	f := newFixture(t, Config{MaxActive: 1, Timeout: 200 * time.Millisecond, Retries: 10})
	c1, c2 := newRawClient(t, f.addr), newRawClient(t, f.addr)
	c1.send(rrqPacket("undionly.kpxe", "octet", "tsize", "0"))
	if parseOACK(c1.recv()) == nil { // never ACKed: the server resends it for 2 s
		t.Fatal("first request: no OACK")
	}
	c2.send(rrqPacket("undionly.kpxe", "octet", "tsize", "0"))
	if parseOACK(c2.recv()) == nil {
		t.Fatal("second request: no OACK")
	}
	if st := f.srv.Stats(); st.Failed != 0 || st.Served != 0 || st.Probed != 0 {
		t.Fatalf("stats %+v: the first transfer ended before the second started", st)
	}
	c1.send(errorPacket(codeBadOptions, "aborted"))
	c2.send(errorPacket(codeBadOptions, "aborted"))
	waitFor(t, func() bool { return f.srv.Stats().Probed == 2 })
}
