package images

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"os"
)

// A minimal NBD server (fixed newstyle handshake, simple replies; protocol
// from https://github.com/NetworkBlockDevice/nbd/blob/master/doc/proto.md)
// used as qemu-img's conversion target. qemu-img convert cannot write raw
// output to a pipe, but it can write to an NBD export: this server writes the
// bytes into the raw file and hashes them as they arrive, so the raw digest
// is computed during conversion. Without -W qemu-img issues writes in
// ascending offset order, one at a time; if a write ever arrives out of
// order, the in-flight hash is abandoned and the file is hashed afterwards.
// Neither TRIM nor WRITE_ZEROES is advertised, so qemu sends zero regions as
// data; all-zero chunks are not written (the file stays sparse) but are
// hashed.

const (
	nbdMagic         = 0x4e42444d41474943 // "NBDMAGIC"
	nbdOptMagic      = 0x49484156454F5054 // "IHAVEOPT"
	nbdRepMagic      = 0x3e889045565a9
	nbdRequestMagic  = 0x25609513
	nbdSimpleReply   = 0x67446698
	nbdFlagFixedNew  = 1 << 0
	nbdFlagNoZeroes  = 1 << 1
	nbdOptExportName = 1
	nbdOptAbort      = 2
	nbdOptGo         = 7
	nbdRepAck        = 1
	nbdRepInfo       = 3
	nbdRepErrUnsup   = 1<<31 | 1
	nbdInfoExport    = 0
	nbdTFlagHasFlags = 1 << 0
	nbdTFlagFlush    = 1 << 2
	nbdCmdRead       = 0
	nbdCmdWrite      = 1
	nbdCmdDisc       = 2
	nbdCmdFlush      = 3
	nbdEINVAL        = 22
	nbdEIO           = 5
	nbdMaxRequest    = 32 << 20 // qemu's NBD_MAX_BUFFER_SIZE
)

// nbdSink is the export: a file of fixed size plus an in-order hash.
type nbdSink struct {
	f        *os.File
	size     int64
	h        hash.Hash
	next     int64 // bytes hashed in order so far
	hw       int64 // high-water mark: end of the furthest write
	disorder bool  // a write arrived out of order: hash the file afterwards
	prog     *progressMeter
}

// digest returns the in-order SHA-256 of the export's bytes, or ok=false if
// writes arrived out of order. Bytes never written are zeros (sparse).
func (s *nbdSink) digest() (Digest, bool) {
	if s.disorder {
		return Digest{}, false
	}
	zero := make([]byte, 64<<10)
	for s.next < s.size {
		n := min(int64(len(zero)), s.size-s.next)
		s.h.Write(zero[:n])
		s.next += n
	}
	return Digest{Algo: SHA256, Hex: digestHex(s.h)}, true
}

// serveNBD runs one NBD session on c until the client disconnects.
func serveNBD(c net.Conn, s *nbdSink) error {
	defer c.Close()
	nc := &nbdConn{r: bufio.NewReaderSize(c, 1<<20), w: bufio.NewWriter(c), s: s}
	be := binary.BigEndian
	hdr := make([]byte, 18)
	be.PutUint64(hdr[0:], nbdMagic)
	be.PutUint64(hdr[8:], nbdOptMagic)
	be.PutUint16(hdr[16:], nbdFlagFixedNew|nbdFlagNoZeroes)
	if _, err := c.Write(hdr); err != nil {
		return fmt.Errorf("nbd handshake: %w", err)
	}
	var cflags uint32
	if err := binary.Read(nc.r, be, &cflags); err != nil {
		return fmt.Errorf("nbd handshake: %w", err)
	}
	if err := nc.haggle(cflags); err != nil {
		return err
	}
	return nc.transmit()
}

// nbdConn is one NBD client connection to the sink (the fixed newstyle
// handshake, then simple replies only).
type nbdConn struct {
	r   *bufio.Reader
	w   *bufio.Writer
	s   *nbdSink
	buf []byte // grows to the largest request seen (qemu-img convert: 2 MiB)
}

const nbdTFlags = uint16(nbdTFlagHasFlags | nbdTFlagFlush)

// reply writes an option reply (buffered).
func (nc *nbdConn) reply(opt, typ uint32, data []byte) error {
	be := binary.BigEndian
	b := make([]byte, 20, 20+len(data))
	be.PutUint64(b[0:], nbdRepMagic)
	be.PutUint32(b[8:], opt)
	be.PutUint32(b[12:], typ)
	be.PutUint32(b[16:], uint32(len(data)))
	_, err := nc.w.Write(append(b, data...))
	return err
}

// haggle answers the client's options until it picks the export
// (NBD_OPT_EXPORT_NAME or NBD_OPT_GO); every other option is
// unsupported.
func (nc *nbdConn) haggle(cflags uint32) error {
	be := binary.BigEndian
	for done := false; !done; {
		var oh struct {
			Magic  uint64
			Option uint32
			Length uint32
		}
		if err := binary.Read(nc.r, be, &oh); err != nil {
			return fmt.Errorf("nbd option: %w", err)
		}
		if oh.Magic != nbdOptMagic || oh.Length > 4096 {
			return errors.New("nbd option: bad header")
		}
		data := make([]byte, oh.Length)
		if _, err := io.ReadFull(nc.r, data); err != nil {
			return fmt.Errorf("nbd option: %w", err)
		}
		var err error
		switch oh.Option {
		case nbdOptExportName:
			b := make([]byte, 10)
			be.PutUint64(b, uint64(nc.s.size))
			be.PutUint16(b[8:], nbdTFlags)
			if cflags&nbdFlagNoZeroes == 0 {
				b = append(b, make([]byte, 124)...)
			}
			_, err = nc.w.Write(b)
			done = true
		case nbdOptGo:
			info := make([]byte, 12)
			be.PutUint16(info, nbdInfoExport)
			be.PutUint64(info[2:], uint64(nc.s.size))
			be.PutUint16(info[10:], nbdTFlags)
			if err = nc.reply(oh.Option, nbdRepInfo, info); err == nil {
				err = nc.reply(oh.Option, nbdRepAck, nil)
			}
			done = true
		case nbdOptAbort:
			nc.reply(oh.Option, nbdRepAck, nil)
			nc.w.Flush()
			return errors.New("nbd: client aborted")
		default: // structured replies, meta contexts, TLS, extended headers...
			err = nc.reply(oh.Option, nbdRepErrUnsup, nil)
		}
		if err != nil {
			return err
		}
		if err := nc.w.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// simple writes a simple reply (and its data) and flushes.
func (nc *nbdConn) simple(errno uint32, handle []byte, data []byte) error {
	b := make([]byte, 16)
	binary.BigEndian.PutUint32(b[0:], nbdSimpleReply)
	binary.BigEndian.PutUint32(b[4:], errno)
	copy(b[8:], handle)
	if _, err := nc.w.Write(b); err != nil {
		return err
	}
	if data != nil {
		if _, err := nc.w.Write(data); err != nil {
			return err
		}
	}
	return nc.w.Flush()
}

// transmit serves requests until the client disconnects (nil) or the
// connection fails.
func (nc *nbdConn) transmit() error {
	be := binary.BigEndian
	req := make([]byte, 28)
	for {
		if _, err := io.ReadFull(nc.r, req); err != nil {
			return fmt.Errorf("nbd request: %w", err)
		}
		if be.Uint32(req[0:]) != nbdRequestMagic {
			return errors.New("nbd request: bad magic")
		}
		typ := be.Uint16(req[6:])
		handle := req[8:16]
		off := int64(be.Uint64(req[16:]))
		n := int64(be.Uint32(req[24:]))
		inRange := off >= 0 && n <= nbdMaxRequest && off+n <= nc.s.size
		if n <= nbdMaxRequest && int64(cap(nc.buf)) < n {
			nc.buf = make([]byte, n)
		}
		var err error
		switch typ {
		case nbdCmdWrite:
			err = nc.write(handle, off, n, inRange)
		case nbdCmdRead:
			err = nc.read(handle, off, n, inRange)
		case nbdCmdFlush:
			errno := uint32(0)
			if err := nc.s.f.Sync(); err != nil {
				errno = nbdEIO
			}
			err = nc.simple(errno, handle, nil)
		case nbdCmdDisc:
			return nil
		default:
			err = nc.simple(nbdEINVAL, handle, nil)
		}
		if err != nil {
			return err
		}
	}
}

// write takes an NBD_CMD_WRITE's data and writes it to the sink; a zero
// chunk above every earlier write lands on the file's hole, which already
// reads as zeros, and is skipped (sparse output). Writes in order are
// hashed as they come; the first out of order turns that off.
func (nc *nbdConn) write(handle []byte, off, n int64, inRange bool) error {
	s := nc.s
	if n > nbdMaxRequest {
		return errors.New("nbd write: request too large")
	}
	data := nc.buf[:n]
	if _, err := io.ReadFull(nc.r, data); err != nil {
		return fmt.Errorf("nbd write: %w", err)
	}
	if !inRange {
		return nc.simple(nbdEINVAL, handle, nil)
	}
	errno := uint32(0)
	if !allZero(data) || off < s.hw {
		if _, err := s.f.WriteAt(data, off); err != nil {
			errno = nbdEIO
		}
	}
	s.hw = max(s.hw, off+n)
	if errno == 0 && !s.disorder {
		if off == s.next {
			s.h.Write(data)
			s.next += n
			s.prog.update(s.next)
		} else {
			s.disorder = true
		}
	}
	return nc.simple(errno, handle, nil)
}

// read answers an NBD_CMD_READ from the sink's file.
func (nc *nbdConn) read(handle []byte, off, n int64, inRange bool) error {
	if !inRange {
		return nc.simple(nbdEINVAL, handle, nil)
	}
	data := nc.buf[:n]
	if _, err := nc.s.f.ReadAt(data, off); err != nil && !errors.Is(err, io.EOF) {
		return nc.simple(nbdEIO, handle, nil)
	}
	return nc.simple(0, handle, data)
}

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
