package vm

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestVMLab runs the whole lab on qemu VMs (TCG). It needs root, qemu,
// ipmi_sim and the built binaries (make build ramdisk); it runs when
// MACHINA_VM_LAB=1 (set by .ci/run and make lab), because it takes minutes.
// MACHINA_VM_LAB_STAGE=commission|deploy limits how far it goes.
func TestVMLab(t *testing.T) {
	if os.Getenv("MACHINA_VM_LAB") != "1" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true but MACHINA_VM_LAB is not 1: .ci/run must run the VM lab")
		}
		t.Skip("set MACHINA_VM_LAB=1 to run the VM lab (minutes, root, qemu)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	stage := StageRelease
	switch os.Getenv("MACHINA_VM_LAB_STAGE") {
	case "commission":
		stage = StageCommission
	case "deploy":
		stage = StageDeploy
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	steps, err := Run(ctx, Config{Root: root, Stage: stage, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		OnStep: func(name string, d time.Duration) { t.Logf("STEP %-90s %6.1fs", name, d.Seconds()) }})
	if errors.Is(err, ErrPrereq) && os.Getenv("CI") != "true" {
		t.Skipf("VM lab prerequisites missing: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("VM lab: %d steps in %s", len(steps), time.Since(start).Round(time.Second))
}
