package tftp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// transfer is one read transfer: a UDP socket connected to the client
// (the server's new TID, RFC 1350 §4), run by one goroutine. The kernel
// drops datagrams from any other address or port on a connected socket, so
// the sender only ever sees its own client's ACKs and ERRORs.
type transfer struct {
	conn    *net.UDPConn
	src     io.ReaderAt // the file contents (cache or open file)
	size    int64
	blksize int
	window  int
	oack    []byte // nil: no options accepted, start with DATA 1
	timeout time.Duration
	retries int

	buf  []byte // DATA packet: 4-byte header + blksize
	rbuf []byte
	// deadline is the read deadline last set on conn. Waits extend it only
	// when it falls more than timeout/4 short of what they need (see wait),
	// so a lock-step transfer resets its runtime timer a few times a second
	// rather than once per block.
	deadline time.Time
	sent     int // DATA packets sent, retransmissions included
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

// run sends the file and returns nil once the last block is acknowledged.
//
// Windowed transfers follow RFC 7440 §4: the server sends up to window
// blocks, then waits; an ACK for block k of the window restarts the window
// at k+1 (the client ACKs the last block it received in order when it sees
// a gap), and a timeout resends the window from the first unacknowledged
// block. ACKs outside the window (duplicates, stale ones) are ignored, and
// nothing is resent except on a timeout, which avoids the Sorcerer's
// Apprentice syndrome (RFC 1123 §4.2.3.1). Block numbers roll over from
// 65535 to 0, as tftp-hpa, iPXE and EDK2 expect for files over 65535 blocks.
func (t *transfer) run() error {
	if t.oack != nil {
		if err := t.negotiate(); err != nil {
			return err
		}
	}
	n := t.blocks()
	base := uint64(1) // first unacknowledged block
	tries := 0
	for base <= n {
		end := min(base+uint64(t.window)-1, n)
		for b := base; b <= end; b++ {
			if err := t.sendBlock(b); err != nil {
				return err
			}
		}
		due := time.Now().Add(t.timeout)
		for {
			ack, err := t.wait(due)
			if errors.Is(err, errTimeout) {
				if tries++; tries > t.retries {
					return err
				}
				break // resend the window from base
			}
			if err != nil {
				return err
			}
			// The distance from the last acknowledged block, modulo 2^16.
			d := uint64(ack - uint16(base-1))
			if d >= 1 && base-1+d <= end {
				base += d
				tries = 0
				break
			}
		}
	}
	return nil
}

// negotiate sends the OACK and waits for ACK 0 (RFC 2347 §2).
func (t *transfer) negotiate() error {
	for tries := 0; ; tries++ {
		if _, err := t.conn.Write(t.oack); err != nil {
			return err
		}
		due := time.Now().Add(t.timeout)
		for {
			ack, err := t.wait(due)
			if errors.Is(err, errTimeout) {
				if tries >= t.retries {
					return err
				}
				break
			}
			if err != nil {
				return err
			}
			if ack == 0 {
				return nil
			}
		}
	}
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
	_, err := t.conn.Write(t.buf[:4+l])
	return err
}

// wait returns the block number of the next ACK from the client, errTimeout
// once due has passed, a *peerError for an ERROR packet, or the socket's
// error (ECONNREFUSED once the client's port is closed: ICMP port
// unreachable is reported on connected UDP sockets). Other packets are
// ignored.
func (t *transfer) wait(due time.Time) (uint16, error) {
	for {
		if t.deadline.Before(due.Add(-t.timeout / 4)) {
			t.deadline = due
			if err := t.conn.SetReadDeadline(due); err != nil {
				return 0, err
			}
		}
		n, err := t.conn.Read(t.rbuf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if now := time.Now(); now.Before(due) {
					// The lazily set deadline fell short of due.
					t.deadline = due
					if err := t.conn.SetReadDeadline(due); err != nil {
						return 0, err
					}
					continue
				}
				return 0, errTimeout
			}
			return 0, err
		}
		if n < 4 {
			continue
		}
		switch binary.BigEndian.Uint16(t.rbuf) {
		case opACK:
			return binary.BigEndian.Uint16(t.rbuf[2:]), nil
		case opERROR:
			msg := t.rbuf[4:n]
			if i := indexNUL(msg); i >= 0 {
				msg = msg[:i]
			}
			return 0, &peerError{code: binary.BigEndian.Uint16(t.rbuf[2:]), msg: string(msg)}
		}
	}
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}
