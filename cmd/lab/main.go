// Command lab runs the VM lab (lab/vm): a network namespace with the real
// controller, five qemu VMs (TCG) behind bmcsim Redfish, ipmi_sim and pyghmi BMCs,
// and the whole flow asserted step by step, printing each step's time.
// Needs root, qemu, ipmi_sim and `make build ramdisk` first (make lab does
// both). Usage: lab [-stage commission|deploy|release] [-arm64] [-trust] [-host] [-dir DIR] [-keep] [-time-scale F].
// -arm64 runs the arm64 lab instead (one arm64 VM network-booted through GRUB);
// -trust the Secure Boot lab (one x86-64 VM through the signed shim and GRUB);
// -host the host lab (one production-grade UEFI VM: TPM, bond, VLAN, bridge, RAID1, NVMe).
// Run it from the repository root (or pass -root).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/machina-metal/machina/lab/vm"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stage := fs.String("stage", "release", "how far to go: commission, deploy or release")
	dir := fs.String("dir", "", "lab folder (default: a new temporary folder, removed after a passing run)")
	keep := fs.Bool("keep", false, "keep the lab folder after a passing run")
	root := fs.String("root", ".", "repository root (bin/ and out/ramdisk/)")
	timeout := fs.Duration("timeout", 15*time.Minute, "give up after this long")
	timeScale := fs.Float64("time-scale", 1, "multiply every step's deadline (a machine loaded by other work runs TCG slower)")
	arm64 := fs.Bool("arm64", false, "run the arm64 lab (one arm64 UEFI VM through GRUB; -stage is ignored; needs make lab-arm64's builds)")
	trust := fs.Bool("trust", false, "run the Secure Boot lab (one x86-64 VM with OVMF Secure Boot and swtpm through the signed shim and GRUB; -stage is ignored)")
	host := fs.Bool("host", false, "run the host lab (one UEFI VM with a TPM, bonded NICs under a VLAN and a bridge, RAID1 root, NVMe volume group; -stage is ignored)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	st := map[string]vm.Stage{"commission": vm.StageCommission, "deploy": vm.StageDeploy, "release": vm.StageRelease}[*stage]
	if st == 0 {
		return fmt.Errorf("unknown -stage %q (want commission, deploy or release)", *stage)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	start := time.Now()
	steps, err := vm.Run(ctx, vm.Config{Root: *root, Dir: *dir, Keep: *keep, Stage: st, TimeScale: *timeScale, ARM64: *arm64, Trust: *trust, Host: *host,
		Logger: slog.New(slog.NewTextHandler(stderr, nil))})
	fmt.Fprintln(stdout, "VM lab steps:")
	for _, s := range steps {
		fmt.Fprintf(stdout, "  %7.1fs  %s\n", s.Duration.Seconds(), s.Name)
	}
	fmt.Fprintf(stdout, "  %7.1fs  total\n", time.Since(start).Seconds())
	return err
}
