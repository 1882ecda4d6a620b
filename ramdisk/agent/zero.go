package agent

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Zeroer is an optional capability of a BlockDevice: making a range read
// as zeros without sending the zeros. The disk code (the signature wipe,
// the seed partition, the layout's and the release wipe's table clears)
// uses it where the device has it and writes zeros, 1 MiB at a time,
// where it has not. A bare *os.File has it as a [File].
type Zeroer interface {
	// ZeroRange makes bytes [off, off+n) of the device read as zeros and
	// MUST leave every other byte as it was. An error wrapping
	// errors.ErrUnsupported says the device cannot do it and nothing was
	// changed: the caller then writes the zeros itself.
	ZeroRange(off, n int64) error
}

// File is an *os.File as a BlockDevice with the [Zeroer] capability:
//   - a Linux block device zeroes with the BLKZEROOUT ioctl (linux/fs.h,
//     _IO(0x12, 127), a {start, length} pair in bytes, both multiples of
//     the logical block size): the kernel drops the range from the page
//     cache and sends WRITE ZEROES (NVMe, virtio-blk) or WRITE SAME (SCSI)
//     where the device has it, and writes zero pages itself otherwise. The
//     unaligned edges of a range, if any, are written;
//   - a regular file punches a hole with fallocate(2)
//     FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE: the range's blocks are
//     freed, reads return zeros and the size stays (man 2 fallocate; tmpfs,
//     ext4, XFS and btrfs have it).
//
// A file system without hole punching (EOPNOTSUPP), a device that refuses
// the ioctl (EOPNOTSUPP, ENOTTY, EINVAL; EBUSY while another holder has it
// exclusively and its cached pages cannot be dropped) or any other kind of
// file is errors.ErrUnsupported, with nothing changed.
type File struct{ *os.File }

// ZeroRange zeroes [off, off+n) of f as [File] describes.
func (f File) ZeroRange(off, n int64) error {
	_, err := f.zeroRange(off, n)
	return err
}

// zeroRange is ZeroRange, also naming the kernel interface that did it
// ("BLKZEROOUT" or "punch-hole").
func (f File) zeroRange(off, n int64) (string, error) {
	if n <= 0 {
		return "", nil
	}
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("zero range: %w", err)
	}
	switch m := st.Mode(); {
	case m.IsRegular():
		err := f.control(func(fd int) error {
			return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
		})
		if unsupported(err) {
			return "", fmt.Errorf("zero range: fallocate punch hole: %w (%w)", errors.ErrUnsupported, err)
		}
		if err != nil {
			return "", fmt.Errorf("zero range: fallocate punch hole at %d: %w", off, err)
		}
		return "punch-hole", nil
	case m&os.ModeDevice != 0 && m&os.ModeCharDevice == 0:
		return "BLKZEROOUT", f.blkZeroOut(off, n)
	default:
		return "", fmt.Errorf("zero range: %s file: %w", m.Type(), errors.ErrUnsupported)
	}
}

// blkZeroOut zeroes [off, off+n) of a block device: BLKZEROOUT over the
// part aligned to the logical block size (BLKSSZGET; the ioctl refuses
// anything else with EINVAL), then writes of the edges outside it.
func (f File) blkZeroOut(off, n int64) error {
	bs := int64(512)
	_ = f.control(func(fd int) error {
		if v, err := unix.IoctlGetInt(fd, unix.BLKSSZGET); err == nil && v >= 512 {
			bs = int64(v)
		}
		return nil
	})
	end := off + n
	lo, hi := (off+bs-1)/bs*bs, end/bs*bs
	if hi > lo {
		if err := rangeIoctl(f.File, unix.BLKZEROOUT, lo, hi-lo); err != nil {
			// EBUSY: another holder has the device exclusively (an active
			// volume group on a disk opened shared) and the kernel could
			// not drop the range's cached pages; it zeroed nothing.
			if unsupported(err) || errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("zero range: BLKZEROOUT: %w (%w)", errors.ErrUnsupported, err)
			}
			return fmt.Errorf("zero range: BLKZEROOUT at %d: %w", lo, err)
		}
	} else {
		lo, hi = end, end // no aligned middle: write it all
	}
	if err := writeZeros(f.File, off, lo-off); err != nil {
		return fmt.Errorf("zero range: head: %w", err)
	}
	if err := writeZeros(f.File, hi, end-hi); err != nil {
		return fmt.Errorf("zero range: tail: %w", err)
	}
	return nil
}

// control runs fn with f's descriptor (os.File.SyscallConn).
func (f File) control(fn func(fd int) error) error {
	conn, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := conn.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// unsupported reports whether err is a kernel's "not this file or device"
// (EOPNOTSUPP, ENOTTY, EINVAL, ENOSYS), after which zeros are written.
func unsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS)
}

// zeroOut makes [off, off+n) of dev read as zeros: through dev's [Zeroer]
// (an *os.File as a [File]), or, where dev has none or it is unsupported,
// by writing zeros. It returns how: "BLKZEROOUT" or "punch-hole" for a
// File, "ZeroRange" for another Zeroer, "write" for written zeros.
func zeroOut(dev io.WriterAt, off, n int64) (string, error) {
	if n <= 0 {
		return "", nil
	}
	var err error
	how := "ZeroRange"
	switch z := dev.(type) {
	case *os.File:
		how, err = File{z}.zeroRange(off, n)
	case File:
		how, err = z.zeroRange(off, n)
	case Zeroer:
		err = z.ZeroRange(off, n)
	default:
		err = errors.ErrUnsupported
	}
	if !errors.Is(err, errors.ErrUnsupported) {
		return how, err
	}
	return "write", writeZeros(dev, off, n)
}

// writeZeros writes n zero bytes at off, 1 MiB at a time.
func writeZeros(dev io.WriterAt, off, n int64) error {
	if n <= 0 {
		return nil
	}
	z := make([]byte, min(n, 1<<20))
	for n > 0 {
		c := min(n, int64(len(z)))
		if _, err := dev.WriteAt(z[:c], off); err != nil {
			return err
		}
		off += c
		n -= c
	}
	return nil
}
