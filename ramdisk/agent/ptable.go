package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/diskfs/go-diskfs/partition/mbr"
	"github.com/google/uuid"
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
// device opened read-write. It MAY also be a [Zeroer] (an *os.File is one,
// as a [File]), which zeroes ranges without writing the zeros.
type BlockDevice interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
}

// partTable is a parsed MBR or GPT (UEFI 2.10 §5.2 and §5.3), read by
// go-diskfs (partition/gpt, partition/mbr).
type partTable struct {
	kind       string // "gpt", "mbr" or ""
	sectorSize int64
	parts      [][2]int64 // [start, end) in bytes, clipped to the disk
	gpt        *gpt.Table
	gptEntries int64 // bytes of the GPT entry array
	gptSlots   int   // entries in it
	mbr        *mbr.Table
}

// readOnly makes an io.ReaderAt a BlockDevice that refuses writes.
type readOnly struct{ io.ReaderAt }

func (readOnly) WriteAt([]byte, int64) (int, error) { return 0, errors.New("read-only") }
func (readOnly) Sync() error                        { return nil }

// gptHeader checks the GPT header at LBA 1 for sector size ss before
// go-diskfs reads it: go-diskfs allocates entry count × entry size as the
// header says, and the header on an old disk is untrusted (a previous
// tenant wrote it), so an absurd count must not reach it. It reports
// whether there is a GPT signature, the entry count and the entry size.
func gptHeader(dev io.ReaderAt, ss, diskSize int64) (ok bool, n, esz int64, err error) {
	hdr := make([]byte, 92)
	if _, err := dev.ReadAt(hdr, ss); err != nil || string(hdr[:8]) != "EFI PART" {
		return false, 0, 0, nil
	}
	le := binary.LittleEndian
	lba := int64(le.Uint64(hdr[72:]))
	n, esz = int64(le.Uint32(hdr[80:])), int64(le.Uint32(hdr[84:]))
	if n == 0 || n > 1024 || esz < 128 || esz > 1024 || lba < 2 || lba > diskSize/ss || lba*ss+n*esz > diskSize {
		return true, 0, 0, fmt.Errorf("%w: gpt entries %d x %d at LBA %d", ErrBadPartitionTable, n, esz, lba)
	}
	return true, n, esz, nil
}

func readPartTable(dev io.ReaderAt, diskSize int64) (partTable, error) {
	f := &devFile{dev: readOnly{dev}, size: diskSize}
	clip := func(start, end uint64, ss int64) [2]int64 {
		lim := uint64(diskSize / ss)
		return [2]int64{int64(min(start, lim)) * ss, int64(min(end, lim)) * ss}
	}
	for _, ss := range []int64{512, 4096} {
		ok, n, esz, err := gptHeader(dev, ss, diskSize)
		if err != nil {
			return partTable{}, err
		}
		if !ok {
			continue
		}
		t, err := gpt.Read(f, int(ss), int(ss))
		if err != nil {
			return partTable{}, fmt.Errorf("%w: %v", ErrBadPartitionTable, err)
		}
		pt := partTable{kind: "gpt", sectorSize: ss, gpt: t, gptEntries: n * esz, gptSlots: int(n)}
		for _, p := range t.Partitions {
			pt.parts = append(pt.parts, clip(p.Start, p.End+1, ss))
		}
		return pt, nil
	}
	sig := make([]byte, 2)
	if _, err := dev.ReadAt(sig, 510); err != nil || sig[0] != 0x55 || sig[1] != 0xAA {
		return partTable{}, nil
	}
	t, err := mbr.Read(f, 512, 512)
	if err != nil {
		return partTable{}, fmt.Errorf("%w: %v", ErrBadPartitionTable, err)
	}
	pt := partTable{kind: "mbr", sectorSize: 512, mbr: t}
	for _, p := range t.Partitions {
		if p.Type != mbr.Empty {
			pt.parts = append(pt.parts, clip(uint64(p.Start), uint64(p.Start)+uint64(p.Size), 512))
		}
	}
	return pt, nil
}

// zeroRange makes [off, off+n) clipped to [lo, hi) read as zeros
// (zeroOut: the device's Zeroer, else written zeros).
func zeroRange(dev io.WriterAt, off, n, lo, hi int64) error {
	if off < lo {
		n -= lo - off
		off = lo
	}
	if off+n > hi {
		n = hi - off
	}
	_, err := zeroOut(dev, off, n)
	return err
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
// the root partition can still grow into it. For GPT it adds a "cidata"
// basic-data entry in the first free slot (the image's partition numbers
// stay), moves the backup header and entries to the end of the disk
// (go-diskfs Table.Resize and Write: backup first, then primary, each
// synced), and zeroes the image's stale backup header; for MBR it uses a free
// primary slot (type 0x0E, FAT16 LBA). guidSeed makes the partition GUID
// deterministic (the ramdisk may not have entropy yet). Returns the
// partition's byte offset.
func AddSeedPartition(dev BlockDevice, diskSize, imageSize int64, fsImage []byte, guidSeed string) (int64, error) {
	return addSeed(dev, diskSize, imageSize, int64(len(fsImage)), guidSeed, func(start int64) error {
		_, err := dev.WriteAt(fsImage, start)
		return err
	})
}

// addSeed is AddSeedPartition for a filesystem of size bytes that
// writeFS writes at start, once the start is known and before the table
// describes it.
func addSeed(dev BlockDevice, diskSize, imageSize, size int64, guidSeed string, writeFS func(start int64) error) (int64, error) {
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
		tail = ss + t.gptEntries
	}
	start := (diskSize - tail - size) / mib * mib
	used := imageSize
	for _, p := range t.parts {
		used = max(used, p[1])
	}
	if start < used || start <= 0 {
		return 0, fmt.Errorf("add seed partition: %w: disk %d bytes, image uses %d", ErrNoRoomForSeed, diskSize, used)
	}
	if t.kind == "mbr" {
		return start, addMBRSeed(dev, diskSize, t, start, size, writeFS)
	}
	return start, addGPTSeed(dev, diskSize, t, start, used, size, writeFS, guidSeed)
}

// addMBRSeed writes the filesystem of size bytes at start (writeFS) and
// describes it in the first free primary slot (type 0x0E, FAT16 LBA; CHS
// fields "beyond 8 GiB").
func addMBRSeed(dev BlockDevice, diskSize int64, t partTable, start, size int64, writeFS func(int64) error) error {
	startLBA, endLBA := start/512, (start+size)/512-1
	if endLBA >= 1<<32 {
		return fmt.Errorf("add seed partition: %w: beyond 2 TiB on an MBR disk", ErrNoRoomForSeed)
	}
	slot := slices.IndexFunc(t.mbr.Partitions, func(p *mbr.Partition) bool { return p.Type == mbr.Empty })
	if slot < 0 {
		return fmt.Errorf("add seed partition: %w: all four MBR slots used", ErrNoRoomForSeed)
	}
	if err := writeFS(start); err != nil {
		return fmt.Errorf("add seed partition: write filesystem: %w", err)
	}
	t.mbr.Partitions[slot] = &mbr.Partition{Index: slot + 1, Type: mbr.Fat16bLBA, Start: uint32(startLBA), Size: uint32(endLBA - startLBA + 1),
		StartHead: 0xFE, StartSector: 0xFF, StartCylinder: 0xFF, EndHead: 0xFE, EndSector: 0xFF, EndCylinder: 0xFF}
	if err := t.mbr.Write(&devFile{dev: dev, size: diskSize}, diskSize); err != nil {
		return fmt.Errorf("add seed partition: write mbr: %w", err)
	}
	return nil
}

// addGPTSeed writes the filesystem of size bytes at start (writeFS), adds
// its "cidata" entry in the first free slot, removes the image's stale backup header if it lies in the free
// gap (between used and start), and writes the table with its backup at the
// disk's end.
func addGPTSeed(dev BlockDevice, diskSize int64, t partTable, start, used, size int64, writeFS func(int64) error, guidSeed string) error {
	ss := t.sectorSize
	startLBA, endLBA := start/ss, (start+size)/ss-1
	taken := map[int]bool{}
	for _, p := range t.gpt.Partitions {
		taken[p.Index] = true
	}
	index := 0
	for i := 1; i <= t.gptSlots; i++ {
		if !taken[i] {
			index = i
			break
		}
	}
	if index == 0 {
		return fmt.Errorf("add seed partition: %w: gpt has no free entry", ErrNoRoomForSeed)
	}
	if err := writeFS(start); err != nil {
		return fmt.Errorf("add seed partition: write filesystem: %w", err)
	}
	g := sha256.Sum256([]byte("machina-seed:" + guidSeed))
	id, _ := uuid.FromBytes(g[:16])
	id[6] = id[6]&0x0F | 0x40 // RFC 9562 version 4 layout
	id[8] = id[8]&0x3F | 0x80
	t.gpt.Partitions = append(t.gpt.Partitions, &gpt.Partition{Index: index, Start: uint64(startLBA), End: uint64(endLBA),
		Size: uint64(size), Type: gpt.MicrosoftBasicData, Name: "cidata", GUID: id.String()})
	oldAlt, err := gptAltLBA(dev, ss)
	if err != nil {
		return fmt.Errorf("add seed partition: %w", err)
	}
	if oldAlt > 1 && oldAlt*ss < start && oldAlt*ss >= used-ss {
		// the image's own backup header, now in the free gap: remove it.
		if err := zeroRange(dev, oldAlt*ss, ss, 0, diskSize); err != nil {
			return fmt.Errorf("add seed partition: %w", err)
		}
	}
	t.gpt.Resize(uint64(diskSize))
	if err := t.gpt.Write(&devFile{dev: dev, size: diskSize}, diskSize); err != nil {
		return fmt.Errorf("add seed partition: write gpt: %w", err)
	}
	// go-diskfs writes the protective MBR's size as a 32-bit truncation of
	// the last LBA; UEFI 2.10 §5.2.3 says 0xFFFFFFFF when the disk is larger.
	if lastLBA := diskSize/ss - 1; t.gpt.ProtectiveMBR && lastLBA > 0xFFFFFFFF {
		if _, err := dev.WriteAt([]byte{0xFF, 0xFF, 0xFF, 0xFF}, 446+12); err != nil {
			return fmt.Errorf("add seed partition: write protective mbr: %w", err)
		}
	}
	return nil
}

// gptAltLBA reads the primary header's alternate (backup) LBA, which
// go-diskfs keeps private.
func gptAltLBA(dev io.ReaderAt, ss int64) (int64, error) {
	b := make([]byte, 8)
	if _, err := dev.ReadAt(b, ss+32); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint64(b)), nil
}

// imageHeadTable says which partition table an image's first bytes hold:
// "gpt" (a primary GPT header at LBA 1 for 512- or 4096-byte sectors),
// "mbr" (the 0x55AA boot signature without a GPT) or "" (neither).
// imageSize is the whole image's size, which bounds the GPT's entries.
func imageHeadTable(head []byte, imageSize int64) (string, error) {
	r := bytes.NewReader(head)
	for _, ss := range []int64{512, 4096} {
		ok, _, _, err := gptHeader(r, ss, imageSize)
		if err != nil {
			return "", err
		}
		if ok {
			return "gpt", nil
		}
	}
	if len(head) >= 512 && head[510] == 0x55 && head[511] == 0xAA {
		return "mbr", nil
	}
	return "", nil
}
