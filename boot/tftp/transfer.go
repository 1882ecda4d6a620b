package tftp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// transfer is one read transfer: a non-blocking UDP socket connected to
// the client (the server's new TID, RFC 1350 §4), driven by the server's
// event loop. The kernel drops datagrams from any other address or port on
// a connected socket, so the transfer only ever sees its own client's ACKs
// and ERRORs.
//
// Windowed transfers follow RFC 7440 §4: the server sends up to window
// blocks, then waits; an ACK for block k of the window restarts the window
// at k+1 (the client ACKs the last block it received in order when it sees
// a gap), and a timeout resends the window from the first unacknowledged
// block. ACKs outside the window (duplicates, stale ones) are ignored, and
// nothing is resent except on a timeout, which avoids the Sorcerer's
// Apprentice syndrome (RFC 1123 §4.2.3.1). Block numbers roll over from
// 65535 to 0, as tftp-hpa, iPXE and EDK2 expect for files over 65535 blocks.
type transfer struct {
	fd      int
	peer    netip.AddrPort
	ip      string // the per-client limit's key
	log     *slog.Logger
	name    string      // the requested file name, without a leading "/" (Config.OnServed)
	src     io.ReaderAt // the file contents (cache or open file)
	close   func()      // releases src
	size    int64
	blksize int
	window  int
	oack    []byte // nil: no options accepted, start with DATA 1

	negotiating bool   // OACK sent, waiting for ACK 0 (RFC 2347 §2)
	base, end   uint64 // first unacknowledged block, last block of the window sent
	tries       int    // retransmissions since the last progress
	sent        int    // DATA packets sent, retransmissions included

	// due is when the packet or window sent last is resent; the event
	// loop keeps transfers in a list ordered by due (prev, next).
	due        time.Time
	prev, next *transfer

	buf []byte // DATA packet: 4-byte header + blksize
}

// errTimeout: Retries retransmissions went unanswered.
var errTimeout = errors.New("timeout")

// peerError is an ERROR packet from the client (EDK2 sends code 8 after
// reading tsize, RFC 2347 §5).
type peerError struct {
	code uint16
	msg  string
}

func (e *peerError) Error() string { return fmt.Sprintf("client error %d: %s", e.code, e.msg) }

// blocks is the number of DATA packets: the last one is short, possibly
// empty (RFC 1350 §6: a full last block is followed by an empty one).
func (t *transfer) blocks() uint64 { return uint64(t.size)/uint64(t.blksize) + 1 }

// start sends the OACK, or the first window when no option was accepted.
func (t *transfer) start() error {
	t.base = 1
	if t.oack != nil {
		t.negotiating = true
		return t.send(t.oack)
	}
	return t.sendWindow()
}

// sendWindow sends blocks base … base+window-1 (at most the last block).
func (t *transfer) sendWindow() error {
	t.end = min(t.base+uint64(t.window)-1, t.blocks())
	for b := t.base; b <= t.end; b++ {
		if err := t.sendBlock(b); err != nil {
			return err
		}
	}
	return nil
}

// sendBlock sends DATA block b (1-based, unbounded: the packet carries b mod 2^16).
func (t *transfer) sendBlock(b uint64) error {
	off := int64(b-1) * int64(t.blksize)
	l := int(min(int64(t.blksize), t.size-off))
	binary.BigEndian.PutUint16(t.buf[0:], opDATA)
	binary.BigEndian.PutUint16(t.buf[2:], uint16(b))
	if l > 0 {
		if m, err := t.src.ReadAt(t.buf[4:4+l], off); m < l {
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // the file shrank during the transfer
			}
			return fmt.Errorf("read block %d: %w", b, err)
		}
	}
	t.sent++
	return t.send(t.buf[:4+l])
}

// send writes one datagram. A full send buffer (EAGAIN) counts as a lost
// packet: the timeout resends it.
func (t *transfer) send(p []byte) error {
	for {
		_, err := unix.Write(t.fd, p)
		switch {
		case err == nil, errors.Is(err, unix.EAGAIN):
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		}
		return fmt.Errorf("send: %w", err)
	}
}

// onPacket handles a datagram from the client. It returns done when the
// last block is acknowledged, or an error ending the transfer (a
// *peerError for an ERROR packet). Other packets are ignored.
func (t *transfer) onPacket(p []byte) (done bool, err error) {
	if len(p) < 4 {
		return false, nil
	}
	switch binary.BigEndian.Uint16(p) {
	case opERROR:
		msg := p[4:]
		if i := indexNUL(msg); i >= 0 {
			msg = msg[:i]
		}
		return false, &peerError{code: binary.BigEndian.Uint16(p[2:]), msg: string(msg)}
	case opACK:
	default:
		return false, nil
	}
	ack := binary.BigEndian.Uint16(p[2:])
	if t.negotiating {
		if ack != 0 {
			return false, nil
		}
		t.negotiating, t.tries = false, 0
		return false, t.sendWindow()
	}
	// The distance from the last acknowledged block, modulo 2^16.
	d := uint64(ack - uint16(t.base-1))
	if d < 1 || t.base-1+d > t.end {
		return false, nil
	}
	t.base += d
	t.tries = 0
	if t.base > t.blocks() {
		return true, nil
	}
	return false, t.sendWindow()
}

// onTimeout resends what is unacknowledged, or gives up after retries.
func (t *transfer) onTimeout(retries int) error {
	if t.tries++; t.tries > retries {
		return errTimeout
	}
	if t.negotiating {
		return t.send(t.oack)
	}
	return t.sendWindow()
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}
