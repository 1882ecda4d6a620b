package controller

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"strings"
	"testing"
)

// pe64 is a minimal PE32+ x86-64 image (no sections) whose certificate
// table (data directory 4) has size certSize: what boot.CheckSignedX64
// reads.
func pe64(certSize uint32) []byte {
	b := make([]byte, 0x80+4+20+240)
	binary.LittleEndian.PutUint16(b[0:], 0x5a4d) // "MZ"
	binary.LittleEndian.PutUint32(b[0x3c:], 0x80)
	copy(b[0x80:], "PE\x00\x00")
	coff := b[0x84:]
	binary.LittleEndian.PutUint16(coff[0:], 0x8664) // x86-64
	binary.LittleEndian.PutUint16(coff[16:], 240)   // SizeOfOptionalHeader
	opt := coff[20:]
	binary.LittleEndian.PutUint16(opt[0:], 0x20b) // PE32+
	binary.LittleEndian.PutUint32(opt[108:], 16)  // NumberOfRvaAndSizes
	binary.LittleEndian.PutUint32(opt[112+4*8:], 0x1000)
	binary.LittleEndian.PutUint32(opt[112+4*8+4:], certSize)
	return b
}

// TestWarnUnsignedKernel: the controller warns at start when the Secure
// Boot chain's kernel carries no Authenticode signature (or is no x86-64
// PE image), naming the file and BootStalled, and says nothing of a
// signed one.
func TestWarnUnsignedKernel(t *testing.T) {
	for _, tc := range []struct {
		name string
		img  []byte
		warn bool
	}{
		{"signed", pe64(0x800), false},
		{"signature removed", pe64(0), true},
		{"not a PE image", []byte("not a kernel"), true},
	} {
		var buf bytes.Buffer
		warnUnsignedKernel(tc.img, "/srv/ramdisk/vmlinuz", slog.New(slog.NewTextHandler(&buf, nil)))
		got := buf.String()
		if tc.warn != (got != "") {
			t.Errorf("%s: log %q, want a warning %v", tc.name, got, tc.warn)
		}
		if tc.warn && (!strings.Contains(got, "level=WARN") || !strings.Contains(got, "kernel=/srv/ramdisk/vmlinuz") || !strings.Contains(got, "BootStalled")) {
			t.Errorf("%s: warning %q lacks the level, the file or BootStalled", tc.name, got)
		}
	}
}
