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
	r := bufio.NewReaderSize(c, 1<<20)
	w := bufio.NewWriter(c)
	be := binary.BigEndian
	hdr := make([]byte, 18)
	be.PutUint64(hdr[0:], nbdMagic)
	be.PutUint64(hdr[8:], nbdOptMagic)
	be.PutUint16(hdr[16:], nbdFlagFixedNew|nbdFlagNoZeroes)
	if _, err := c.Write(hdr); err != nil {
		return fmt.Errorf("nbd handshake: %w", err)
	}
	var cflags uint32
	if err := binary.Read(r, be, &cflags); err != nil {
		return fmt.Errorf("nbd handshake: %w", err)
	}
	tflags := uint16(nbdTFlagHasFlags | nbdTFlagFlush)
	reply := func(opt, typ uint32, data []byte) error {
		b := make([]byte, 20, 20+len(data))
		be.PutUint64(b[0:], nbdRepMagic)
		be.PutUint32(b[8:], opt)
		be.PutUint32(b[12:], typ)
		be.PutUint32(b[16:], uint32(len(data)))
		_, err := w.Write(append(b, data...))
		return err
	}
	// Option haggling.
	for done := false; !done; {
		var oh struct {
			Magic  uint64
			Option uint32
			Length uint32
		}
		if err := binary.Read(r, be, &oh); err != nil {
			return fmt.Errorf("nbd option: %w", err)
		}
		if oh.Magic != nbdOptMagic || oh.Length > 4096 {
			return errors.New("nbd option: bad header")
		}
		data := make([]byte, oh.Length)
		if _, err := io.ReadFull(r, data); err != nil {
			return fmt.Errorf("nbd option: %w", err)
		}
		switch oh.Option {
		case nbdOptExportName:
			b := make([]byte, 10)
			be.PutUint64(b, uint64(s.size))
			be.PutUint16(b[8:], tflags)
			if cflags&nbdFlagNoZeroes == 0 {
				b = append(b, make([]byte, 124)...)
			}
			if _, err := w.Write(b); err != nil {
				return err
			}
			done = true
		case nbdOptGo:
			info := make([]byte, 12)
			be.PutUint16(info, nbdInfoExport)
			be.PutUint64(info[2:], uint64(s.size))
			be.PutUint16(info[10:], tflags)
			if err := reply(oh.Option, nbdRepInfo, info); err != nil {
				return err
			}
			if err := reply(oh.Option, nbdRepAck, nil); err != nil {
				return err
			}
			done = true
		case nbdOptAbort:
			reply(oh.Option, nbdRepAck, nil)
			w.Flush()
			return errors.New("nbd: client aborted")
		default: // structured replies, meta contexts, TLS, extended headers...
			if err := reply(oh.Option, nbdRepErrUnsup, nil); err != nil {
				return err
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	// Transmission.
	req := make([]byte, 28)
	var buf []byte // grows to the largest request seen (qemu-img convert: 2 MiB)
	simple := func(errno uint32, handle []byte, data []byte) error {
		b := make([]byte, 16)
		be.PutUint32(b[0:], nbdSimpleReply)
		be.PutUint32(b[4:], errno)
		copy(b[8:], handle)
		if _, err := w.Write(b); err != nil {
			return err
		}
		if data != nil {
			if _, err := w.Write(data); err != nil {
				return err
			}
		}
		return w.Flush()
	}
	for {
		if _, err := io.ReadFull(r, req); err != nil {
			return fmt.Errorf("nbd request: %w", err)
		}
		if be.Uint32(req[0:]) != nbdRequestMagic {
			return errors.New("nbd request: bad magic")
		}
		typ := be.Uint16(req[6:])
		handle := req[8:16]
		off := int64(be.Uint64(req[16:]))
		n := int64(be.Uint32(req[24:]))
		inRange := off >= 0 && n <= nbdMaxRequest && off+n <= s.size
		if n <= nbdMaxRequest && int64(cap(buf)) < n {
			buf = make([]byte, n)
		}
		switch typ {
		case nbdCmdWrite:
			if n > nbdMaxRequest {
				return errors.New("nbd write: request too large")
			}
			data := buf[:n]
			if _, err := io.ReadFull(r, data); err != nil {
				return fmt.Errorf("nbd write: %w", err)
			}
			if !inRange {
				if err := simple(nbdEINVAL, handle, nil); err != nil {
					return err
				}
				continue
			}
			errno := uint32(0)
			// A zero chunk above every earlier write lands on the file's
			// hole, which already reads as zeros: skip it (sparse output).
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
			if err := simple(errno, handle, nil); err != nil {
				return err
			}
		case nbdCmdRead:
			if !inRange {
				if err := simple(nbdEINVAL, handle, nil); err != nil {
					return err
				}
				continue
			}
			data := buf[:n]
			if _, err := s.f.ReadAt(data, off); err != nil && !errors.Is(err, io.EOF) {
				if err := simple(nbdEIO, handle, nil); err != nil {
					return err
				}
				continue
			}
			if err := simple(0, handle, data); err != nil {
				return err
			}
		case nbdCmdFlush:
			errno := uint32(0)
			if err := s.f.Sync(); err != nil {
				errno = nbdEIO
			}
			if err := simple(errno, handle, nil); err != nil {
				return err
			}
		case nbdCmdDisc:
			return nil
		default:
			if err := simple(nbdEINVAL, handle, nil); err != nil {
				return err
			}
		}
	}
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
