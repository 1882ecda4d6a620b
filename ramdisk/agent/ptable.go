package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"unicode/utf16"
)

// Errors from the partition-table code.
var (
	// ErrNoRoomForSeed: the image leaves no room for the seed partition at the
	// end of the disk, or the table has no free entry.
	ErrNoRoomForSeed = errors.New("no room for the seed partition")
	// ErrBadPartitionTable: the table is corrupt (bad CRC, impossible bounds).
	ErrBadPartitionTable = errors.New("bad partition table")
)

// BlockDevice is what the disk code needs from a target: a file or a block
// device opened read-write.
type BlockDevice interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
}

// partTable is a parsed MBR or GPT (UEFI 2.10 §5.2 and §5.3).
type partTable struct {
	kind       string // "gpt", "mbr" or ""
	sectorSize int64
	parts      [][2]int64 // [start, end) in bytes
	// GPT only:
	header     []byte // primary header sector
	entries    []byte
	entriesLBA int64
	altLBA     int64
}

var gptBasicData = [16]byte{0xA2, 0xA0, 0xD0, 0xEB, 0xE5, 0xB9, 0x33, 0x44, 0x87, 0xC0, 0x68, 0xB6, 0xB7, 0x26, 0x99, 0xC7}

func readPartTable(dev io.ReaderAt, diskSize int64) (partTable, error) {
	mbr := make([]byte, 512)
	if _, err := dev.ReadAt(mbr, 0); err != nil {
		return partTable{}, fmt.Errorf("read mbr: %w", err)
	}
	for _, ss := range []int64{512, 4096} {
		hdr := make([]byte, ss)
		if _, err := dev.ReadAt(hdr, ss); err != nil {
			continue
		}
		if string(hdr[:8]) != "EFI PART" {
			continue
		}
		le := binary.LittleEndian
		hsize := le.Uint32(hdr[12:])
		if hsize < 92 || int64(hsize) > ss {
			return partTable{}, fmt.Errorf("%w: gpt header size %d", ErrBadPartitionTable, hsize)
		}
		h := append([]byte(nil), hdr[:hsize]...)
		want := le.Uint32(h[16:])
		le.PutUint32(h[16:], 0)
		if crc32.ChecksumIEEE(h) != want {
			return partTable{}, fmt.Errorf("%w: gpt header crc", ErrBadPartitionTable)
		}
		t := partTable{kind: "gpt", sectorSize: ss, header: hdr}
		t.entriesLBA = int64(le.Uint64(hdr[72:]))
		t.altLBA = int64(le.Uint64(hdr[32:]))
		n, esz := int64(le.Uint32(hdr[80:])), int64(le.Uint32(hdr[84:]))
		if n == 0 || n > 1024 || esz < 128 || esz > 1024 || t.entriesLBA*ss+n*esz > diskSize {
			return partTable{}, fmt.Errorf("%w: gpt entries %d x %d", ErrBadPartitionTable, n, esz)
		}
		t.entries = make([]byte, n*esz)
		if _, err := dev.ReadAt(t.entries, t.entriesLBA*ss); err != nil {
			return partTable{}, fmt.Errorf("read gpt entries: %w", err)
		}
		if crc32.ChecksumIEEE(t.entries) != le.Uint32(hdr[88:]) {
			return partTable{}, fmt.Errorf("%w: gpt entries crc", ErrBadPartitionTable)
		}
		for i := int64(0); i < n; i++ {
			e := t.entries[i*esz : (i+1)*esz]
			if bytes.Equal(e[:16], make([]byte, 16)) {
				continue
			}
			first, last := int64(le.Uint64(e[32:])), int64(le.Uint64(e[40:]))
			t.parts = append(t.parts, [2]int64{first * ss, (last + 1) * ss})
		}
		return t, nil
	}
	if mbr[510] != 0x55 || mbr[511] != 0xAA {
		return partTable{}, nil
	}
	t := partTable{kind: "mbr", sectorSize: 512}
	for i := 0; i < 4; i++ {
		e := mbr[446+16*i : 446+16*(i+1)]
		if e[4] == 0 {
			continue
		}
		start, n := int64(binary.LittleEndian.Uint32(e[8:])), int64(binary.LittleEndian.Uint32(e[12:]))
		t.parts = append(t.parts, [2]int64{start * 512, (start + n) * 512})
	}
	return t, nil
}

// zeroRange writes zeros over [off, off+n) clipped to [lo, hi).
func zeroRange(dev io.WriterAt, off, n, lo, hi int64) error {
	if off < lo {
		n -= lo - off
		off = lo
	}
	if off+n > hi {
		n = hi - off
	}
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

// WipeSignatures removes what could make a stale layout win over the new
// image: the first and last MiB of every old partition that lies beyond
// keepBelow (filesystem superblocks at the start; md, ZFS and config-2/cidata
// labels at either end), and the last MiB of the disk (the backup GPT header
// and entries, UEFI 2.10 §5.3.2). Bytes below keepBelow are left alone: the
// image write overwrites them. A corrupt old table is not an error; only
// the disk's tail is wiped then.
func WipeSignatures(dev BlockDevice, diskSize, keepBelow int64) error {
	const mib = 1 << 20
	t, _ := readPartTable(dev, diskSize)
	for _, p := range t.parts {
		if err := zeroRange(dev, p[0], mib, keepBelow, diskSize); err != nil {
			return fmt.Errorf("wipe signatures: %w", err)
		}
		if err := zeroRange(dev, p[1]-mib, mib, keepBelow, diskSize); err != nil {
			return fmt.Errorf("wipe signatures: %w", err)
		}
	}
	if err := zeroRange(dev, diskSize-mib, mib, keepBelow, diskSize); err != nil {
		return fmt.Errorf("wipe signatures: %w", err)
	}
	return nil
}

// AddSeedPartition adds a partition holding fsImage at the end of the disk,
// aligned to 1 MiB, leaving the gap after the image's last partition free so
// the root partition can still grow into it. For GPT it writes a "cidata"
// basic-data entry, relocates the backup header and entries to the end of
// the disk (the image's own backup sits at the image's end) and zeroes the
// image's stale backup header; for MBR it uses a free primary slot (type
// 0x0E, FAT16 LBA). guidSeed makes the partition GUID deterministic (the
// ramdisk may not have entropy yet). Returns the partition's byte offset.
func AddSeedPartition(dev BlockDevice, diskSize, imageSize int64, fsImage []byte, guidSeed string) (int64, error) {
	const mib = 1 << 20
	t, err := readPartTable(dev, diskSize)
	if err != nil {
		return 0, fmt.Errorf("add seed partition: %w", err)
	}
	if t.kind == "" {
		return 0, fmt.Errorf("add seed partition: %w: image has no partition table", ErrBadPartitionTable)
	}
	ss := t.sectorSize
	tail := int64(0)
	if t.kind == "gpt" {
		tail = ss + int64(len(t.entries))
	}
	start := (diskSize - tail - int64(len(fsImage))) / mib * mib
	used := imageSize
	for _, p := range t.parts {
		used = max(used, p[1])
	}
	if start < used || start <= 0 {
		return 0, fmt.Errorf("add seed partition: %w: disk %d bytes, image uses %d", ErrNoRoomForSeed, diskSize, used)
	}
	// Clear the region first so that nothing of an old filesystem survives
	// past the end of the new one.
	if _, err := dev.WriteAt(fsImage, start); err != nil {
		return 0, fmt.Errorf("add seed partition: write filesystem: %w", err)
	}
	startLBA, endLBA := start/ss, (start+int64(len(fsImage)))/ss-1
	le := binary.LittleEndian
	if t.kind == "mbr" {
		mbr := make([]byte, 512)
		if _, err := dev.ReadAt(mbr, 0); err != nil {
			return 0, fmt.Errorf("add seed partition: %w", err)
		}
		if endLBA >= 1<<32 {
			return 0, fmt.Errorf("add seed partition: %w: beyond 2 TiB on an MBR disk", ErrNoRoomForSeed)
		}
		for i := 0; i < 4; i++ {
			e := mbr[446+16*i : 446+16*(i+1)]
			if e[4] != 0 {
				continue
			}
			e[0] = 0
			copy(e[1:4], []byte{0xFE, 0xFF, 0xFF})
			e[4] = 0x0E
			copy(e[5:8], []byte{0xFE, 0xFF, 0xFF})
			le.PutUint32(e[8:], uint32(startLBA))
			le.PutUint32(e[12:], uint32(endLBA-startLBA+1))
			if _, err := dev.WriteAt(mbr, 0); err != nil {
				return 0, fmt.Errorf("add seed partition: write mbr: %w", err)
			}
			return start, nil
		}
		return 0, fmt.Errorf("add seed partition: %w: all four MBR slots used", ErrNoRoomForSeed)
	}
	esz := int64(le.Uint32(t.header[84:]))
	slot := int64(-1)
	for i := int64(0); i*esz < int64(len(t.entries)); i++ {
		if bytes.Equal(t.entries[i*esz:i*esz+16], make([]byte, 16)) {
			slot = i
			break
		}
	}
	if slot < 0 {
		return 0, fmt.Errorf("add seed partition: %w: gpt has no free entry", ErrNoRoomForSeed)
	}
	e := t.entries[slot*esz : (slot+1)*esz]
	copy(e[0:16], gptBasicData[:])
	g := sha256.Sum256([]byte("machina-seed:" + guidSeed))
	g[7] = g[7]&0x0F | 0x40 // version 4 layout (mixed-endian field 3)
	g[8] = g[8]&0x3F | 0x80
	copy(e[16:32], g[:16])
	le.PutUint64(e[32:], uint64(startLBA))
	le.PutUint64(e[40:], uint64(endLBA))
	le.PutUint64(e[48:], 0)
	name := utf16.Encode([]rune("cidata"))
	for i := range 36 {
		v := uint16(0)
		if i < len(name) {
			v = name[i]
		}
		le.PutUint16(e[56+2*i:], v)
	}
	lastLBA := diskSize/ss - 1
	entSecs := (int64(len(t.entries)) + ss - 1) / ss
	backupEntriesLBA := lastLBA - entSecs
	ecrc := crc32.ChecksumIEEE(t.entries)
	hsize := int64(le.Uint32(t.header[12:]))
	mk := func(my, alt, entLBA int64) []byte {
		h := make([]byte, ss)
		copy(h, t.header[:hsize])
		le.PutUint64(h[24:], uint64(my))
		le.PutUint64(h[32:], uint64(alt))
		le.PutUint64(h[48:], uint64(backupEntriesLBA-1)) // last usable LBA
		le.PutUint64(h[72:], uint64(entLBA))
		le.PutUint32(h[88:], ecrc)
		le.PutUint32(h[16:], 0)
		le.PutUint32(h[16:], crc32.ChecksumIEEE(h[:hsize]))
		return h
	}
	oldAlt := t.altLBA
	if oldAlt > 1 && oldAlt*ss < start && oldAlt*ss >= used-ss {
		// the image's own backup header, now in the free gap: remove it.
		if err := zeroRange(dev, oldAlt*ss, ss, 0, diskSize); err != nil {
			return 0, fmt.Errorf("add seed partition: %w", err)
		}
	}
	if _, err := dev.WriteAt(t.entries, t.entriesLBA*ss); err != nil {
		return 0, fmt.Errorf("add seed partition: write gpt: %w", err)
	}
	if _, err := dev.WriteAt(t.entries, backupEntriesLBA*ss); err != nil {
		return 0, fmt.Errorf("add seed partition: write backup gpt: %w", err)
	}
	if _, err := dev.WriteAt(mk(lastLBA, 1, backupEntriesLBA), lastLBA*ss); err != nil {
		return 0, fmt.Errorf("add seed partition: write backup gpt: %w", err)
	}
	if _, err := dev.WriteAt(mk(1, lastLBA, t.entriesLBA), ss); err != nil {
		return 0, fmt.Errorf("add seed partition: write gpt: %w", err)
	}
	// Protective MBR (UEFI 2.10 §5.2.3): one 0xEE entry covering the disk.
	mbr := make([]byte, 512)
	if _, err := dev.ReadAt(mbr, 0); err == nil && mbr[446+4] == 0xEE {
		n := min(lastLBA, 0xFFFFFFFF)
		le.PutUint32(mbr[446+12:], uint32(n))
		if _, err := dev.WriteAt(mbr, 0); err != nil {
			return 0, fmt.Errorf("add seed partition: write protective mbr: %w", err)
		}
	}
	return start, nil
}
