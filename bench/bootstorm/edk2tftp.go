package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// The storm's UEFI client (the ipxe.efi round) requests its file the way
// EDK2's PXE does, as captured from Debian 12's OVMF (edk2 2022.11, package
// ovmf 2022.11-6+deb12u2) booting ipxe.efi in qemu: a size probe, an RRQ
// with options tsize=0, blksize=1468, windowsize=4, answered by ERROR 8
// ("User aborted the transfer") once the OACK gives the size, then the
// transfer itself, an RRQ with blksize=1468, windowsize=4 (EDK2's
// PcdPxeTftpWindowSize defaults to 4). A server that leaves windowsize out
// of its OACK (dnsmasq 2.90 has no RFC 7440) gets a lockstep transfer, one
// ACK per block, as EDK2 then falls back to (RFC 7440 §4: no windowsize in
// the OACK means a window of 1). bench/bootstorm.md says what this changes.
const (
	edk2BlkSize    = 1468
	edk2WindowSize = 4
)

// edk2Result is what one EDK2-style download saw.
type edk2Result struct {
	size   int64 // bytes received
	window int   // the windowsize the server granted (1: none)
	tsize  int64 // the size the probe's OACK announced (-1: none)
}

// edk2Get downloads file from server (port 69 in the storm) from local,
// first probing its size. Each wait for a packet is bounded by timeout; after retries
// timeouts in a row (the last ACK or the RRQ resent each time) it fails.
// Errors name the phase (probe or transfer) and what was awaited.
func edk2Get(server netip.AddrPort, file string, local netip.Addr, timeout time.Duration, retries int) (edk2Result, error) {
	res := edk2Result{tsize: -1}
	buf := make([]byte, 65536)
	// Each request goes out from a new port, as EDK2's do (the capture:
	// the probe from 1562, the transfer from 1563).
	open := func() (*edk2Conn, error) {
		conn, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(local, 0)))
		if err != nil {
			return nil, fmt.Errorf("edk2 tftp: %w", err)
		}
		return &edk2Conn{conn: conn, srv: net.UDPAddrFromAddrPort(server), timeout: timeout, retries: retries, buf: buf}, nil
	}

	// The probe: OACK (or DATA 1 from a server without options) gives the
	// size; EDK2 ends it with ERROR 8 either way.
	c, err := open()
	if err != nil {
		return res, err
	}
	probe := edk2RRQ(file, "tsize", "0", "blksize", strconv.Itoa(edk2BlkSize), "windowsize", strconv.Itoa(edk2WindowSize))
	p, tid, err := c.request(probe)
	if err != nil {
		c.conn.Close()
		return res, fmt.Errorf("edk2 tftp: size probe of %s: %w", file, err)
	}
	if o, ok := parseOACKOptions(p); ok {
		if v, err := strconv.ParseInt(o["tsize"], 10, 64); err == nil {
			res.tsize = v
		}
	}
	_, _ = c.conn.WriteToUDP(append([]byte{0, 5, 0, 8}, "User aborted the transfer\x00"...), tid)
	c.conn.Close()

	// The transfer.
	if c, err = open(); err != nil {
		return res, err
	}
	defer c.conn.Close()
	conn := c.conn
	rrq := edk2RRQ(file, "blksize", strconv.Itoa(edk2BlkSize), "windowsize", strconv.Itoa(edk2WindowSize))
	p, tid, err = c.request(rrq)
	if err != nil {
		return res, fmt.Errorf("edk2 tftp: %s: %w", file, err)
	}
	c.tid = tid
	bs, ws := 512, 1
	if o, ok := parseOACKOptions(p); ok {
		if v, err := strconv.Atoi(o["blksize"]); err == nil {
			bs = v
		}
		if v, err := strconv.Atoi(o["windowsize"]); err == nil {
			ws = v
		}
		if p, err = c.exchange(edk2ACK(0)); err != nil {
			return res, fmt.Errorf("edk2 tftp: %s: after ACK 0: %w", file, err)
		}
	}
	res.window = ws
	var expected uint16 = 1 // the next block wanted (block numbers roll over)
	inWindow := 0           // blocks received in order since the last ACK
	for {
		if len(p) >= 4 {
			switch binary.BigEndian.Uint16(p) {
			case 5: // ERROR
				return res, fmt.Errorf("edk2 tftp: %s: server error %d: %s", file, binary.BigEndian.Uint16(p[2:]), strings.TrimRight(string(p[4:]), "\x00"))
			case 3: // DATA
				n := binary.BigEndian.Uint16(p[2:])
				if n != expected {
					// A gap (or a block of a resent window): ACK the last
					// block received in order, which restarts the window
					// after it (RFC 7440 §4).
					inWindow = 0
					if p, err = c.exchange(edk2ACK(expected - 1)); err != nil {
						return res, fmt.Errorf("edk2 tftp: %s: after block %d: %w", file, expected-1, err)
					}
					continue
				}
				data := len(p) - 4
				res.size += int64(data)
				expected++
				inWindow++
				if data < bs {
					_, _ = conn.WriteToUDP(edk2ACK(n), tid)
					return res, nil
				}
				if inWindow == ws {
					inWindow = 0
					if p, err = c.exchange(edk2ACK(n)); err != nil {
						return res, fmt.Errorf("edk2 tftp: %s: after block %d: %w", file, n, err)
					}
					continue
				}
			}
		}
		if p, err = c.next(edk2ACK(expected - 1)); err != nil {
			return res, fmt.Errorf("edk2 tftp: %s: waiting for block %d: %w", file, expected, err)
		}
	}
}

// edk2Conn is one client socket: packets from anything but the transfer's
// TID (once known) are ignored, as RFC 1350 §4 asks.
type edk2Conn struct {
	conn     *net.UDPConn
	srv, tid *net.UDPAddr
	timeout  time.Duration
	retries  int
	buf      []byte
}

// request sends rrq to port 69 and returns the first answer and the TID
// it came from, resending rrq on each timeout.
func (c *edk2Conn) request(rrq []byte) ([]byte, *net.UDPAddr, error) {
	for try := 0; ; try++ {
		if _, err := c.conn.WriteToUDP(rrq, c.srv); err != nil {
			return nil, nil, err
		}
		if err := c.conn.SetReadDeadline(time.Now().Add(c.timeout)); err != nil {
			return nil, nil, err
		}
		n, from, err := c.conn.ReadFromUDP(c.buf)
		if err == nil && from.IP.Equal(c.srv.IP) {
			return c.buf[:n], from, nil
		}
		if err != nil && !isTimeout(err) {
			return nil, nil, err
		}
		if try >= c.retries {
			return nil, nil, fmt.Errorf("no answer to the request after %d tries of %s", try+1, c.timeout)
		}
	}
}

// exchange sends p to the TID and returns the next packet from it; see next.
func (c *edk2Conn) exchange(p []byte) ([]byte, error) {
	if _, err := c.conn.WriteToUDP(p, c.tid); err != nil {
		return nil, err
	}
	return c.next(p)
}

// next returns the next packet from the TID; on each timeout it resends
// last (EDK2 resends its last ACK), at most retries times in a row.
func (c *edk2Conn) next(last []byte) ([]byte, error) {
	for try := 0; ; {
		if err := c.conn.SetReadDeadline(time.Now().Add(c.timeout)); err != nil {
			return nil, err
		}
		n, from, err := c.conn.ReadFromUDP(c.buf)
		switch {
		case err == nil && from.Port == c.tid.Port && from.IP.Equal(c.tid.IP):
			return c.buf[:n], nil
		case err == nil:
			continue // another TID: not ours
		case !isTimeout(err):
			return nil, err
		}
		if try++; try > c.retries {
			return nil, fmt.Errorf("no packet after %d timeouts of %s in a row", try, c.timeout)
		}
		if _, err := c.conn.WriteToUDP(last, c.tid); err != nil {
			return nil, err
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// edk2RRQ builds an octet-mode read request with options (name, value pairs).
func edk2RRQ(file string, opts ...string) []byte {
	b := append([]byte{0, 1}, file...)
	b = append(append(b, 0), "octet\x00"...)
	for _, o := range opts {
		b = append(append(b, o...), 0)
	}
	return b
}

func edk2ACK(n uint16) []byte { return []byte{0, 4, byte(n >> 8), byte(n)} }

// parseOACKOptions returns the options of an OACK (opcode 6, RFC 2347),
// names lower-cased, and false for any other packet.
func parseOACKOptions(p []byte) (map[string]string, bool) {
	if len(p) < 2 || binary.BigEndian.Uint16(p) != 6 {
		return nil, false
	}
	f := strings.Split(strings.TrimSuffix(string(p[2:]), "\x00"), "\x00")
	o := map[string]string{}
	for i := 0; i+1 < len(f); i += 2 {
		o[strings.ToLower(f[i])] = f[i+1]
	}
	return o, true
}
