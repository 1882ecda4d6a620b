package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/peertest"
)

// erasePattern fills the disks of the erase tests: after an erase no copy
// of it may be left anywhere on the device.
var erasePattern = []byte("TENANT-DATA-7f3a9c-")

// patternDisk writes a file of size bytes filled with erasePattern.
func patternDisk(t *testing.T, size int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(p, bytes.Repeat(erasePattern, size/len(erasePattern)+1)[:size], 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// loopOf attaches file as a loop device and returns its node.
func loopOf(t *testing.T, file string) string {
	t.Helper()
	peertest.Root(t, "loop devices")
	need(t, "losetup")
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	return loop
}

// progressLog records Progress calls.
type progressLog struct {
	mu    sync.Mutex
	calls [][3]int64
	steps map[string]bool
}

func (p *progressLog) set(step string, done, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.steps == nil {
		p.steps = map[string]bool{}
	}
	p.steps[step] = true
	p.calls = append(p.calls, [3]int64{done, total})
}

// eraseOnLoop erases a 64 MiB loop device full of the pattern with method
// and checks the outcome, the progress reports and that the backing file
// holds no byte of the pattern any more (all zeros).
func eraseOnLoop(t *testing.T, method string, wantMethods ...string) {
	const size = 64 << 20
	file := patternDisk(t, size)
	loop := loopOf(t, file)
	dev, n, err := openTarget(loop)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	if n != size {
		t.Fatalf("loop size %d", n)
	}
	var pl progressLog
	out, err := EraseDisk(context.Background(), dev, n, EraseConfig{Method: method, Disk: v1.Disk{Name: filepath.Base(loop)},
		ChunkBytes: 16 << 20, Progress: pl.set, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("EraseDisk %s on %s: %v", method, loop, err)
	}
	t.Logf("%s on %s: method %s, %d bytes in %s, %d samples verified", method, loop, out.Method, out.Bytes, out.Duration, out.VerifiedSamples)
	if !strings.Contains(strings.Join(wantMethods, ","), out.Method) || out.Bytes != size || out.VerifiedSamples != 1024 || out.Duration <= 0 {
		t.Errorf("outcome %+v: want method one of %v, %d bytes, 1024 samples", out, wantMethods, size)
	}
	if !pl.steps[v1.StepErase] || len(pl.steps) != 1 {
		t.Errorf("progress steps %v, want only %s", pl.steps, v1.StepErase)
	}
	// 0, then 16, 32, 48 and 64 MiB of 64.
	if len(pl.calls) != 5 || pl.calls[0] != [3]int64{0, size} || pl.calls[4] != [3]int64{size, size} {
		t.Errorf("progress %v, want 0 to %d in 5 reports", pl.calls, size)
	}
	dev.Close()
	exec.Command("losetup", "-d", loop).Run()
	after, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.IndexFunc(after, func(r rune) bool { return r != 0 }); i >= 0 {
		t.Fatalf("byte %d is %#x after the %s erase, want every byte zero", i, after[i], method)
	}
	if bytes.Contains(after, erasePattern[:4]) {
		t.Fatal("the pattern survived")
	}
}

// TestEraseZeroOnLoopDevice: zero overwrites every byte of a real block
// device (BLKZEROOUT) and the O_DIRECT read-back of 1024 samples passes.
func TestEraseZeroOnLoopDevice(t *testing.T) { eraseOnLoop(t, v1.EraseZero, "zero") }

// TestEraseDiscardOnLoopDevice: discard on a loop device (which takes
// discard and punches holes in its backing file, so discarded blocks read
// zero) leaves nothing of the old data.
func TestEraseDiscardOnLoopDevice(t *testing.T) {
	eraseOnLoop(t, v1.EraseDiscard, "discard", "secure-discard")
}

// TestEraseUnsupportedWritesNothing: a device whose sysfs says it takes
// no discard, and a secure erase of a disk that is neither NVMe nor ATA,
// are refused with an EraseUnsupportedError naming the disk and why,
// before anything is written: no weaker method runs.
func TestEraseUnsupportedWritesNothing(t *testing.T) {
	const size = 8 << 20
	file := patternDisk(t, size)
	sys := t.TempDir()
	if err := os.MkdirAll(filepath.Join(sys, "queue"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sys, "queue/discard_max_bytes"), []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method string
		disk   v1.Disk
		want   string
	}{
		{v1.EraseDiscard, v1.Disk{Name: "sdb", Transport: "sata"}, "erase discard unsupported on sdb: queue/discard_max_bytes is 0"},
		{v1.EraseSecure, v1.Disk{Name: "vda", Transport: "virtio"}, "erase secure unsupported on vda: not an NVMe namespace or an ATA drive (transport virtio)"},
		{v1.EraseSecure, v1.Disk{Name: "sdc", Transport: "scsi"}, "erase secure unsupported on sdc: not an NVMe namespace or an ATA drive (transport scsi)"},
	} {
		f, err := os.OpenFile(file, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = EraseDisk(context.Background(), f, size, EraseConfig{Method: tc.method, Disk: tc.disk, SysBlock: sys})
		f.Close()
		var ue *EraseUnsupportedError
		if !errors.As(err, &ue) || !errors.Is(err, ErrEraseUnsupported) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s on %s: %v, want EraseUnsupportedError %q", tc.method, tc.disk.Name, err, tc.want)
		}
	}
	b, _ := os.ReadFile(file)
	if !bytes.Equal(b, bytes.Repeat(erasePattern, size/len(erasePattern)+1)[:size]) {
		t.Error("a refused erase changed the disk")
	}
}

// TestCheckSamples: zero wants all-zero samples; discard and secure want
// no sample to keep the non-zero data it had (a discard on a device
// without read-zero-after-TRIM that returns the old data fails).
func TestCheckSamples(t *testing.T) {
	data := bytes.Repeat([]byte{0xab}, sampleBytes)
	other := bytes.Repeat([]byte{0x5c}, sampleBytes)
	zero := make([]byte, sampleBytes)
	offs := []int64{0, 4096, 8192}
	if n, err := checkSamples(v1.EraseZero, offs, [][]byte{data, data, zero}, [][]byte{zero, zero, zero}); err != nil || n != 3 {
		t.Errorf("zero, all zero: %d %v", n, err)
	}
	if _, err := checkSamples(v1.EraseZero, offs, [][]byte{data, data, zero}, [][]byte{zero, other, zero}); err == nil || !strings.Contains(err.Error(), "1 of 3 samples failed; the sample at byte 4096 not all zeros") {
		t.Errorf("zero, one not zero: %v", err)
	}
	if n, err := checkSamples(v1.EraseSecure, offs, [][]byte{data, data, zero}, [][]byte{other, zero, zero}); err != nil || n != 3 {
		t.Errorf("secure, changed: %d %v", n, err)
	}
	if _, err := checkSamples(v1.EraseDiscard, offs, [][]byte{data, data, zero}, [][]byte{zero, data, zero}); err == nil || !strings.Contains(err.Error(), "at byte 4096 still holds its data") {
		t.Errorf("discard, stale: %v", err)
	}
}

// TestSampleOffsets: the first and last block, one per stretch between,
// aligned, ascending, within the device; fewer on a tiny device.
func TestSampleOffsets(t *testing.T) {
	const size = 1<<30 + 512
	offs := sampleOffsets(size, 0)
	if len(offs) != 1024 || offs[0] != 0 || offs[1023] != (size/4096-1)*4096 {
		t.Fatalf("%d samples, first %d last %d", len(offs), offs[0], offs[len(offs)-1])
	}
	for i, o := range offs {
		if o%4096 != 0 || o+4096 > size || (i > 0 && o <= offs[i-1]) {
			t.Fatalf("sample %d at %d", i, o)
		}
	}
	if got := sampleOffsets(3*4096, 0); len(got) != 3 {
		t.Errorf("3-block device: %v", got)
	}
}

// fakeNVMe answers Identify with ctrl and ns and records the commands.
type fakeNVMe struct {
	ctrl, ns     []byte
	formatStatus uint32
	sent         []nvmeAdminCmd
}

func (f *fakeNVMe) admin(c nvmeAdminCmd, data []byte) (uint32, error) {
	f.sent = append(f.sent, c)
	switch {
	case c.Opcode == nvmeOpIdentify && c.CDW10 == nvmeCNSCtrl:
		copy(data, f.ctrl)
	case c.Opcode == nvmeOpIdentify && c.CDW10 == nvmeCNSNS:
		copy(data, f.ns)
	case c.Opcode == nvmeOpFormatNVM:
		return f.formatStatus, nil
	}
	return 0, nil
}

func nvmeIdentify(oacs uint16, fna byte, sanicap uint32, flbas, dps byte) (ctrl, ns []byte) {
	ctrl, ns = make([]byte, 4096), make([]byte, 4096)
	binary.LittleEndian.PutUint16(ctrl[256:], oacs)
	binary.LittleEndian.PutUint32(ctrl[328:], sanicap)
	ctrl[524] = fna
	ns[26], ns[29] = flbas, dps
	return ctrl, ns
}

// TestNVMeFormatCommand: the Format NVM built from Identify keeps the
// namespace's LBA format (FLBAS, with the upper bits of NVMe 2.0), MSET
// and protection (DPS) and asks for a user data erase (SES 001b); FNA
// bits 0/1 make it name all namespaces; a controller without Format NVM
// (OACS bit 1) is refused before any format is sent; a failed format
// names its status. The ioctl structures have the kernel's sizes.
func TestNVMeFormatCommand(t *testing.T) {
	if s := unsafe.Sizeof(nvmeAdminCmd{}); s != 72 {
		t.Fatalf("nvme_passthru_cmd is %d bytes, want 72", s)
	}
	if s := unsafe.Sizeof(sgIOHdr{}); s != 88 {
		t.Fatalf("sg_io_hdr is %d bytes, want 88", s)
	}
	ctrl, ns := nvmeIdentify(1<<1|1<<3, 0, 0x3, 0x11, 0x09) // LBAF 1, MSET 1; PI type 1, PIL 1
	dev := &fakeNVMe{ctrl: ctrl, ns: ns}
	e, err := prepareNVMe(dev, "nvme0n1", 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	method, err := e.erase(context.Background())
	if err != nil || method != "nvme-format-user-data-erase" {
		t.Fatalf("erase: %s %v", method, err)
	}
	f := dev.sent[len(dev.sent)-1]
	if f.Opcode != 0x80 || f.NSID != 1 || f.CDW10 != 0x331 || f.TimeoutMS != 3600000 || f.DataLen != 0 {
		t.Errorf("format = %+v, want opcode 0x80 nsid 1 cdw10 0x331 (LBAF 1, MSET, PI 1, PIL, SES 1) timeout 1h", f)
	}
	// LBAF 17 (FLBAS bits 6:5 = 01b, 3:0 = 0001b), secure erase for all namespaces.
	ctrl, ns = nvmeIdentify(1<<1, 1<<1, 0, 0x21, 0)
	dev = &fakeNVMe{ctrl: ctrl, ns: ns}
	if e, err = prepareNVMe(dev, "nvme1n2", 2, 0); err != nil {
		t.Fatal(err)
	}
	if e.cmd.NSID != 0xFFFFFFFF || e.cmd.CDW10 != 1|1<<9|1<<12 || e.cmd.TimeoutMS != uint32(defaultSecureTimeout.Milliseconds()) {
		t.Errorf("format = %+v, want all namespaces, cdw10 %#x", e.cmd, 1|1<<9|1<<12)
	}
	// No Format NVM: refused, nothing but Identify sent.
	ctrl, ns = nvmeIdentify(0, 0, 0x7, 0, 0)
	dev = &fakeNVMe{ctrl: ctrl, ns: ns}
	_, err = prepareNVMe(dev, "nvme2n1", 1, 0)
	if !errors.Is(err, ErrEraseUnsupported) || !strings.Contains(err.Error(), "nvme2n1: the NVMe controller does not support Format NVM (Identify Controller OACS 0x0000, bit 1 clear; SANICAP 0x00000007)") {
		t.Errorf("no format: %v", err)
	}
	for _, c := range dev.sent {
		if c.Opcode == nvmeOpFormatNVM {
			t.Error("a format was sent to a controller without Format NVM")
		}
	}
	// The drive refuses the format (Invalid Field in Command).
	ctrl, ns = nvmeIdentify(1<<1, 0, 0, 0, 0)
	dev = &fakeNVMe{ctrl: ctrl, ns: ns, formatStatus: 0x4002}
	e, _ = prepareNVMe(dev, "nvme3n1", 1, 0)
	if _, err := e.erase(context.Background()); err == nil || !strings.Contains(err.Error(), "format nvm (user data erase) nvme3n1: status 0x4002 (SCT 0, SC 0x02)") {
		t.Errorf("refused format: %v", err)
	}
}

// fakeATA answers IDENTIFY DEVICE with id and records the commands.
type fakeATA struct {
	id       []byte
	failUnit bool
	cdbs     [][16]byte
	data     [][]byte
}

func (f *fakeATA) pass(cdb [16]byte, dir int32, data []byte, _ time.Duration) error {
	f.cdbs = append(f.cdbs, cdb)
	f.data = append(f.data, bytes.Clone(data))
	switch cdb[14] {
	case ataIdentify:
		copy(data, f.id)
	case ataSecEraseUnit:
		if f.failUnit {
			return errors.New("ATA command 0xf4 failed")
		}
	}
	return nil
}

func ataIdentifyData(sec, eraseTime uint16) []byte {
	id := make([]byte, 512)
	binary.LittleEndian.PutUint16(id[82*2:], 1<<1)
	binary.LittleEndian.PutUint16(id[89*2:], eraseTime)
	binary.LittleEndian.PutUint16(id[90*2:], eraseTime)
	binary.LittleEndian.PutUint16(id[128*2:], sec)
	return id
}

// TestATASecurityErase: a drive with security supported, not frozen, not
// locked gets SET PASSWORD, ERASE PREPARE and ERASE UNIT (enhanced where
// word 128 bit 5 says so) over ATA PASS-THROUGH (16) with the same
// one-time password; a frozen, locked or unsupported drive is refused
// after IDENTIFY alone; a failed ERASE UNIT disables the password again.
func TestATASecurityErase(t *testing.T) {
	dev := &fakeATA{id: ataIdentifyData(1|1<<5, 0x8000|300)} // enhanced, 600 minutes
	e, err := prepareATA(dev, "sda", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if e.timeout != 20*time.Hour {
		t.Errorf("timeout %s, want twice the drive's 600-minute estimate", e.timeout)
	}
	method, err := e.erase(context.Background())
	if err != nil || method != "ata-enhanced-security-erase" {
		t.Fatalf("erase: %s %v", method, err)
	}
	var cmds []byte
	for _, c := range dev.cdbs {
		cmds = append(cmds, c[14])
	}
	if !bytes.Equal(cmds, []byte{0xEC, 0xF1, 0xF3, 0xF4}) {
		t.Fatalf("commands % x, want ec f1 f3 f4", cmds)
	}
	wantCDB := map[byte][3]byte{0xEC: {0x85, 4 << 1, 0x0E}, 0xF1: {0x85, 5 << 1, 0x06}, 0xF3: {0x85, 3 << 1, 0}, 0xF4: {0x85, 5 << 1, 0x06}}
	for _, c := range dev.cdbs {
		if w := wantCDB[c[14]]; c[0] != w[0] || c[1] != w[1] || c[2] != w[2] {
			t.Errorf("command %#x CDB % x: want opcode/protocol/flags % x", c[14], c[:3], w)
		}
	}
	setPw, unit := dev.data[1], dev.data[3]
	if len(setPw) != 512 || !bytes.Equal(setPw[2:34], unit[2:34]) || bytes.Equal(setPw[2:34], make([]byte, 32)) {
		t.Error("ERASE UNIT does not carry the password SET PASSWORD set (or it is empty)")
	}
	if setPw[0] != 0 || unit[0] != 1<<1 {
		t.Errorf("control words %#x %#x, want user password and enhanced erase", setPw[0], unit[0])
	}
	for _, tc := range []struct {
		sec  uint16
		want string
	}{
		{0, "does not support the ATA Security feature set"},
		{1 | 1<<3, "ATA security is frozen"},
		{1 | 1<<1 | 1<<2, "locked with a password Machina did not set"},
		{1 | 1<<1, "a user password Machina did not set is enabled"},
	} {
		dev := &fakeATA{id: ataIdentifyData(tc.sec, 10)}
		_, err := prepareATA(dev, "sdb", 0)
		if !errors.Is(err, ErrEraseUnsupported) || !strings.Contains(err.Error(), "erase secure unsupported on sdb: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("word 128 %#x: %v, want %q", tc.sec, err, tc.want)
		}
		if len(dev.cdbs) != 1 {
			t.Errorf("word 128 %#x: %d commands sent, want IDENTIFY only", tc.sec, len(dev.cdbs))
		}
	}
	dev = &fakeATA{id: ataIdentifyData(1, 10), failUnit: true}
	e, _ = prepareATA(dev, "sdc", 0)
	if _, err := e.erase(context.Background()); err == nil || !strings.Contains(err.Error(), "ata security erase unit sdc") {
		t.Errorf("failed unit: %v", err)
	}
	if last := dev.cdbs[len(dev.cdbs)-1]; last[14] != 0xF6 || !bytes.Equal(dev.data[len(dev.data)-1][2:34], dev.data[1][2:34]) {
		t.Error("after a failed ERASE UNIT the agent's password was not disabled")
	}
}

// wipeController answers a wipe plan and records the progress reports and
// the outcome the agent posts.
type wipeController struct {
	plan     v1.WipePlan
	mu       sync.Mutex
	progress []v1.Progress
	result   *v1.WipeResult
}

func (c *wipeController) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	auth := r.Header.Get("Authorization")
	switch r.URL.Path {
	case v1.PathAgentWipe:
		json.NewEncoder(w).Encode(c.plan)
		return
	case v1.PathAgentProgress:
		var p v1.Progress
		if auth != "Bearer "+c.plan.ProgressToken || json.NewDecoder(r.Body).Decode(&p) != nil {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		c.progress = append(c.progress, p)
	case v1.PathAgentWiped:
		var res v1.WipeResult
		if auth != "Bearer "+c.plan.DoneToken || json.NewDecoder(r.Body).Decode(&res) != nil {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		c.result = &res
	default:
		w.WriteHeader(http.StatusNotFound)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// TestRunnerWipeErase runs the release wipe's Runner against a controller
// stub on the qemu machine's tree (one virtio disk, vda): erase zero
// overwrites the disk and posts its outcome (method, bytes, duration,
// samples); erase secure is refused for the virtio disk, posted as
// Unsupported naming vda and why, with the disk untouched.
func TestRunnerWipeErase(t *testing.T) {
	root, dev := qemuMachine(t)
	vda := filepath.Join(dev, "vda")
	run := func(t *testing.T, erase string) *v1.WipeResult {
		if err := os.WriteFile(vda, bytes.Repeat(erasePattern, (8<<20)/len(erasePattern)+1)[:8<<20], 0o644); err != nil {
			t.Fatal(err)
		}
		ctl := &wipeController{plan: v1.WipePlan{DoneToken: "tok-done", Erase: erase, ProgressToken: "tok-progress", ProgressEvery: time.Millisecond}}
		srv := httptest.NewServer(ctl)
		defer srv.Close()
		r := &Runner{Client: &v1.AgentClient{BaseURL: srv.URL}, Token: "tok-wipe", BootMAC: "52:54:00:12:34:56", Root: root, DevDir: dev, Logger: testLogger(t)}
		_, err := r.Wipe(context.Background())
		ctl.mu.Lock()
		defer ctl.mu.Unlock()
		if ctl.result == nil {
			t.Fatalf("no outcome posted (Wipe: %v)", err)
		}
		for _, p := range ctl.progress {
			if p.Step != v1.StepErase || p.BytesTotal != 8<<20 {
				t.Errorf("progress %+v, want erase of 8 MiB", p)
			}
		}
		return ctl.result
	}
	t.Run("zero", func(t *testing.T) {
		res := run(t, v1.EraseZero)
		if !res.OK || len(res.Erased) != 1 {
			t.Fatalf("outcome %+v", res)
		}
		e := res.Erased[0]
		if e.Name != "vda" || e.Disk == "" || e.Method != "zero" || e.Bytes != 8<<20 || e.VerifiedSamples != 1024 || e.Duration <= 0 {
			t.Errorf("erased %+v", e)
		}
		b, _ := os.ReadFile(vda)
		if len(b) != 8<<20 || len(bytes.Trim(b, "\x00")) != 0 {
			t.Error("vda still holds data after erase zero")
		}
	})
	t.Run("secure refused", func(t *testing.T) {
		res := run(t, v1.EraseSecure)
		if res.OK || !res.Unsupported || len(res.Erased) != 0 || !strings.Contains(res.Reason, "erase secure unsupported on vda: not an NVMe namespace or an ATA drive (transport virtio)") {
			t.Errorf("outcome %+v", res)
		}
		b, _ := os.ReadFile(vda)
		if !bytes.HasPrefix(b, erasePattern) {
			t.Error("a refused erase wrote to vda")
		}
	})
}

// TestRunnerWipeChecksEveryDiskFirst: on a machine with two NVMe SSDs that
// take discard and a SATA HDD that does not, erase: discard fails the wipe
// as Unsupported naming sda before any disk is touched (the SSDs keep
// their data), rather than after erasing the others.
func TestRunnerWipeChecksEveryDiskFirst(t *testing.T) {
	root := machineRoot(t, "supermicro-nvme-sata")
	dev := t.TempDir()
	disks := []string{"nvme0n1", "nvme1n1", "sda"}
	for _, d := range disks {
		if err := os.WriteFile(filepath.Join(dev, d), bytes.Repeat(erasePattern, (1<<20)/len(erasePattern)+1)[:1<<20], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range disks[:2] {
		if err := os.WriteFile(filepath.Join(root, "sys/block", d, "queue/discard_max_bytes"), []byte("2199023255040\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctl := &wipeController{plan: v1.WipePlan{DoneToken: "tok-done", Erase: v1.EraseDiscard}}
	srv := httptest.NewServer(ctl)
	defer srv.Close()
	r := &Runner{Client: &v1.AgentClient{BaseURL: srv.URL}, Token: "tok-wipe", Root: root, DevDir: dev, Logger: testLogger(t)}
	if _, err := r.Wipe(context.Background()); !errors.Is(err, ErrEraseUnsupported) {
		t.Fatalf("Wipe = %v, want ErrEraseUnsupported", err)
	}
	res := ctl.result
	if res == nil || res.OK || !res.Unsupported || len(res.Erased) != 0 || !strings.Contains(res.Reason, "sda (pci-0000:00:17.0-ata-1): erase discard unsupported on sda: queue/discard_max_bytes is 0") {
		t.Fatalf("outcome %+v", res)
	}
	for _, d := range disks {
		b, _ := os.ReadFile(filepath.Join(dev, d))
		if !bytes.HasPrefix(b, erasePattern) {
			t.Errorf("%s was written to before every disk was checked", d)
		}
	}
}

// blockingATA is fakeATA whose ERASE UNIT returns only once release is
// closed (or a minute has passed, failing the test).
type blockingATA struct {
	fakeATA
	release chan struct{}
}

func (b *blockingATA) pass(cdb [16]byte, dir int32, data []byte, timeout time.Duration) error {
	if cdb[14] == ataSecEraseUnit {
		select {
		case <-b.release:
		case <-time.After(time.Minute):
			return errors.New("test: erase unit never released")
		}
	}
	return b.fakeATA.pass(cdb, dir, data, timeout)
}

// TestSecureEraseReportsProgress: while a drive's own erase runs (one
// command that reports nothing), the progress moves forward by the time
// elapsed over the drive's estimate, stays below the size until the
// command returns, and reaches it after; without it the controller would
// take a long ATA erase for a silent machine and time the wipe out.
func TestSecureEraseReportsProgress(t *testing.T) {
	old := secureTick
	secureTick = time.Millisecond
	t.Cleanup(func() { secureTick = old })
	const size = 1 << 40
	dev := &blockingATA{release: make(chan struct{})}
	e := &ataErase{dev: dev, name: "sda", timeout: time.Hour, estimate: 2 * time.Minute}
	var mu sync.Mutex
	var seen []int64
	released := false
	progress := func(done int64) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, done)
		if done > 0 && done < size && !released {
			released = true
			close(dev.release)
		}
	}
	method, err := secureWithProgress(context.Background(), e, size, progress)
	if err != nil || method != "ata-security-erase" {
		t.Fatalf("erase: %s %v", method, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !released {
		t.Fatal("no progress between 0 and the size while the erase ran")
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] < seen[i-1] {
			t.Fatalf("progress went back: %v", seen)
		}
	}
	if seen[len(seen)-1] != size {
		t.Fatalf("last progress %d, want %d", seen[len(seen)-1], int64(size))
	}
	for _, d := range seen[:len(seen)-1] {
		if d >= size {
			t.Fatalf("progress reached the size before the erase returned: %v", seen)
		}
	}
}

// TestRunnerWipeErasePerDisk: a wipe plan with methods per disk
// (WipePlan.EraseDisks, a profile's eraseOverrides) erases each disk with
// its own method, found by by-path, WWN or serial, and posts each disk's
// outcome; a disk that cannot do its method fails the wipe as Unsupported
// naming that disk before any disk is written (no fallback to the
// default); a disk the plan does not list fails it as unplanned, also
// before any write.
func TestRunnerWipeErasePerDisk(t *testing.T) {
	root := machineRoot(t, "supermicro-nvme-sata")
	dev := t.TempDir()
	disks := []string{"nvme0n1", "nvme1n1", "sda"}
	fill := func(t *testing.T) {
		for _, d := range disks {
			if err := os.WriteFile(filepath.Join(dev, d), bytes.Repeat(erasePattern, (4<<20)/len(erasePattern)+1)[:4<<20], 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	nvme0 := v1.StorageDiskRef{Name: "nvme0n1", ByPath: "pci-0000:3b:00.0-nvme-1"}
	nvme1 := v1.StorageDiskRef{Name: "nvme1n1", WWN: "0025388B91ABCDEF"}
	sda := v1.StorageDiskRef{Name: "sda", Serial: "zc1abcde"}
	run := func(t *testing.T, plan v1.WipePlan) (*v1.WipeResult, error) {
		fill(t)
		plan.DoneToken = "tok-done"
		ctl := &wipeController{plan: plan}
		srv := httptest.NewServer(ctl)
		defer srv.Close()
		r := &Runner{Client: &v1.AgentClient{BaseURL: srv.URL}, Token: "tok-wipe", Root: root, DevDir: dev, Logger: testLogger(t)}
		_, err := r.Wipe(context.Background())
		ctl.mu.Lock()
		defer ctl.mu.Unlock()
		if ctl.result == nil {
			t.Fatalf("no outcome posted (Wipe: %v)", err)
		}
		return ctl.result, err
	}
	untouched := func(t *testing.T) {
		for _, d := range disks {
			b, _ := os.ReadFile(filepath.Join(dev, d))
			if !bytes.HasPrefix(b, erasePattern) {
				t.Errorf("%s was written to", d)
			}
		}
	}
	t.Run("each disk its method", func(t *testing.T) {
		res, err := run(t, v1.WipePlan{Erase: v1.EraseMetadata, EraseDisks: []v1.EraseDisk{
			{Disk: sda, Method: v1.EraseZero}, {Disk: nvme1, Method: v1.EraseMetadata}, {Disk: nvme0, Method: v1.EraseZero}}})
		if err != nil || !res.OK || len(res.Erased) != 3 {
			t.Fatalf("Wipe = %v, outcome %+v", err, res)
		}
		var got []string
		for _, e := range res.Erased {
			got = append(got, fmt.Sprintf("%s %s %s %d", e.Name, e.Disk, e.Method, e.VerifiedSamples))
		}
		want := "nvme0n1 pci-0000:3b:00.0-nvme-1 zero 1024, nvme1n1 pci-0000:3c:00.0-nvme-1 metadata 0, sda pci-0000:00:17.0-ata-1 zero 1024"
		if g := strings.Join(got, ", "); g != want {
			t.Errorf("erased %q, want %q", g, want)
		}
		for d, zero := range map[string]bool{"nvme0n1": true, "nvme1n1": false, "sda": true} {
			b, _ := os.ReadFile(filepath.Join(dev, d))
			if allZero := len(bytes.Trim(b, "\x00")) == 0; allZero != zero {
				t.Errorf("%s all zeros = %v, want %v", d, allZero, zero)
			}
		}
		// metadata clears the first MiB only: the rest keeps its data.
		if b, _ := os.ReadFile(filepath.Join(dev, "nvme1n1")); !bytes.Contains(b[1<<20:], erasePattern) {
			t.Error("the metadata wipe of nvme1n1 erased more than its metadata")
		}
	})
	t.Run("unsupported names the disk", func(t *testing.T) {
		res, err := run(t, v1.WipePlan{Erase: v1.EraseZero, EraseDisks: []v1.EraseDisk{
			{Disk: nvme0, Method: v1.EraseZero}, {Disk: nvme1, Method: v1.EraseZero}, {Disk: sda, Method: v1.EraseDiscard}}})
		if !errors.Is(err, ErrEraseUnsupported) || res.OK || !res.Unsupported || len(res.Erased) != 0 ||
			!strings.Contains(res.Reason, "sda (pci-0000:00:17.0-ata-1): erase discard unsupported on sda") {
			t.Fatalf("Wipe = %v, outcome %+v", err, res)
		}
		untouched(t)
	})
	t.Run("unlisted disk", func(t *testing.T) {
		res, err := run(t, v1.WipePlan{Erase: v1.EraseZero, EraseDisks: []v1.EraseDisk{
			{Disk: nvme0, Method: v1.EraseZero}, {Disk: sda, Method: v1.EraseZero}}})
		if !errors.Is(err, ErrEraseUnplanned) || res.OK || res.Unsupported || !strings.Contains(res.Reason, "nvme1n1 (pci-0000:3c:00.0-nvme-1): disk not in the wipe plan's per-disk erase methods") {
			t.Fatalf("Wipe = %v, outcome %+v", err, res)
		}
		untouched(t)
	})
}
