package images

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Format is a disk image format detected from magic bytes, never from a name.
type Format string

// Formats Machina recognises. Only [FormatRaw] and [FormatQCOW2] are
// accepted; the others are recognised so they are refused by name instead
// of being written to a disk as if they were raw.
const (
	FormatRaw   Format = "raw"
	FormatQCOW2 Format = "qcow2"
	FormatVMDK  Format = "vmdk"
	FormatVHDX  Format = "vhdx"
	FormatVHD   Format = "vpc"
	FormatVDI   Format = "vdi"
	FormatQED   Format = "qed"
	FormatLUKS  Format = "luks"
	FormatISO   Format = "iso9660"
	FormatXZ    Format = "xz"
	FormatGzip  Format = "gzip"
	FormatZstd  Format = "zstd"
	FormatBzip2 Format = "bzip2"
)

// ErrUnsupportedFormat: the image is in a format Machina refuses (VMDK, VHDX,
// VHD, VDI, QED, LUKS, ISO, compressed) or a qcow2 that references other
// files (backing file, external data file). See [UnsupportedFormatError].
var ErrUnsupportedFormat = errors.New("unsupported image format")

// UnsupportedFormatError says which format was found and why it is refused.
// It matches [ErrUnsupportedFormat] with errors.Is.
type UnsupportedFormatError struct {
	Format Format
	Reason string
}

// Error renders "unsupported image format <format>: <reason>".
func (e *UnsupportedFormatError) Error() string {
	return fmt.Sprintf("unsupported image format %s: %s", e.Format, e.Reason)
}

// Is makes errors.Is(err, ErrUnsupportedFormat) true.
func (e *UnsupportedFormatError) Is(target error) bool { return target == ErrUnsupportedFormat }

// headerSize is how much of the start of an image detection reads.
const headerSize = 64 << 10

// DetectFormat reports the format of the image in f from magic bytes at known
// offsets: qcow2 "QFI\xfb" (QEMU docs/interop/qcow2.txt), VMDK "KDMV" or a
// "# Disk DescriptorFile" text, VHDX "vhdxfile", VHD "conectix" at offset 0
// (dynamic) or in the last 512 bytes (fixed), VDI signature 0xbeda107f at 64,
// QED "QED\0", LUKS "LUKS\xba\xbe", ISO 9660 "CD001" at 32769, and xz, gzip,
// zstd, bzip2 stream headers. Anything else is [FormatRaw].
func DetectFormat(f io.ReaderAt, size int64) (Format, error) {
	hdr := make([]byte, headerSize)
	n, err := f.ReadAt(hdr, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("detect format: %w", err)
	}
	hdr = hdr[:n]
	if fm := detectHeader(hdr); fm != FormatRaw {
		return fm, nil
	}
	if size >= 512 {
		tail := make([]byte, 512)
		if _, err := f.ReadAt(tail, size-512); err != nil && !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("detect format: %w", err)
		}
		if bytes.HasPrefix(tail, []byte("conectix")) {
			return FormatVHD, nil
		}
	}
	return FormatRaw, nil
}

// detectHeader classifies the first bytes of an image.
func detectHeader(h []byte) Format {
	has := func(off int, magic string) bool {
		return len(h) >= off+len(magic) && string(h[off:off+len(magic)]) == magic
	}
	switch {
	case has(0, "QFI\xfb"):
		return FormatQCOW2
	case has(0, "KDMV"), has(0, "# Disk DescriptorFile"), has(0, "COWD"):
		return FormatVMDK
	case has(0, "vhdxfile"):
		return FormatVHDX
	case has(0, "conectix"):
		return FormatVHD
	case has(64, "\x7f\x10\xda\xbe"), has(0, "<<< Oracle VM VirtualBox Disk Image >>>"):
		return FormatVDI
	case has(0, "QED\x00"):
		return FormatQED
	case has(0, "LUKS\xba\xbe"):
		return FormatLUKS
	case has(0, "\xfd7zXZ\x00"):
		return FormatXZ
	case has(0, "\x1f\x8b"):
		return FormatGzip
	case has(0, "\x28\xb5\x2f\xfd"):
		return FormatZstd
	case has(0, "BZh") && len(h) > 3 && h[3] >= '1' && h[3] <= '9':
		return FormatBzip2
	case has(32769, "CD001"):
		return FormatISO
	}
	return FormatRaw
}

// qcow2 header fields (QEMU docs/interop/qcow2.txt, "Header").
const (
	qcow2OffVersion       = 4
	qcow2OffBackingOffset = 8
	qcow2OffIncompatible  = 72
	qcow2IncompatDataFile = 1 << 2 // external data file
)

// CheckQCOW2 validates the qcow2 header in hdr before qemu-img reads the
// image: version 2 or 3, no backing file, no external data file. Those two
// make qemu-img open other paths named inside an untrusted image.
func CheckQCOW2(f io.ReaderAt) error {
	hdr := make([]byte, 104)
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return fmt.Errorf("check qcow2 header: %w", err)
	}
	if string(hdr[:4]) != "QFI\xfb" {
		return &UnsupportedFormatError{Format: FormatQCOW2, Reason: "bad magic"}
	}
	v := binary.BigEndian.Uint32(hdr[qcow2OffVersion:])
	if v != 2 && v != 3 {
		return &UnsupportedFormatError{Format: FormatQCOW2, Reason: fmt.Sprintf("version %d", v)}
	}
	if binary.BigEndian.Uint64(hdr[qcow2OffBackingOffset:]) != 0 {
		return &UnsupportedFormatError{Format: FormatQCOW2, Reason: "image names a backing file"}
	}
	if v == 3 && binary.BigEndian.Uint64(hdr[qcow2OffIncompatible:])&qcow2IncompatDataFile != 0 {
		return &UnsupportedFormatError{Format: FormatQCOW2, Reason: "image uses an external data file"}
	}
	return nil
}
