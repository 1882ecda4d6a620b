package vm

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/lab/vm/vmpower"
)

// The unsigned-kernel part of the Secure Boot lab. The controller serves
// the Secure Boot chain one kernel, the --ramdisk-dir's vmlinuz, read at
// start; an operator who points --ramdisk-dir at a ramdisk built around an
// unsigned kernel (a custom build, a kernel whose signature was stripped)
// makes every Secure Boot server refuse it. That is the mechanism a site
// really has, so the lab uses it: after the spoofer's replays (vm-trust
// deployed and off), the controller is restarted on a copy of the ramdisk
// whose vmlinuz had its Authenticode signature removed (sbattach --remove,
// Debian package sbsigntool) and vm-trust is released. Its release wipe is
// a network boot through shim and GRUB like commissioning's: GRUB refuses
// the kernel, the ramdisk never runs, and the plan must say so.

// unsignedSilentAfter is the restarted controller's --machine-silent-after:
// BootStalled shows at half of it after the kernel fetch.
const unsignedSilentAfter = time.Minute

// unsignedRamdisk writes dir/vmlinuz, the ramdisk's kernel with its
// Authenticode signature removed, and a copy of its initrd, and checks with
// sbverify that the kernel has no signature left.
func (l *lab) unsignedRamdisk(dir string) error {
	src := filepath.Join(l.cfg.Root, "out", "ramdisk")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("vm lab: %w", err)
	}
	for _, f := range []string{"vmlinuz", "initrd.cpio.gz"} {
		if err := copyFile(filepath.Join(src, f), filepath.Join(dir, f)); err != nil {
			return err
		}
	}
	kernel := filepath.Join(dir, "vmlinuz")
	if out, err := exec.Command("sbattach", "--remove", kernel).CombinedOutput(); err != nil {
		return fmt.Errorf("vm lab: sbattach --remove %s (Debian package sbsigntool): %w: %s", kernel, err, out)
	}
	// sbverify --list exits 0 either way; it lists the signatures, or says
	// there is no table.
	out, err := exec.Command("sbverify", "--list", kernel).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "No signature table present") {
		return fmt.Errorf("vm lab: sbverify --list %s after sbattach --remove: %v: %s", kernel, err, out)
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("vm lab: %w", err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("vm lab: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("vm lab: copy %s: %w", src, err)
	}
	return out.Close()
}

// withArgs returns args with each flag of set given its new value (flags
// given as "--flag value").
func withArgs(args []string, set map[string]string) []string {
	out := slices.Clone(args)
	for i := 0; i+1 < len(out); i++ {
		if v, ok := set[out[i]]; ok {
			out[i+1] = v
		}
	}
	return out
}

// runUnsignedKernel restarts the controller on the unsigned kernel,
// releases vm-trust and checks: the controller warned at start, GRUB
// refused the kernel on the serial console ("bad shim signature") and the
// kernel never ran, and the plan shows Waiting/BootStalled for vm-trust's
// release wipe naming the kernel it fetched by TFTP and the Secure Boot
// hint.
func (l *lab) runUnsignedKernel(ctx context.Context) error {
	t0 := time.Now()
	m, _, err := l.trustTap()
	if err != nil {
		return err
	}
	dir := filepath.Join(l.dir, "ramdisk-unsigned")
	if err := l.unsignedRamdisk(dir); err != nil {
		return err
	}
	args := withArgs(l.serveArgs, map[string]string{"--ramdisk-dir": dir, "--machine-silent-after": l.scale(unsignedSilentAfter).String()})
	if err := l.stopServe(); err != nil {
		return err
	}
	if err := l.startServe(ctx, args, "controller-unsigned.log"); err != nil {
		return err
	}
	if err := l.logHas("controller-unsigned.log", "the Secure Boot chain's kernel is not signed"); err != nil {
		return err
	}
	serial := filepath.Join(m.vm.Config().Dir, vmpower.SerialLog)
	st, err := os.Stat(serial)
	if err != nil {
		return fmt.Errorf("vm lab: %w", err)
	}
	if err := l.push(ctx, "profile "+TrustProfile+": count 0 (release "+TrustMachine+"; the controller now serves an unsigned kernel)", func() error {
		return replaceFile(filepath.Join(l.clone, "profiles.yaml"), "    count: 1\n    join:\n      site: vmtrust", "    count: 0\n    join:\n      site: vmtrust")
	}); err != nil {
		return err
	}
	// One of one server released: the brake holds the plan.
	if err := l.approveHeld(ctx); err != nil {
		return err
	}
	l.step("unsigned kernel: sbattach --remove, the controller restarted on it (warned at start), "+TrustMachine+" released", t0)

	t0 = time.Now()
	c, err := l.waitPlanCondition(ctx, TrustMachine, "Waiting", "BootStalled", []string{
		"release wipe running since ", "boot stalled: the machine fetched " + boot.TFTPRamdiskKernel + " by tftp at ",
		"Secure Boot: the firmware, shim or GRUB may have refused"}, l.scale(6*time.Minute))
	if err != nil {
		return err
	}
	if err := refusedOnConsole(serial, st.Size()); err != nil {
		return err
	}
	l.log.Info("unsigned kernel refused and reported", "vm", TrustMachine, "condition", c.Message)
	l.step("unsigned kernel: "+TrustMachine+"'s release wipe fetched it by TFTP, GRUB refused it (bad shim signature), the plan shows BootStalled with the Secure Boot hint", t0)
	return nil
}

// logHas checks that the lab file name contains text.
func (l *lab) logHas(name, text string) error {
	b, err := os.ReadFile(filepath.Join(l.dir, name))
	if err != nil {
		return fmt.Errorf("vm lab: %w", err)
	}
	if !strings.Contains(string(b), text) {
		return fmt.Errorf("vm lab: %s lacks %q", name, text)
	}
	return nil
}

// refusedOnConsole checks the serial log written after offset: GRUB was
// fetched, then refused the kernel, and the kernel never ran.
func refusedOnConsole(serial string, offset int64) error {
	b, err := os.ReadFile(serial)
	if err != nil {
		return fmt.Errorf("vm lab: %w", err)
	}
	if int64(len(b)) < offset {
		offset = 0 // the log was restarted with the VM
	}
	tail := string(b[offset:])
	for _, want := range []string{"Fetching Netboot Image " + boot.GRUBImageX64, "bad shim signature"} {
		if !strings.Contains(tail, want) {
			return fmt.Errorf("vm lab: the serial log since the release lacks %q (see %s)", want, serial)
		}
	}
	if strings.Contains(tail, "EFI stub: UEFI Secure Boot is enabled.") {
		return fmt.Errorf("vm lab: the unsigned kernel ran (see %s)", serial)
	}
	return nil
}
