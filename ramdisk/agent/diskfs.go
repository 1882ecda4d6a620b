package agent

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/diskfs/go-diskfs/backend"
)

// devFile adapts a BlockDevice of known size to go-diskfs's backend.Storage
// (github.com/diskfs/go-diskfs/backend), which wants an fs.File with a
// Seeker. Reads past size return io.EOF; writes past size fail, so the
// library cannot grow a target. Not safe for concurrent use (one offset).
type devFile struct {
	dev  BlockDevice
	size int64
	off  int64
}

var _ backend.Storage = (*devFile)(nil)

var errPastEnd = errors.New("write past the end of the device")

func (d *devFile) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= d.size {
		return 0, io.EOF
	}
	short := false
	if int64(len(p)) > d.size-off {
		p, short = p[:d.size-off], true
	}
	n, err := d.dev.ReadAt(p, off)
	if err == nil && short {
		err = io.EOF
	}
	return n, err
}

func (d *devFile) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > d.size {
		return 0, errPastEnd
	}
	return d.dev.WriteAt(p, off)
}

func (d *devFile) Read(p []byte) (int, error) {
	n, err := d.ReadAt(p, d.off)
	d.off += int64(n)
	return n, err
}

func (d *devFile) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		off += d.off
	case io.SeekEnd:
		off += d.size
	default:
		return 0, errors.New("seek: bad whence")
	}
	if off < 0 {
		return 0, errors.New("seek: negative offset")
	}
	d.off = off
	return off, nil
}

// Sync lets go-diskfs's GPT writer flush between its ordered writes.
func (d *devFile) Sync() error                             { return d.dev.Sync() }
func (d *devFile) Close() error                            { return nil }
func (d *devFile) Stat() (fs.FileInfo, error)              { return devInfo{d.size}, nil }
func (d *devFile) Sys() (*os.File, error)                  { return nil, backend.ErrNotSuitable }
func (d *devFile) Writable() (backend.WritableFile, error) { return d, nil }
func (d *devFile) Path() string                            { return "" }

type devInfo struct{ size int64 }

func (i devInfo) Name() string       { return "device" }
func (i devInfo) Size() int64        { return i.size }
func (i devInfo) Mode() fs.FileMode  { return 0o600 }
func (i devInfo) ModTime() time.Time { return time.Time{} }
func (i devInfo) IsDir() bool        { return false }
func (i devInfo) Sys() any           { return nil }
