package images

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

func TestDetectFormat(t *testing.T) {
	at := func(off int, magic string) []byte {
		b := make([]byte, 40000)
		copy(b[off:], magic)
		return b
	}
	mbr := make([]byte, 4096)
	mbr[510], mbr[511] = 0x55, 0xaa
	vhdFixed := make([]byte, 8192)
	copy(vhdFixed[8192-512:], "conectix")
	for _, tc := range []struct {
		name string
		b    []byte
		want Format
	}{
		{"qcow2", at(0, "QFI\xfb\x00\x00\x00\x03"), FormatQCOW2},
		{"vmdk sparse", at(0, "KDMV"), FormatVMDK},
		{"vmdk descriptor", at(0, "# Disk DescriptorFile\n"), FormatVMDK},
		{"vhdx", at(0, "vhdxfile"), FormatVHDX},
		{"vhd dynamic", at(0, "conectix"), FormatVHD},
		{"vhd fixed footer", vhdFixed, FormatVHD},
		{"vdi", at(64, "\x7f\x10\xda\xbe"), FormatVDI},
		{"qed", at(0, "QED\x00"), FormatQED},
		{"luks", at(0, "LUKS\xba\xbe"), FormatLUKS},
		{"iso", at(32769, "CD001"), FormatISO},
		{"xz", at(0, "\xfd7zXZ\x00"), FormatXZ},
		{"gzip", at(0, "\x1f\x8b\x08"), FormatGzip},
		{"zstd", at(0, "\x28\xb5\x2f\xfd"), FormatZstd},
		{"bzip2", at(0, "BZh9"), FormatBzip2},
		{"raw mbr", mbr, FormatRaw},
		{"raw zeros", make([]byte, 1000), FormatRaw},
		{"empty", nil, FormatRaw},
		{"short", []byte("QF"), FormatRaw},
	} {
		got, err := DetectFormat(bytes.NewReader(tc.b), int64(len(tc.b)))
		if err != nil || got != tc.want {
			t.Errorf("DetectFormat(%s) = %s, %v; want %s", tc.name, got, err, tc.want)
		}
	}
}

func TestCheckQCOW2(t *testing.T) {
	hdr := func(version uint32, backing uint64, incompat uint64) []byte {
		b := make([]byte, 512)
		copy(b, "QFI\xfb")
		binary.BigEndian.PutUint32(b[4:], version)
		binary.BigEndian.PutUint64(b[8:], backing)
		binary.BigEndian.PutUint64(b[72:], incompat)
		return b
	}
	for _, tc := range []struct {
		name string
		b    []byte
		ok   bool
	}{
		{"v3 plain", hdr(3, 0, 0), true},
		{"v2 plain", hdr(2, 0, 0), true},
		{"v3 dirty bit only", hdr(3, 0, 1), true},
		{"backing file", hdr(3, 0x200, 0), false},
		{"external data file", hdr(3, 0, 4), false},
		{"version 4", hdr(4, 0, 0), false},
		{"not qcow2", make([]byte, 512), false},
	} {
		err := CheckQCOW2(bytes.NewReader(tc.b))
		if tc.ok != (err == nil) {
			t.Errorf("CheckQCOW2(%s) = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && tc.name != "not qcow2" && !errors.Is(err, ErrUnsupportedFormat) {
			t.Errorf("CheckQCOW2(%s) = %v, want ErrUnsupportedFormat", tc.name, err)
		}
	}
}

func TestConvertArgs(t *testing.T) {
	dir := "/store/tmp"
	got, err := convertArgs(dir, "/store/tmp/a.part", "/tmp/machina-nbd-1/s")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"convert", "-n", "-f", "qcow2", "-O", "raw", "/store/tmp/a.part", "nbd+unix:///?socket=/tmp/machina-nbd-1/s"}
	if !equalStrings(got, want) {
		t.Errorf("convertArgs = %q, want %q", got, want)
	}
	for _, bad := range [][2]string{
		{"/store/tmp/../../etc/shadow", "/tmp/s"},
		{"/other/a.part", "/tmp/s"},
		{"/store/tmp/json:{}", "/tmp/s"},
		{"/store/tmp/a,b", "/tmp/s"},
		{"relative", "/tmp/s"},
		{"/store/tmp/a part", "/tmp/s"},
		{"/store/tmp", "/tmp/s"},
		{"/store/tmp/a.part", "/tmp/s&export=x"},
		{"/store/tmp/a.part", "/tmp/" + strings.Repeat("s", 100)},
	} {
		if _, err := convertArgs(dir, bad[0], bad[1]); err == nil {
			t.Errorf("convertArgs(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzDetectFormat feeds arbitrary image headers to format detection and the
// qcow2 header check: no panics, and CheckQCOW2 accepts only qcow2 magic.
func FuzzDetectFormat(f *testing.F) {
	f.Add([]byte("QFI\xfb\x00\x00\x00\x03"))
	f.Add([]byte("KDMV"))
	f.Add([]byte("conectix"))
	f.Add(make([]byte, 600))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<20 {
			return
		}
		fm, err := DetectFormat(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatalf("DetectFormat() = %v", err)
		}
		if err := CheckQCOW2(bytes.NewReader(b)); err == nil && (fm != FormatQCOW2 || !bytes.HasPrefix(b, []byte("QFI\xfb"))) {
			t.Fatalf("CheckQCOW2 accepted a %s image", fm)
		}
	})
}
