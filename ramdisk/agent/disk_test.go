package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/peertest"
	"sigs.k8s.io/yaml"
)

func TestChooseDisk(t *testing.T) {
	f, err := CollectFacts(machineRoot(t, "supermicro-nvme-sata"))
	if err != nil {
		t.Fatal(err)
	}
	const GB = 1_000_000_000
	cases := []struct {
		name    string
		hint    v1.RootDeviceHint
		need    int64
		exclude map[string]bool
		want    string
		err     error
	}{
		{name: "smallest that fits", need: 10 * GB, want: "nvme0n1"},
		{name: "smallest that fits skips too small", need: 1000 * GB, want: "nvme1n1"},
		{name: "nothing fits", need: 5000 * GB, err: ErrNoDisk},
		{name: "usb stick and virtual media never chosen", need: 1, exclude: map[string]bool{"nvme0n1": true, "nvme1n1": true, "sda": true}, err: ErrNoDisk},
		{name: "exclude ramdisk source", need: 10 * GB, exclude: map[string]bool{"nvme0n1": true}, want: "nvme1n1"},
		{name: "hint serial", hint: v1.RootDeviceHint{Serial: "zc1abcde"}, need: 1, want: "sda"},
		{name: "hint wwn with 0x", hint: v1.RootDeviceHint{WWN: "0x5000c500a1b2c3d4"}, need: 1, want: "sda"},
		{name: "hint by-path full", hint: v1.RootDeviceHint{ByPath: "/dev/disk/by-path/pci-0000:3c:00.0-nvme-1"}, need: 1, want: "nvme1n1"},
		{name: "hint min size", hint: v1.RootDeviceHint{MinSizeBytes: 2000 * GB}, need: 1, want: "sda"},
		{name: "hint serial of usb stick", hint: v1.RootDeviceHint{Serial: "4C530001230815117342"}, need: 1, err: ErrNoDisk},
		{name: "hint too small disk", hint: v1.RootDeviceHint{Serial: "S45NNE0M123456"}, need: 1000 * GB, err: ErrNoDisk},
		{name: "kernel name refused", hint: v1.RootDeviceHint{DeviceName: "/dev/sda"}, need: 1, err: ErrKernelNameHint},
		{name: "kernel name in by-path refused", hint: v1.RootDeviceHint{ByPath: "/dev/nvme0n1"}, need: 1, err: ErrKernelNameHint},
		{name: "bare kernel name refused", hint: v1.RootDeviceHint{Serial: "sdb"}, need: 1, err: ErrKernelNameHint},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := ChooseDisk(f.Disks, c.hint, c.need, c.exclude)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("ChooseDisk = %s, %v; want error %v", d.Name, err, c.err)
				}
				return
			}
			if err != nil || d.Name != c.want {
				t.Fatalf("ChooseDisk = %s, %v; want %s", d.Name, err, c.want)
			}
		})
	}
	twins := []v1.Disk{{Name: "sda", SizeBytes: 100 * GB, Serial: "A"}, {Name: "sdb", SizeBytes: 100 * GB, Serial: "B"}, {Name: "sdc", SizeBytes: 200 * GB}}
	if _, err := ChooseDisk(twins, v1.RootDeviceHint{}, GB, nil); !errors.Is(err, ErrAmbiguousDisk) {
		t.Errorf("two equal smallest disks: err = %v, want ErrAmbiguousDisk", err)
	}
	if _, err := ChooseDisk(twins, v1.RootDeviceHint{MinSizeBytes: 50 * GB}, GB, nil); !errors.Is(err, ErrAmbiguousDisk) {
		t.Errorf("min-size hint matching three: err = %v, want ErrAmbiguousDisk", err)
	}
	if d, err := ChooseDisk(twins, v1.RootDeviceHint{Serial: "B"}, GB, nil); err != nil || d.Name != "sdb" {
		t.Errorf("serial hint among twins = %v, %v", d.Name, err)
	}
}

func TestMountedDisks(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "proc"), 0o755)
	os.WriteFile(filepath.Join(root, "proc/mounts"), []byte("rootfs / rootfs rw 0 0\n/dev/sr0 /media iso9660 ro 0 0\n/dev/sdb1 /boot vfat rw 0 0\nproc /proc proc rw 0 0\n"), 0o644)
	os.MkdirAll(filepath.Join(root, "sys/devices/x/block/sdb/sdb1"), 0o755)
	os.WriteFile(filepath.Join(root, "sys/devices/x/block/sdb/sdb1/partition"), []byte("1\n"), 0o644)
	os.MkdirAll(filepath.Join(root, "sys/class/block"), 0o755)
	os.Symlink("../../devices/x/block/sdb/sdb1", filepath.Join(root, "sys/class/block/sdb1"))
	got := MountedDisks(root)
	if !got["sdb"] || !got["sr0"] || len(got) != 2 {
		t.Fatalf("MountedDisks = %v, want sdb and sr0", got)
	}
}

// need fails naming the Debian package when a tool used as a real peer is missing.
func need(t *testing.T, tools ...string) {
	t.Helper()
	peertest.Commands(t, tools...)
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// makeGPTImage builds a raw disk image of size bytes with sgdisk: an ESP and
// a root partition filling the rest, like a cloud image.
func makeGPTImage(t *testing.T, size int64) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Truncate(p, size)
	run(t, "sgdisk", "-n", "1:2048:+1M", "-t", "1:ef00", "-c", "1:esp", "-n", "2:0:0", "-t", "2:8300", "-c", "2:root", p)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	// recognisable content in the root partition
	rand.NewChaCha8([32]byte{1}).Read(b[4<<20 : len(b)-(64<<10)])
	return b
}

func makeMBRImage(t *testing.T, size int64) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "img")
	os.WriteFile(p, nil, 0o644)
	os.Truncate(p, size)
	cmd := exec.Command("sfdisk", "-q", p)
	cmd.Stdin = strings.NewReader("label: dos\nstart=2048, type=83, bootable\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(p)
	for i := 1 << 20; i < len(b); i++ {
		b[i] = byte(i * 7)
	}
	return b
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// targetTemplates caches old-layout disk contents by size: sgdisk takes
// about a second per call, so each layout is built once per test binary.
var (
	targetMu        sync.Mutex
	targetTemplates = map[int64][]byte{}
)

// newTarget makes a file "disk" of size bytes holding random bytes and an
// old GPT layout with leftover config-2 and cidata partitions near its end.
func newTarget(t *testing.T, size int64) (*os.File, []byte) {
	t.Helper()
	targetMu.Lock()
	tmpl, ok := targetTemplates[size]
	if !ok {
		tmpl = buildOldLayout(t, size)
		targetTemplates[size] = tmpl
	}
	targetMu.Unlock()
	p := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(p, tmpl, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, append([]byte(nil), tmpl...)
}

func buildOldLayout(t *testing.T, size int64) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "old")
	junk := make([]byte, size)
	rand.NewChaCha8([32]byte{2}).Read(junk)
	if err := os.WriteFile(p, junk, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "sgdisk", "-Z", p)
	run(t, "sgdisk", "-n", "1:2048:+8M", "-c", "1:oldroot", "-n", "2:-12M:+4M", "-c", "2:config-2", "-n", "3:-6M:+4M", "-c", "3:cidata", p)
	seedOff := int64(0)
	for _, l := range strings.Split(run(t, "sgdisk", "-i", "3", p), "\n") {
		if s, ok := strings.CutPrefix(l, "First sector: "); ok {
			n, _ := strconv.ParseInt(strings.Fields(s)[0], 10, 64)
			seedOff = n * 512
		}
	}
	old, err := MakeFAT16(4<<20, "cidata", 0, []SeedFile{{Name: "user-data", Data: []byte("#cloud-config\nold: true\n")}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	copy(b[seedOff:], old)
	return b
}

func TestWriteImageCorruptLeavesTargetUnchanged(t *testing.T) {
	need(t, "sgdisk")
	img := makeGPTImage(t, 8<<20)
	good := sum(img)
	bad := append([]byte(nil), img...)
	bad[5<<20] ^= 1
	for _, mode := range []struct {
		name  string
		limit int64
	}{{"memory", 0}, {"two-pass", -1}} {
		for _, c := range []struct {
			name string
			data []byte
			size int64
			want error
		}{
			{"flipped bit", bad, int64(len(img)), ErrChecksum},
			{"truncated", img[:len(img)-4096], int64(len(img)), ErrImageSize},
			{"longer", append(append([]byte(nil), img...), 0), int64(len(img)), ErrImageSize},
		} {
			t.Run(mode.name+"/"+c.name, func(t *testing.T) {
				f, before := newTarget(t, 64<<20)
				_, err := WriteImage(context.Background(), f, 64<<20, WriteConfig{
					Open: FileOpener(c.data), SizeBytes: c.size, SHA256: good, MemoryLimit: mode.limit, ChunkBytes: 1 << 20,
				})
				if !errors.Is(err, c.want) {
					t.Fatalf("WriteImage err = %v, want %v", err, c.want)
				}
				after, _ := os.ReadFile(f.Name())
				if !bytes.Equal(before, after) {
					t.Fatalf("target changed although the image failed verification")
				}
			})
		}
	}
}

func TestWriteImageSourceChangedBetweenPasses(t *testing.T) {
	need(t, "sgdisk")
	img := makeGPTImage(t, 8<<20)
	changed := append([]byte(nil), img...)
	changed[6<<20+17] ^= 0xff
	calls := 0
	open := func(context.Context) (io.ReadCloser, error) {
		calls++
		if calls == 1 {
			return io.NopCloser(bytes.NewReader(img)), nil
		}
		return io.NopCloser(bytes.NewReader(changed)), nil
	}
	f, before := newTarget(t, 64<<20)
	_, err := WriteImage(context.Background(), f, 64<<20, WriteConfig{Open: open, SizeBytes: int64(len(img)), SHA256: sum(img), MemoryLimit: -1, ChunkBytes: 1 << 20})
	if !errors.Is(err, ErrSourceChanged) {
		t.Fatalf("err = %v, want ErrSourceChanged", err)
	}
	after, _ := os.ReadFile(f.Name())
	if !bytes.Equal(after[:6<<20], img[:6<<20]) {
		t.Errorf("verified chunks before the change were not written")
	}
	if !bytes.Equal(after[6<<20:7<<20], before[6<<20:7<<20]) {
		t.Errorf("the changed chunk reached the disk")
	}
}

// seedInfo is what NoCloud finds: the partition whose filesystem label is
// "cidata" (case-insensitive) and whose type is vfat or iso9660.
type seedInfo struct {
	offset int64
	label  string
	files  map[string]string
}

// findNoCloudSeed applies cloud-init's NoCloud discovery to a disk image
// with blkid as the probe (DataSourceNoCloud: fs_label "cidata", compared
// case-insensitively, filesystem vfat or iso9660) and reads the files with
// mtools, as the ramdisk itself never mounts the seed.
func findNoCloudSeed(t *testing.T, disk string) []seedInfo {
	t.Helper()
	var tbl struct {
		PartitionTable struct {
			Partitions []struct {
				Start int64 `json:"start"`
			} `json:"partitions"`
		} `json:"partitiontable"`
	}
	if err := json.Unmarshal([]byte(run(t, "sfdisk", "--json", disk)), &tbl); err != nil {
		t.Fatal(err)
	}
	var found []seedInfo
	for _, p := range tbl.PartitionTable.Partitions {
		off := p.Start * 512
		out, _ := exec.Command("blkid", "-p", "-O", strconv.FormatInt(off, 10), "-o", "export", disk).Output()
		kv := map[string]string{}
		for _, l := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(l, "="); ok {
				kv[k] = v
			}
		}
		if !strings.EqualFold(kv["LABEL"], "cidata") || (kv["TYPE"] != "vfat" && kv["TYPE"] != "iso9660") {
			continue
		}
		s := seedInfo{offset: off, label: kv["LABEL"], files: map[string]string{}}
		for _, name := range []string{"user-data", "meta-data", "network-config"} {
			s.files[name] = run(t, "mtype", "-i", fmt.Sprintf("%s@@%d", disk, off), "::"+name)
		}
		found = append(found, s)
	}
	return found
}

var testSeed = v1.Seed{
	InstanceID:  "i-r1-n01-7",
	Hostname:    "r1-n01",
	SSHKeys:     []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkUjIg1YmN3qkI3QVh2dGZ1bHd0cWZ6eHJ0a2Z4 ops@site"},
	JoinCommand: "",
}

// TestDeployReproducible: the same image and seed deployed to two identical
// targets leave identical disks, byte for byte (the FAT16 seed, the GPT
// go-diskfs rewrites with its relocated backup, the partition GUID derived
// from the instance ID), for GPT and MBR images alike.
func TestDeployReproducible(t *testing.T) {
	need(t, "sgdisk", "sfdisk")
	const diskSize = 96 << 20
	for name, img := range map[string][]byte{"gpt": makeGPTImage(t, 16<<20), "mbr": makeMBRImage(t, 16<<20)} {
		var disks [][]byte
		for range 2 {
			f, _ := newTarget(t, diskSize)
			if _, err := Deploy(context.Background(), f, diskSize, DeployConfig{
				Write: WriteConfig{Open: FileOpener(img), SizeBytes: int64(len(img)), SHA256: sum(img), ChunkBytes: 1 << 20},
				Seed:  testSeed,
			}); err != nil {
				t.Fatalf("%s: Deploy: %v", name, err)
			}
			b, err := os.ReadFile(f.Name())
			if err != nil {
				t.Fatal(err)
			}
			disks = append(disks, b)
		}
		if !bytes.Equal(disks[0], disks[1]) {
			t.Errorf("%s: two deploys of the same image and seed differ", name)
		}
	}
}

// TestAddSeedPartitionBeyond2TiB: on a disk past 2 TiB the protective MBR
// says 0xFFFFFFFF (UEFI 2.10 §5.2.3), where go-diskfs alone would write the
// last LBA truncated to 32 bits; sgdisk verifies the result. The disk is a
// sparse file.
func TestAddSeedPartitionBeyond2TiB(t *testing.T) {
	need(t, "sgdisk")
	const diskSize = 3 << 40
	img := makeGPTImage(t, 16<<20)
	p := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(p, img, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, diskSize); err != nil {
		t.Fatalf("sparse file of %d bytes: %v", int64(diskSize), err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fsImg, err := MakeFAT16(SeedSizeBytes, SeedLabel, 0, []SeedFile{{Name: "meta-data", Data: []byte("instance-id: i\n")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := AddSeedPartition(f, diskSize, int64(len(img)), fsImg, "i"); err != nil {
		t.Fatal(err)
	}
	mbr := make([]byte, 512)
	if _, err := f.ReadAt(mbr, 0); err != nil {
		t.Fatal(err)
	}
	if mbr[446+4] != 0xEE || binary.LittleEndian.Uint32(mbr[446+12:]) != 0xFFFFFFFF {
		t.Errorf("protective MBR entry % x, want type ee and size ffffffff", mbr[446:462])
	}
	if out := run(t, "sgdisk", "-v", p); !strings.Contains(out, "No problems found") {
		t.Errorf("sgdisk -v:\n%s", out)
	}
}

// TestReadPartTableRefusesAbsurdHeader: a CRC-valid GPT header (as a
// previous tenant could leave) claiming 2^31 entries is refused before
// go-diskfs would allocate 256 GiB for them.
func TestReadPartTableRefusesAbsurdHeader(t *testing.T) {
	need(t, "sgdisk")
	img := makeGPTImage(t, 16<<20)
	hdr := img[512 : 512+92]
	binary.LittleEndian.PutUint32(hdr[80:], 1<<31)
	binary.LittleEndian.PutUint32(hdr[16:], 0)
	binary.LittleEndian.PutUint32(hdr[16:], crc32.ChecksumIEEE(hdr))
	if _, err := readPartTable(bytes.NewReader(img), int64(len(img))); !errors.Is(err, ErrBadPartitionTable) {
		t.Fatalf("readPartTable = %v, want ErrBadPartitionTable", err)
	}
	dev := &memDev{b: img}
	if _, err := AddSeedPartition(dev, int64(len(img)), 1<<20, make([]byte, SeedSizeBytes), "i"); !errors.Is(err, ErrBadPartitionTable) {
		t.Fatalf("AddSeedPartition = %v, want ErrBadPartitionTable", err)
	}
}

func TestDeployGPTWithSeed(t *testing.T) {
	need(t, "sgdisk", "sfdisk", "blkid", "mtype", "fsck.fat")
	img := makeGPTImage(t, 16<<20)
	const diskSize = 96 << 20
	f, _ := newTarget(t, diskSize)
	res, err := Deploy(context.Background(), f, diskSize, DeployConfig{
		Write: WriteConfig{Open: FileOpener(img), SizeBytes: int64(len(img)), SHA256: sum(img), ReadBack: true, ChunkBytes: 1 << 20},
		Seed:  testSeed,
	})
	if err != nil {
		t.Fatalf("Deploy: %v", err)
	}
	after, _ := os.ReadFile(f.Name())
	if !bytes.Equal(after[34*512:len(img)-33*512], img[34*512:len(img)-33*512]) {
		t.Fatal("image bytes on disk differ")
	}
	if out := run(t, "sgdisk", "-v", f.Name()); !strings.Contains(out, "No problems found") {
		t.Fatalf("sgdisk -v after seed:\n%s", out)
	}
	// exactly one seed, at the end of the disk, leaving room for root to grow
	seeds := findNoCloudSeed(t, f.Name())
	if len(seeds) != 1 {
		t.Fatalf("found %d NoCloud seeds, want exactly 1 (old cidata must be wiped)", len(seeds))
	}
	s := seeds[0]
	if s.offset != res.SeedOffset || s.offset < diskSize-SeedSizeBytes-2<<20 || s.offset < int64(len(img))+32<<20 {
		t.Errorf("seed at %d, want near the disk end %d so root can grow", s.offset, diskSize)
	}
	checkSeedContent(t, s.files)
	part := filepath.Join(t.TempDir(), "seed.fat")
	os.WriteFile(part, after[s.offset:s.offset+SeedSizeBytes], 0o644)
	if out := run(t, "fsck.fat", "-n", part); strings.Contains(out, "differ") {
		t.Errorf("fsck.fat: %s", out)
	}
	// the old config-2 partition's signature is gone
	for _, l := range strings.Split(run(t, "sgdisk", "-p", f.Name()), "\n") {
		if strings.Contains(l, "config-2") || strings.Contains(l, "oldroot") {
			t.Errorf("stale partition survived: %s", l)
		}
	}
	// root partition can grow: sgdisk reports free space between root and seed
	if out := run(t, "sgdisk", "-p", f.Name()); !strings.Contains(out, "cidata") {
		t.Errorf("seed partition not named cidata:\n%s", out)
	}
}

// checkSeedContent parses the seed with a YAML parser and checks the
// security-relevant settings. v1.JoinPlaceholder stands in for the join
// command until the join issue provides it (this test says so on purpose).
func checkSeedContent(t *testing.T, files map[string]string) {
	t.Helper()
	ud := files["user-data"]
	if !strings.HasPrefix(ud, "#cloud-config\n") {
		t.Fatalf("user-data lacks #cloud-config header:\n%s", ud)
	}
	var cfg struct {
		Users []struct {
			Name       string   `json:"name"`
			Gecos      string   `json:"gecos"`
			Shell      string   `json:"shell"`
			Sudo       string   `json:"sudo"`
			LockPasswd bool     `json:"lock_passwd"`
			Keys       []string `json:"ssh_authorized_keys"`
		} `json:"users"`
		SSHPwauth   *bool      `json:"ssh_pwauth"`
		DisableRoot *bool      `json:"disable_root"`
		Runcmd      [][]string `json:"runcmd"`
	}
	if err := yaml.UnmarshalStrict([]byte(ud), &cfg); err != nil {
		t.Fatalf("user-data is not the expected YAML: %v\n%s", err, ud)
	}
	if len(cfg.Users) != 1 || cfg.Users[0].Name != "machina" || cfg.Users[0].Sudo != "ALL=(ALL) NOPASSWD:ALL" || !cfg.Users[0].LockPasswd {
		t.Errorf("users = %+v", cfg.Users)
	}
	if len(cfg.Users) == 1 && (len(cfg.Users[0].Keys) != 1 || cfg.Users[0].Keys[0] != testSeed.SSHKeys[0]) {
		t.Errorf("keys = %v", cfg.Users[0].Keys)
	}
	if cfg.SSHPwauth == nil || *cfg.SSHPwauth || cfg.DisableRoot == nil || !*cfg.DisableRoot {
		t.Errorf("ssh_pwauth/disable_root = %v/%v, want false/true", cfg.SSHPwauth, cfg.DisableRoot)
	}
	// Placeholder: the join issue replaces v1.JoinPlaceholder with the real command.
	if len(cfg.Runcmd) != 1 || len(cfg.Runcmd[0]) != 3 || cfg.Runcmd[0][2] != v1.JoinPlaceholder {
		t.Errorf("runcmd = %v, want the join placeholder", cfg.Runcmd)
	}
	var md map[string]string
	if err := yaml.UnmarshalStrict([]byte(files["meta-data"]), &md); err != nil || md["instance-id"] != testSeed.InstanceID || md["local-hostname"] != testSeed.Hostname {
		t.Errorf("meta-data = %v, %v", md, err)
	}
	var nc map[string]any
	if err := yaml.Unmarshal([]byte(files["network-config"]), &nc); err != nil || nc["version"] != float64(2) {
		t.Errorf("network-config = %v, %v", nc, err)
	}
}

func TestDeployMBRWithSeed(t *testing.T) {
	need(t, "sfdisk", "blkid", "mtype")
	img := makeMBRImage(t, 8<<20)
	const diskSize = 64 << 20
	f, _ := newTarget(t, diskSize)
	if _, err := Deploy(context.Background(), f, diskSize, DeployConfig{
		Write: WriteConfig{Open: FileOpener(img), SizeBytes: int64(len(img)), SHA256: sum(img), MemoryLimit: -1, ChunkBytes: 1 << 20},
		Seed:  testSeed,
	}); err != nil {
		t.Fatalf("Deploy: %v", err)
	}
	seeds := findNoCloudSeed(t, f.Name())
	if len(seeds) != 1 {
		t.Fatalf("found %d seeds, want 1", len(seeds))
	}
	checkSeedContent(t, seeds[0].files)
	if out := run(t, "sfdisk", "-d", f.Name()); !strings.Contains(out, "type=e") {
		t.Errorf("no FAT16 LBA partition:\n%s", out)
	}
	// The old layout was GPT: its backup header at the end of the disk must
	// be gone, or tools would offer to "restore" the stale GPT.
	after, _ := os.ReadFile(f.Name())
	if bytes.Contains(after[diskSize-(1<<20):], []byte("EFI PART")) {
		t.Error("stale backup GPT header survived at the end of the disk")
	}
	if out := run(t, "blkid", "-p", "-o", "export", f.Name()); !strings.Contains(out, "PTTYPE=dos") {
		t.Errorf("blkid sees %s, want PTTYPE=dos", out)
	}
}

func TestRenderSeedRejects(t *testing.T) {
	for name, s := range map[string]v1.Seed{
		"bad hostname":    {InstanceID: "i", Hostname: "Bad_Host", SSHKeys: testSeed.SSHKeys},
		"no keys":         {InstanceID: "i", Hostname: "h"},
		"password":        {InstanceID: "i", Hostname: "h", SSHKeys: []string{"hunter2"}},
		"key injection":   {InstanceID: "i", Hostname: "h", SSHKeys: []string{"ssh-ed25519 AAAA x\nruncmd: [reboot]"}},
		"multiline join":  {InstanceID: "i", Hostname: "h", SSHKeys: testSeed.SSHKeys, JoinCommand: "a\nb"},
		"bad instance":    {InstanceID: "../x", Hostname: "h", SSHKeys: testSeed.SSHKeys},
		"token injection": {InstanceID: "i", Hostname: "h", SSHKeys: testSeed.SSHKeys, JoinToken: "abcdefghijklmnop\"\nruncmd: [reboot]"},
	} {
		if _, err := RenderSeed(s); !errors.Is(err, ErrSeedInvalid) {
			t.Errorf("%s: RenderSeed err = %v, want ErrSeedInvalid", name, err)
		}
	}
}

// TestRenderSeedJoinTokenFile: a seed with a join token writes it with
// write_files to v1.JoinTokenPath (0600, root) and keeps it out of runcmd,
// whose [sh, -c, CMD] argv every local user can read (before,
// the token rode inline in CMD).
func TestRenderSeedJoinTokenFile(t *testing.T) {
	const tok = "mj_0123456789abcdefXYZ_-"
	s := testSeed
	s.JoinCommand = `(set -eu; tf='` + v1.JoinTokenPath + `'; MACHINA_JOIN_TOKEN="$(cat "$tf")" sh /x)`
	s.JoinToken = tok
	files, err := RenderSeed(s)
	if err != nil {
		t.Fatal(err)
	}
	var ud []byte
	for _, f := range files {
		if f.Name == "user-data" {
			ud = f.Data
		}
	}
	var doc struct {
		WriteFiles []struct{ Path, Owner, Permissions, Content string } `json:"write_files"`
		Runcmd     [][]string                                           `json:"runcmd"`
	}
	if err := yaml.Unmarshal(ud, &doc); err != nil {
		t.Fatalf("user-data: %v\n%s", err, ud)
	}
	if len(doc.WriteFiles) != 1 || doc.WriteFiles[0].Path != v1.JoinTokenPath || doc.WriteFiles[0].Permissions != "0600" ||
		doc.WriteFiles[0].Owner != "root:root" || doc.WriteFiles[0].Content != tok {
		t.Errorf("write_files = %+v, want the token at %s, 0600 root:root", doc.WriteFiles, v1.JoinTokenPath)
	}
	if len(doc.Runcmd) != 1 || len(doc.Runcmd[0]) != 3 || strings.Contains(doc.Runcmd[0][2], tok) {
		t.Errorf("runcmd = %q: carries the token or is not one [sh, -c, CMD]", doc.Runcmd)
	}
}

func TestMakeFAT16ReadByMtools(t *testing.T) {
	need(t, "mtype", "fsck.fat", "blkid")
	big := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB, multi-cluster
	files := []SeedFile{{Name: "user-data", Data: []byte("hello\n")}, {Name: "empty", Data: nil}, {Name: "big-file.bin", Data: big}}
	img, err := MakeFAT16(SeedSizeBytes, "cidata", 0, files)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "fat")
	os.WriteFile(p, img, 0o644)
	run(t, "fsck.fat", "-n", p)
	if got := run(t, "mtype", "-i", p, "::big-file.bin"); got != string(big) {
		t.Errorf("big-file.bin read back %d bytes, want %d", len(got), len(big))
	}
	if got := run(t, "mtype", "-i", p, "::user-data"); got != "hello\n" {
		t.Errorf("user-data = %q", got)
	}
	if out := run(t, "blkid", "-p", "-o", "export", p); !strings.Contains(out, "LABEL=CIDATA") || !strings.Contains(out, "TYPE=vfat") {
		t.Errorf("blkid: %s", out)
	}
	again, _ := MakeFAT16(SeedSizeBytes, "cidata", 0, files)
	if !bytes.Equal(img, again) {
		t.Error("MakeFAT16 is not deterministic")
	}
}

// FuzzReadPartTable feeds arbitrary first sectors (an old disk's leftovers
// are untrusted) to the partition-table reader and the signature wipe.
func FuzzReadPartTable(f *testing.F) {
	mbr := make([]byte, 4096)
	mbr[510], mbr[511] = 0x55, 0xAA
	mbr[446+4] = 0x83
	f.Add(mbr)
	gpt := make([]byte, 4096)
	copy(gpt[512:], "EFI PART")
	f.Add(gpt)
	f.Fuzz(func(t *testing.T, head []byte) {
		if len(head) > 64<<10 {
			return
		}
		disk := make([]byte, 4<<20)
		copy(disk, head)
		dev := &memDev{b: disk}
		tbl, err := readPartTable(dev, int64(len(disk)))
		if err != nil {
			return
		}
		for _, p := range tbl.parts {
			if tbl.kind == "gpt" && (p[0] < 0 || p[1] < p[0]) {
				t.Logf("odd bounds %v", p)
			}
		}
		if err := WipeSignatures(dev, int64(len(disk)), 1<<20); err != nil {
			t.Fatalf("WipeSignatures: %v", err)
		}
	})
}

// memDev is an in-memory BlockDevice.
type memDev struct{ b []byte }

func (m *memDev) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= int64(len(m.b)) {
		return 0, io.EOF
	}
	n := copy(p, m.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *memDev) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(m.b)) {
		return 0, errors.New("write beyond end")
	}
	return copy(m.b[off:], p), nil
}

func (m *memDev) Sync() error { return nil }

func FuzzRenderSeed(f *testing.F) {
	f.Add("i-1", "host", testSeed.SSHKeys[0], "echo hi", "")
	f.Fuzz(func(t *testing.T, id, host, key, join, nc string) {
		files, err := RenderSeed(v1.Seed{InstanceID: id, Hostname: host, SSHKeys: []string{key}, JoinCommand: join, NetworkConfig: nc})
		if err != nil {
			return
		}
		var cfg struct {
			Users []struct {
				Keys []string `json:"ssh_authorized_keys"`
			} `json:"users"`
			SSHPwauth bool       `json:"ssh_pwauth"`
			Runcmd    [][]string `json:"runcmd"`
		}
		if err := yaml.Unmarshal(files[2].Data, &cfg); err != nil {
			t.Fatalf("user-data does not parse: %v\n%s", err, files[2].Data)
		}
		if cfg.SSHPwauth || len(cfg.Users) != 1 || len(cfg.Users[0].Keys) != 1 || cfg.Users[0].Keys[0] != key {
			t.Fatalf("input changed the user-data structure: %+v", cfg)
		}
		if join != "" && cfg.Runcmd[0][2] != join {
			t.Fatalf("join command altered")
		}
	})
}

// BenchmarkWriteImage measures the verified write of a 64 MiB image to a
// file on the host in both modes, next to an unverified streaming copy that
// hashes as it writes (what "sha256sum | dd" does). SetBytes makes go test
// print MB/s. Run: go test -run '^$' -bench WriteImage ./ramdisk/agent
func BenchmarkWriteImage(b *testing.B) {
	img := make([]byte, 64<<20)
	rand.NewChaCha8([32]byte{5}).Read(img)
	want := sum(img)
	p := filepath.Join(b.TempDir(), "disk")
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	f.Truncate(256 << 20)
	for _, mode := range []struct {
		name  string
		limit int64
	}{{"memory", 0}, {"two-pass", -1}} {
		b.Run(mode.name, func(b *testing.B) {
			b.SetBytes(int64(len(img)))
			for i := 0; i < b.N; i++ {
				if _, err := WriteImage(context.Background(), f, 256<<20, WriteConfig{Open: FileOpener(img), SizeBytes: int64(len(img)), SHA256: want, MemoryLimit: mode.limit}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("unverified-stream", func(b *testing.B) {
		b.SetBytes(int64(len(img)))
		for i := 0; i < b.N; i++ {
			h := sha256.New()
			w := io.NewOffsetWriter(f, 0)
			buf := make([]byte, 4<<20)
			if _, err := io.CopyBuffer(io.MultiWriter(w, h), bytes.NewReader(img), buf); err != nil {
				b.Fatal(err)
			}
			f.Sync()
			if hex.EncodeToString(h.Sum(nil)) != want {
				b.Fatal("hash")
			}
		}
	})
}

// TestWipeSignatures checks the wipe on its own (in a deploy the image and
// seed overwrite some of the same bytes, which would hide a gap): after it,
// the backup GPT header is gone, the old cidata filesystem is gone, and the
// bytes below keepBelow are untouched.
func TestWipeSignatures(t *testing.T) {
	need(t, "sgdisk", "blkid")
	const size = 64 << 20
	f, before := newTarget(t, size)
	if !bytes.Contains(before[size-512:], []byte("EFI PART")) {
		t.Fatal("test layout has no backup GPT header")
	}
	if err := WipeSignatures(f, size, 4<<20); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(f.Name())
	if !bytes.Equal(before[:4<<20], after[:4<<20]) {
		t.Error("bytes below keepBelow changed")
	}
	if bytes.Contains(after[size-(1<<20):], []byte("EFI PART")) {
		t.Error("backup GPT header survived")
	}
	// old partition starts, from the layout before the wipe
	p := filepath.Join(t.TempDir(), "before")
	os.WriteFile(p, before, 0o644)
	var tbl struct {
		PartitionTable struct {
			Partitions []struct {
				Start int64 `json:"start"`
			} `json:"partitions"`
		} `json:"partitiontable"`
	}
	if err := json.Unmarshal([]byte(run(t, "sfdisk", "--json", p)), &tbl); err != nil {
		t.Fatal(err)
	}
	probe := func(file string, off int64) string {
		out, _ := exec.Command("blkid", "-p", "-O", strconv.FormatInt(off, 10), "-o", "export", file).Output()
		return string(out)
	}
	sawSeed := false
	for _, part := range tbl.PartitionTable.Partitions {
		off := part.Start * 512
		if strings.Contains(probe(p, off), "LABEL=CIDATA") {
			sawSeed = true
		}
		if off >= 4<<20 && strings.Contains(probe(f.Name(), off), "TYPE=") {
			t.Errorf("signature at %d survived: %s", off, probe(f.Name(), off))
		}
	}
	if !sawSeed {
		t.Error("probe does not see the old seed before the wipe; the test proves nothing")
	}
}

// TestWriteImageLayoutRefusesNonGPTBeforeWrite: with a storage layout, an
// image whose partition table is not GPT is refused in the verification
// pass, from its first chunk, with nothing written (before, the refusal
// came from the partition step after the whole image was written); a GPT
// image passes the same check.
func TestWriteImageLayoutRefusesNonGPTBeforeWrite(t *testing.T) {
	need(t, "sgdisk")
	gptImg := makeGPTImage(t, 8<<20)
	mbrImg := make([]byte, 8<<20)
	mbrImg[510], mbrImg[511] = 0x55, 0xAA
	mbrImg[3<<20] = 1
	lay := &layoutRun{rootID: "md/machina-root"}
	for _, mode := range []struct {
		name  string
		limit int64
	}{{"memory", 0}, {"two-pass", -1}} {
		for _, c := range []struct {
			name, kind string
			img        []byte
		}{{"mbr", "mbr", mbrImg}, {"none", "", make([]byte, 8<<20)}, {"gpt", "gpt", gptImg}} {
			t.Run(mode.name+"/"+c.name, func(t *testing.T) {
				if kind, err := imageHeadTable(c.img[:1<<20], int64(len(c.img))); err != nil || kind != c.kind {
					t.Fatalf("imageHeadTable = %q, %v; want %q", kind, err, c.kind)
				}
				f, before := newTarget(t, 64<<20)
				_, err := WriteImage(context.Background(), f, 64<<20, WriteConfig{
					Open: FileOpener(c.img), SizeBytes: int64(len(c.img)), SHA256: sum(c.img), MemoryLimit: mode.limit, ChunkBytes: 1 << 20,
					CheckHead: lay.checkImageHead(int64(len(c.img))),
				})
				after, _ := os.ReadFile(f.Name())
				if c.kind == "gpt" {
					if err != nil {
						t.Fatalf("GPT image refused: %v", err)
					}
					return
				}
				if !errors.Is(err, ErrBadPartitionTable) || !strings.Contains(err.Error(), "needs a GPT image") {
					t.Fatalf("WriteImage err = %v, want ErrBadPartitionTable (needs a GPT image)", err)
				}
				if !bytes.Equal(before, after) {
					t.Fatal("target changed although the image was refused before the write")
				}
			})
		}
	}
	if (*layoutRun)(nil).checkImageHead(1) != nil {
		t.Fatal("no layout: CheckHead set")
	}
}

// TestMakeFAT16VolumeSerial: each seed's filesystem has its own volume
// serial (blkid's UUID), derived from its files, so it is reproducible but
// never the fixed 4D41-4348 an image's ESP may also carry (the VM lab
// image's ESP does: GRUB's search --fs-uuid found the seed instead).
func TestMakeFAT16VolumeSerial(t *testing.T) {
	need(t, "blkid")
	uuid := func(instance string) string {
		img, err := MakeFAT16(SeedSizeBytes, "cidata", 0, []SeedFile{{Name: "meta-data", Data: []byte("instance-id: " + instance + "\n")}})
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), "fat")
		if err := os.WriteFile(p, img, 0o644); err != nil {
			t.Fatal(err)
		}
		out := run(t, "blkid", "-p", "-o", "export", p)
		for _, ln := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(ln, "UUID="); ok {
				return v
			}
		}
		t.Fatalf("blkid shows no UUID: %s", out)
		return ""
	}
	a, b := uuid("vm-trust-1"), uuid("vm-trust-2")
	if a == b {
		t.Errorf("two seeds share the volume serial %s", a)
	}
	for _, u := range []string{a, b} {
		if u == "4D41-4348" {
			t.Errorf("seed volume serial is the fixed %s", u)
		}
	}
	if again := uuid("vm-trust-1"); again != a {
		t.Errorf("volume serial %s, then %s for the same seed", a, again)
	}
}
