package vmtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/ipxe"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/macaddr"
	"github.com/machina-metal/machina/ramdisk/agent/agenttest"
)

// fixedTokens issues one known token, so that the reference controller
// (agenttest, which takes its token up front) accepts what the real script
// handler handed out.
type fixedTokens struct{ tok string }

func (f fixedTokens) Issue(context.Context, net.HardwareAddr, string, time.Duration) (string, error) {
	return f.tok, nil
}
func (fixedTokens) Consume(context.Context, net.HardwareAddr, string, string) error {
	return boot.ErrTokenInvalid
}

// buildARM64 runs what `make ramdisk ARCH=arm64` and the GRUB build run,
// into folders of the test, reusing the repository's package cache
// (out/ramdisk/cache, which `make test`'s prep step fills), so the test
// writes nothing outside its temporary folders.
func buildARM64(t testing.TB) (ramdiskDir, grubImage string) {
	t.Helper()
	root := repoRoot(t)
	tmp := t.TempDir()
	cache := filepath.Join(root, "out", "ramdisk", "cache")
	for _, s := range []struct{ script, out string }{
		{"scripts/build-ramdisk.sh", filepath.Join(tmp, "ramdisk", "arm64")},
		{"scripts/build-grub-arm64.sh", filepath.Join(tmp, "boot")},
	} {
		cmd := exec.Command("sh", filepath.Join(root, s.script))
		cmd.Env = append(os.Environ(), "ARCH=arm64", "OUT="+s.out, "CACHE="+cache)
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", s.script, err, b)
		}
		t.Logf("%s", bytes.TrimSpace(b))
	}
	return filepath.Join(tmp, "ramdisk"), filepath.Join(tmp, "boot", boot.GRUBImageARM64)
}

// TestARM64NetbootCommissionInQemu network-boots an arm64 UEFI machine
// (qemu-system-aarch64, TCG, AAVMF) the way Machina boots one: the
// firmware's PXE loads grubnetaa64.efi over TFTP (qemu's built-in
// DHCP/TFTP stand in for boot/dhcp and boot/tftp here, which have their
// own arch 11 tests), GRUB sources machina-grub.cfg as boot/tftp generates
// it, then the real script handler's GET /boot/grub, fetches the arm64
// kernel and initrd over HTTP from the ramdisk folder, and the arm64 agent
// commissions and reports to the reference controller.
func TestARM64NetbootCommissionInQemu(t *testing.T) {
	needTools(t, "qemu-system-aarch64", "socat", "grub-mkimage", "apt-get", "dpkg-deb", "cpio", "depmod")
	const code, vars = "/usr/share/AAVMF/AAVMF_CODE.fd", "/usr/share/AAVMF/AAVMF_VARS.fd"
	peertest.File(t, code, "qemu-efi-aarch64")
	peertest.File(t, vars, "qemu-efi-aarch64")
	ramdisk, grub := buildARM64(t)
	const tok = "commission-tok-arm64"
	ctl := agenttest.NewController(agenttest.ControllerConfig{CommissionToken: tok})
	var look boot.MemLookup
	mac := "52:54:00:12:34:64"
	hw, err := macaddr.Parse(mac)
	if err != nil {
		t.Fatal(err)
	}
	if err := look.Set(boot.Assignment{MAC: hw.HardwareAddr(), Name: "a1-n01", Lifecycle: boot.LifecycleCommissioning, Mode: boot.ModeUEFI}); err != nil {
		t.Fatal(err)
	}
	const ctlURL = "http://10.0.2.100:8080"
	h, err := ipxe.New(ipxe.Config{Lookup: &look, Tokens: fixedTokens{tok}, ControllerURL: ctlURL,
		ARM64KernelArgs: "console=ttyAMA0 panic=-1 loglevel=4 machina.final=poweroff"})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	var scripts bytes.Buffer
	mux.Handle("GET /boot/grub", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &teeWriter{ResponseWriter: w, w: &scripts}
		h.ServeHTTP(rec, r)
	}))
	mux.Handle("GET /boot/ramdisk/", http.StripPrefix("/boot/ramdisk/", http.FileServer(http.Dir(ramdisk))))
	mux.Handle("/", ctl)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port

	tftp := t.TempDir()
	img, err := os.ReadFile(grub)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := boot.GRUBChainConfig(ctlURL + boot.GRUBScriptPath)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{boot.GRUBImageARM64: img, boot.GRUBConfigName: cfg} {
		if err := os.WriteFile(filepath.Join(tftp, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	varsCopy := filepath.Join(t.TempDir(), "vars.fd")
	b, err := os.ReadFile(vars)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(varsCopy, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// A blank disk: the commissioning disk test fails without one, and
	// AAVMF finds nothing to boot on it and falls through to PXE.
	disk := filepath.Join(t.TempDir(), "disk.raw")
	if f, err := os.Create(disk); err != nil {
		t.Fatal(err)
	} else {
		f.Truncate(1 << 30)
		f.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	args := []string{
		"-M", "virt", "-cpu", "max", "-smp", "2", "-m", "1024", "-accel", "tcg,thread=multi",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
		"-drive", "if=pflash,format=raw,readonly=on,file=" + code,
		"-drive", "if=pflash,format=raw,file=" + varsCopy,
		"-netdev", fmt.Sprintf("user,id=n0,restrict=on,tftp=%s,bootfile=%s,guestfwd=tcp:10.0.2.100:8080-cmd:socat - TCP:127.0.0.1:%d", tftp, boot.GRUBImageARM64, port),
		"-device", "virtio-net-pci,netdev=n0,mac=" + mac + ",romfile=",
		"-device", "virtio-rng-pci",
		"-drive", "file=" + disk + ",format=raw,if=none,id=d0,cache=unsafe",
		"-device", "virtio-blk-pci,drive=d0,serial=machina-arm0",
	}
	cmd := exec.CommandContext(ctx, "qemu-system-aarch64", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	err = cmd.Run()
	elapsed := time.Since(t0)
	serial := out.String()
	t.Logf("qemu-system-aarch64 (TCG) ran %.1fs", elapsed.Seconds())
	if err != nil || ctx.Err() != nil {
		t.Fatalf("qemu: %v (ctx %v)\nscripts served:\n%s\nserial:\n%s", err, ctx.Err(), scripts.String(), tail(serial, 6000))
	}
	if !strings.Contains(scripts.String(), "linux (http,10.0.2.100:8080)/boot/ramdisk/arm64/vmlinuz") {
		t.Errorf("the GRUB script served does not boot the arm64 ramdisk:\n%s", scripts.String())
	}
	reps := ctl.Reports()
	if len(reps) != 1 {
		t.Fatalf("controller got %d reports\nserial:\n%s", len(reps), tail(serial, 6000))
	}
	rep := reps[0]
	if !rep.Passed() {
		t.Errorf("commissioning failed: %+v\nserial:\n%s", rep.Tests, tail(serial, 6000))
	}
	if rep.BootMAC != mac || rep.Facts.CPU.Threads != 2 || rep.Facts.CPU.Arch != "arm64" {
		t.Errorf("report identity = mac %s threads %d arch %q, want %s, 2, arm64", rep.BootMAC, rep.Facts.CPU.Threads, rep.Facts.CPU.Arch, mac)
	}
	if strings.Contains(serial, tok) {
		t.Errorf("token leaked to the console")
	}
	t.Logf("kernel start to report: %v; qemu start to power-off %.1fs", rep.StartedToReport, elapsed.Seconds())
}

type teeWriter struct {
	http.ResponseWriter
	w io.Writer
}

func (t *teeWriter) Write(b []byte) (int, error) {
	t.w.Write(b)
	return t.ResponseWriter.Write(b)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
