package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// fat16Golden pins MakeFAT16's image (its SHA-256) as the full-image
// builder made it before NewFAT16's extents existed (commit e39cbf5), for
// a seed, multi-cluster, empty and exactly-one-cluster files, long names,
// and the smallest and largest sizes.
var fat16Golden = []struct {
	name   string
	size   int64
	label  string
	hidden uint32
	files  []SeedFile
	sha256 string
}{
	{"seed", SeedSizeBytes, SeedLabel, 2080768, []SeedFile{{Name: "meta-data", Data: []byte("instance-id: i\n")}, {Name: "network-config", Data: []byte("version: 2\n")}, {Name: "user-data", Data: []byte("#cloud-config\n")}},
		"8b0e377306de29cfe92f3dd9a1edc8b2597fe2dbc1aace71b3135dfb6af3c09e"},
	{"multi-cluster and empty", SeedSizeBytes, "cidata", 0, []SeedFile{{Name: "user-data", Data: []byte("hello\n")}, {Name: "empty", Data: nil}, {Name: "big-file.bin", Data: bytes.Repeat([]byte("0123456789abcdef"), 4096)}, {Name: "exact", Data: bytes.Repeat([]byte{7}, 1024)}},
		"12594f4dcce816867256ae700de88d65c985339fbf98e779a0b4f6ce549e1a76"},
	{"4 MiB", 4 << 20, "old", 77, []SeedFile{{Name: "a-long-file-name-with-several-parts.txt", Data: []byte("x")}},
		"3edca56ced377e0e3341e7feb7ab6fc1d0a24d2b141e4728e7895ae3ca3d06b6"},
	{"32 MiB", 32 << 20, "CIDATA", 1 << 31, nil,
		"bcc56f5e1f83215905eb46c9812d9ddc4e77b7a2fb516b617f08faad6e452212"},
}

// TestMakeFAT16Golden: MakeFAT16, now NewFAT16's extents over zeros, makes
// the same bytes as the full-image builder it replaced; NewFAT16 with
// hidden sectors 0 and SetHiddenSectors (as Deploy does) makes them too;
// the extents are sector-aligned, ascending, disjoint and inside the
// filesystem, and for a seed they are a small part of it.
func TestMakeFAT16Golden(t *testing.T) {
	for _, c := range fat16Golden {
		t.Run(c.name, func(t *testing.T) {
			img, err := MakeFAT16(c.size, c.label, c.hidden, c.files)
			if err != nil {
				t.Fatal(err)
			}
			if s := sha256.Sum256(img); hex.EncodeToString(s[:]) != c.sha256 {
				t.Errorf("MakeFAT16 sha256 = %x, want %s (the full-image builder's)", s, c.sha256)
			}
			fs, err := NewFAT16(c.size, c.label, 0, c.files)
			if err != nil {
				t.Fatal(err)
			}
			fs.SetHiddenSectors(c.hidden)
			if !bytes.Equal(fs.Bytes(), img) {
				t.Errorf("NewFAT16 + SetHiddenSectors(%d) differs from MakeFAT16", c.hidden)
			}
			var end, n int64
			for i, e := range fs.Extents {
				if e.Off%512 != 0 || len(e.Data)%512 != 0 || e.Off < end || e.Off+int64(len(e.Data)) > c.size {
					t.Errorf("extent %d at %d, %d bytes: not sector-aligned, ascending, disjoint and inside %d bytes", i, e.Off, len(e.Data), c.size)
				}
				end = e.Off + int64(len(e.Data))
				n += int64(len(e.Data))
			}
			if c.name == "seed" && n > 8<<10 {
				t.Errorf("seed extents hold %d bytes, want at most 8 KiB of the %d", n, c.size)
			}
		})
	}
}
