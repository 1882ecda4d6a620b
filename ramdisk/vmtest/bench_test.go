package vmtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/ramdisk/agent/agenttest"
)

// benchInit is the /init of the benchmark overlay: busybox brings the
// network up, runs the baseline "wget | tee fifo | dd" with sha256sum on the
// fifo against the same image and disk, then execs the real agent as PID 1.
const benchInit = `#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
exec >/dev/console 2>&1
for m in $(cat /modules/order.txt); do insmod /modules/$m 2>/dev/null; done
ip link set lo up; ip link set eth0 up
udhcpc -i eth0 -q -n -s /udhcpc.script >/dev/null 2>&1
URL=$(sed -n 's/.*bench.url=\([^ ]*\).*/\1/p' /proc/cmdline)
mkfifo /tmp/f
t0=$(cut -d' ' -f1 /proc/uptime)
sha256sum < /tmp/f > /tmp/sum &
wget -q -O - "$URL" | tee /tmp/f | dd of=/dev/vda bs=4M iflag=fullblock conv=fsync 2>/dev/null
wait
t1=$(cut -d' ' -f1 /proc/uptime)
echo "BASELINE t0=$t0 t1=$t1 sha=$(cut -d' ' -f1 /tmp/sum)"
exec /agent
`

const udhcpcScript = `#!/bin/busybox sh
[ "$1" = bound ] || exit 0
ifconfig "$interface" "$ip" netmask "$subnet"
[ -n "$router" ] && route add default gw "$router"
exit 0
`

// benchOverlay writes a gzip'd cpio with /init (benchInit), /udhcpc.script,
// /bin/busybox and /agent; appended to the ramdisk it overrides /init (the
// kernel unpacks concatenated archives in order).
func benchOverlay(b *testing.B, dir, initrd string) string {
	b.Helper()
	bb := peertest.Command(b, "busybox")
	st := filepath.Join(dir, "overlay")
	os.MkdirAll(filepath.Join(st, "bin"), 0o755)
	os.WriteFile(filepath.Join(st, "init"), []byte(benchInit), 0o755)
	os.WriteFile(filepath.Join(st, "udhcpc.script"), []byte(udhcpcScript), 0o755)
	data, _ := os.ReadFile(bb)
	os.WriteFile(filepath.Join(st, "bin", "busybox"), data, 0o755)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(st, "agent"), "github.com/machina-metal/machina/cmd/machina-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build agent: %v\n%s", err, out)
	}
	sh := exec.Command("sh", "-c", "cd \"$1\" && find . -mindepth 1 | sort | cpio -o -H newc --owner=0:0 --quiet | gzip -1", "sh", st)
	out, err := sh.Output()
	if err != nil {
		b.Fatalf("cpio: %v", err)
	}
	base, _ := os.ReadFile(initrd)
	combined := filepath.Join(dir, "bench-initrd.cpio.gz")
	os.WriteFile(combined, append(base, out...), 0o644)
	return combined
}

// BenchmarkDeployVsShellPipelineInVM compares, in one TCG VM, the agent's
// verify-before-write deploy of a 64 MiB image (download+hash, then write)
// with the unverified baseline "wget | tee | dd" + sha256sum of the same
// image to the same disk. Run: go test -run '^$' -bench DeployVsShell -benchtime 1x ./ramdisk/vmtest
func BenchmarkDeployVsShellPipelineInVM(b *testing.B) {
	peertest.Commands(b, "qemu-system-x86_64", "socat", "sgdisk", "busybox", "cpio")
	kernel, initrd := buildRamdisk(b)
	for i := 0; i < b.N; i++ {
		dir := b.TempDir()
		bench := benchOverlay(b, dir, initrd)
		disk := filepath.Join(dir, "disk.raw")
		f, _ := os.Create(disk)
		f.Truncate(1 << 30)
		f.Close()
		img := gptImage(b, dir, 64<<20)
		sum := sha256.Sum256(img)
		ctl := agenttest.NewController(agenttest.ControllerConfig{
			DeployToken: "deploy-bench-1", Image: img,
			Plan: v1.Plan{Seed: v1.Seed{InstanceID: "i-bench", Hostname: "bench",
				SSHKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkUjIg1YmN3qkI3QVh2dGZ1bHd0cWZ6eHJ0a2Z4 ops@lab"}}},
		})
		ctl.SetBaseURL("http://10.0.2.100:8080")
		mux := http.NewServeMux()
		mux.HandleFunc("/bench/os.img", func(w http.ResponseWriter, r *http.Request) {
			http.ServeContent(w, r, "os.img", time.Time{}, bytes.NewReader(img))
		})
		mux.Handle("/", ctl)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := &http.Server{Handler: mux}
		go srv.Serve(ln)
		port := ln.Addr().(*net.TCPAddr).Port
		serial := bootVM(b, kernel, bench, disk, port, "machina.mode=deploy machina.token=deploy-bench-1 machina.final=poweroff bench.url=http://10.0.2.100:8080/bench/os.img", vmOpts{})
		srv.Close()
		m := regexp.MustCompile(`BASELINE t0=([0-9.]+) t1=([0-9.]+) sha=([0-9a-f]+)`).FindStringSubmatch(serial)
		if m == nil || m[3] != hex.EncodeToString(sum[:]) {
			b.Fatalf("baseline did not run or hashed wrong: %v\n%s", m, serial)
		}
		t0, _ := strconv.ParseFloat(m[1], 64)
		t1, _ := strconv.ParseFloat(m[2], 64)
		vs := regexp.MustCompile(`msg="image verified".* seconds=([0-9.]+)`).FindStringSubmatch(serial)
		ws := regexp.MustCompile(`msg="deploy written".* writeSeconds=([0-9.]+)`).FindStringSubmatch(serial)
		if vs == nil || ws == nil || len(ctl.Done()) != 1 || !ctl.Done()[0].OK {
			b.Fatalf("agent deploy did not finish: %v\n%s", ctl.Done(), serial)
		}
		v, _ := strconv.ParseFloat(vs[1], 64)
		w, _ := strconv.ParseFloat(ws[1], 64)
		mb := float64(len(img)) / 1e6
		base := mb / (t1 - t0)
		agentRate := mb / (v + w)
		b.ReportMetric(base, "baseline-MB/s")
		b.ReportMetric(agentRate, "agent-MB/s")
		b.ReportMetric(agentRate/base, "ratio")
		b.ReportMetric(mb/v, "agent-verify-MB/s")
		b.ReportMetric(mb/w, "agent-write-MB/s")
		fmt.Fprintf(os.Stderr, "baseline %.2fs, agent verify %.2fs + write %.2fs\n", t1-t0, v, w)
	}
}
