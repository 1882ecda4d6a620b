package vmtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// wipeStub is a controller for one release wipe: it serves plan on the
// wipe token and records the progress reports and the outcome.
type wipeStub struct {
	token    string
	plan     v1.WipePlan
	mu       sync.Mutex
	progress []v1.Progress
	result   *v1.WipeResult
}

func (c *wipeStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	auth := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch {
	case r.URL.Path == v1.PathAgentWipe && auth == c.token:
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(c.plan)
		return
	case r.URL.Path == v1.PathAgentProgress && auth == c.plan.ProgressToken:
		var p v1.Progress
		if json.NewDecoder(r.Body).Decode(&p) == nil {
			c.progress = append(c.progress, p)
		}
	case r.URL.Path == v1.PathAgentWiped && auth == c.plan.DoneToken:
		var res v1.WipeResult
		if err := json.NewDecoder(r.Body).Decode(&res); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		c.result = &res
	default:
		w.WriteHeader(http.StatusForbidden)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// TestRamdiskSecureEraseNVMeInQemu boots the real ramdisk in wipe mode
// under TCG on a machine whose only disk is an emulated NVMe controller
// (qemu's nvme device: Identify Controller with Format NVM in OACS, Format
// NVM with Secure Erase Settings user data erase writing zeros). The
// plan asks for erase: secure; the agent must send the Format through
// NVME_IOCTL_ADMIN_CMD, verify its samples and post the outcome; the
// backing file then holds no byte of the pattern written before.
func TestRamdiskSecureEraseNVMeInQemu(t *testing.T) {
	needTools(t, "qemu-system-x86_64", "socat", "apt-get", "dpkg-deb", "cpio", "depmod")
	kernel, initrd := buildRamdisk(t)
	dir := t.TempDir()
	disk := filepath.Join(dir, "nvme.raw")
	const size = 64 << 20
	pattern := []byte("TENANT-DATA-NVME-")
	if err := os.WriteFile(disk, bytes.Repeat(pattern, size/len(pattern)+1)[:size], 0o644); err != nil {
		t.Fatal(err)
	}
	stub := &wipeStub{token: "wipe-tok-1", plan: v1.WipePlan{DoneToken: "wiped-tok-1", Erase: v1.EraseSecure,
		ProgressToken: "progress-tok-1", ProgressEvery: time.Second}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: stub, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port

	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	mac := strings.ReplaceAll(vmMAC, ":", "-")
	qargs := []string{
		"-accel", "tcg", "-cpu", "max", "-m", "768", "-smp", "2",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "stdio",
		"-kernel", kernel, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 loglevel=4 machina.url=http://10.0.2.100:8080 BOOTIF=01-" + mac + " machina.final=poweroff machina.mode=wipe machina.token=wipe-tok-1",
		"-netdev", fmt.Sprintf("user,id=n0,restrict=on,guestfwd=tcp:10.0.2.100:8080-cmd:socat - TCP:127.0.0.1:%d", port),
		"-device", "virtio-net-pci,netdev=n0,mac=" + vmMAC,
		"-device", "virtio-rng-pci",
		"-drive", "file=" + disk + ",format=raw,if=none,id=nv0,cache=unsafe",
		"-device", "nvme,serial=machina-nvme0,drive=nv0",
	}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", qargs...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	err = cmd.Run()
	t.Logf("qemu ran %.1fs", time.Since(t0).Seconds())
	serial := out.String()
	if err != nil || ctx.Err() != nil {
		t.Fatalf("qemu: %v (ctx %v)\nserial:\n%s", err, ctx.Err(), serial)
	}
	stub.mu.Lock()
	res := stub.result
	stub.mu.Unlock()
	if res == nil {
		t.Fatalf("no wipe outcome posted; serial:\n%s", serial)
	}
	if !res.OK || len(res.Erased) != 1 {
		t.Fatalf("outcome %+v; serial:\n%s", res, serial)
	}
	t.Logf("agent: %s", lineWith(serial, "secure erase"))
	e := res.Erased[0]
	t.Logf("erased %s (%s): %s, %d bytes in %s, %d samples verified", e.Disk, e.Name, e.Method, e.Bytes, e.Duration, e.VerifiedSamples)
	if e.Name != "nvme0n1" || e.Method != "nvme-format-user-data-erase" || e.Bytes != size || e.VerifiedSamples != 1024 {
		t.Errorf("erased %+v", e)
	}
	b, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, pattern[:8]) {
		t.Errorf("the NVMe backing file still holds the pattern after the format")
	}
	// What qemu's Format did to the backing file: its nvme device ignores
	// SES and writes zeros over the namespace (hw/nvme/ctrl.c
	// nvme_format_ns_cb), which a real drive's user data erase need not.
	t.Logf("backing file after the format: %d of %d bytes non-zero", len(b)-bytes.Count(b, []byte{0}), len(b))
}
