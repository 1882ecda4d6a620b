package vm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
	"github.com/machina-metal/machina/internal/peertest"
)

// TestVMLab runs the whole lab on qemu VMs (TCG). It needs root, qemu,
// ipmi_sim and the built binaries (make build ramdisk); it runs when
// MACHINA_VM_LAB=1 (set by .ci/run and make lab), because it takes minutes.
// MACHINA_VM_LAB_STAGE=commission|deploy limits how far it goes.
func TestVMLab(t *testing.T) {
	if os.Getenv("MACHINA_VM_LAB") != "1" {
		// Not a silent skip in CI: .ci/run runs the VM lab as its own
		// step with MACHINA_VM_LAB=1 after make test.
		if os.Getenv("CI") == "true" {
			// make test filters this test out (-skip); reaching it in CI
			// without the variable is a wiring fault, not a skip.
			t.Fatal("TestVMLab reached under CI=true without MACHINA_VM_LAB=1: run it as .ci/run's lab step (make lab), or filter it out as make test does")
		}
		t.Skip("the VM lab runs with MACHINA_VM_LAB=1 (make lab; .ci/run runs it after make test): minutes, root, qemu")
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
	// The budget is 15 minutes (asserted below); the context allows more so
	// that a slow run still reports every step's time.
	ctx, cancel := context.WithTimeout(context.Background(), 19*time.Minute) // make test: -timeout 20m
	defer cancel()
	start := time.Now()
	steps, err := Run(ctx, Config{Root: root, Stage: stage, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		OnStep: func(name string, d time.Duration) { t.Logf("STEP %-90s %6.1fs", name, d.Seconds()) }})
	logSteps(t, "VM lab", steps, time.Since(start))
	if errors.Is(err, ErrPrereq) {
		peertest.Missing(t, "VM lab prerequisite: "+err.Error(), "what it names (`make lab` builds the binaries and the ramdisk; scripts/deps.sh installs the packages)")
	}
	if err != nil {
		t.Fatal(err)
	}
	total := time.Since(start)
	// The OS image build (first step) is cached between runs and not part
	// of the budget; .ci/run builds it before the tests.
	if len(steps) > 0 {
		total -= steps[0].Duration
	}
	if total > Budget {
		t.Errorf("VM lab took %s, over the %s budget", total.Round(time.Second), Budget)
	}
}

// TestNoPXETree: the copied Dell tree no longer offers Pxe as a boot
// override target, so the Redfish driver reports ErrUnsupported for PXE and
// the controller falls back to virtual media; the original tree is intact.
func TestNoPXETree(t *testing.T) {
	fixtures, err := bmcsim.FixturesDir()
	if err != nil {
		t.Fatal(err)
	}
	src, err := bmcsim.TreeDir(fixtures, "dell-poweredge-r750-idrac9")
	if err != nil {
		t.Fatal(err)
	}
	dst, err := noPXETree(src, filepath.Join(t.TempDir(), "nopxe"))
	if err != nil {
		t.Fatal(err)
	}
	var trees bmcsim.Trees
	srv, err := trees.New(dst, bmcsim.Config{Username: "admin", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	drv, err := redfish.New(redfish.Config{Endpoint: ts.URL, Username: "admin", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	defer drv.Close(ctx)
	if err := drv.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootPXE, Mode: bmc.BootModeLegacy}); !errors.Is(err, bmc.ErrUnsupported) {
		t.Fatalf("PXE override on the no-PXE tree: %v, want ErrUnsupported", err)
	}
	if err := drv.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootCD, Mode: bmc.BootModeLegacy}); err != nil {
		t.Fatalf("CD override: %v", err)
	}
	orig, err := os.ReadFile(filepath.Join(src, "redfish", "v1", "Systems", "System.Embedded.1", "index.json"))
	if err != nil || !strings.Contains(string(orig), `"Pxe",`) {
		t.Fatalf("original tree changed: %v", err)
	}
}

// TestVMLabARM64 runs the arm64 lab (Config.ARM64): one arm64
// UEFI VM (qemu-system-aarch64, TCG, AAVMF) network-boots through GRUB's
// arm64 image from the controller's DHCP and TFTP, commissions and
// reports arch arm64, and a pin of the amd64 profile onto it is refused
// with ArchMismatch in the plan and the status commit. It needs root,
// qemu-system-aarch64 and make lab-arm64's builds; it runs when
// MACHINA_VM_LAB_ARM64=1 (set by .ci/run's lab_arm64 step and make
// lab-arm64), because it takes minutes.
func TestVMLabARM64(t *testing.T) {
	if os.Getenv("MACHINA_VM_LAB_ARM64") != "1" {
		// Not a silent skip in CI: .ci/run runs it as its own step
		// (lab_arm64) with MACHINA_VM_LAB_ARM64=1.
		if os.Getenv("CI") == "true" {
			t.Fatal("TestVMLabARM64 reached under CI=true without MACHINA_VM_LAB_ARM64=1: run it as .ci/run's lab_arm64 step (make lab-arm64), or filter it out as make test does")
		}
		t.Skip("the arm64 VM lab runs with MACHINA_VM_LAB_ARM64=1 (make lab-arm64; .ci/run's lab_arm64 step): minutes, root, qemu-system-aarch64")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 14*time.Minute) // .ci/run: -timeout 15m
	defer cancel()
	start := time.Now()
	steps, err := Run(ctx, Config{Root: root, ARM64: true, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		OnStep: func(name string, d time.Duration) { t.Logf("STEP %-90s %6.1fs", name, d.Seconds()) }})
	logSteps(t, "arm64 VM lab", steps, time.Since(start))
	if errors.Is(err, ErrPrereq) {
		peertest.Missing(t, "arm64 VM lab prerequisite: "+err.Error(), "what it names (`make lab-arm64` builds the binaries, the arm64 ramdisk and the GRUB image; scripts/deps.sh installs the packages)")
	}
	if err != nil {
		t.Fatal(err)
	}
	total := time.Since(start)
	if len(steps) > 0 {
		total -= steps[0].Duration
	}
	if total > ARM64Budget {
		t.Errorf("arm64 VM lab took %s, over the %s budget", total.Round(time.Second), ARM64Budget)
	}
}

// TestVMLabTrust is the Secure Boot lab (Config.Trust, lab/vm/trust.go):
// vm-trust boots OVMF with Secure Boot and Microsoft's keys through the
// signed shim, GRUB and kernel the controller serves, attests with its
// swtpm against the computed chain, and commissions; its EK is pinned in
// Git; a spoofing VM with its own swtpm and vm-trust's MAC and address is
// refused the plan; vm-trust deploys with quotes, boots its OS with Secure
// Boot on and joins; the spoofer's replays at plan, done and join are
// refused.
func TestVMLabTrust(t *testing.T) {
	if os.Getenv("MACHINA_VM_LAB_TRUST") != "1" {
		if os.Getenv("CI") == "true" {
			t.Fatal("TestVMLabTrust reached under CI=true without MACHINA_VM_LAB_TRUST=1: run it as .ci/run's lab_trust step (make lab-trust), or filter it out as make test does")
		}
		t.Skip("the Secure Boot VM lab runs with MACHINA_VM_LAB_TRUST=1 (make lab-trust; .ci/run's lab_trust step): minutes, root, qemu, swtpm")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 38*time.Minute) // .ci/run: -timeout 40m
	defer cancel()
	start := time.Now()
	steps, err := Run(ctx, Config{Root: root, Trust: true, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		OnStep: func(name string, d time.Duration) { t.Logf("STEP %-90s %6.1fs", name, d.Seconds()) }})
	logSteps(t, "Secure Boot VM lab", steps, time.Since(start))
	if errors.Is(err, ErrPrereq) {
		peertest.Missing(t, "Secure Boot VM lab prerequisite: "+err.Error(), "what it names (`make lab-trust` builds the binaries and the ramdisk; scripts/deps.sh installs the packages)")
	}
	if err != nil {
		t.Fatal(err)
	}
	total := time.Since(start)
	if len(steps) > 0 {
		total -= steps[0].Duration
	}
	if total > TrustBudget {
		t.Errorf("Secure Boot VM lab took %s, over the %s budget", total.Round(time.Second), TrustBudget)
	}
}

// logSteps logs a lab's step timing table (one row per step: seconds and
// name, then the total) with t.Log, whether the lab passed or failed:
// under go test -v, as .ci/run and make lab-trust run the labs, a passing
// run's log shows where its time went too, not only a failing one's.
func logSteps(t *testing.T, title string, steps []Step, total time.Duration) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "%s step times (%d steps):\n", title, len(steps))
	for _, s := range steps {
		fmt.Fprintf(&b, "  %7.1fs  %s\n", s.Duration.Seconds(), s.Name)
	}
	fmt.Fprintf(&b, "  %7.1fs  total", total.Seconds())
	t.Log(b.String())
}

// TestNSPrefix: each kind of lab starts its network namespace's name
// differently (labs run side by side in .ci/run's lab_host_arm64), and
// every prefix is one netns.Create accepts (1-16 of [a-z0-9-]).
func TestNSPrefix(t *testing.T) {
	seen := map[string]string{}
	for kind, cfg := range map[string]Config{"five-VM": {}, "host": {Host: true}, "trust": {Trust: true}, "arm64": {ARM64: true}} {
		p := (&lab{cfg: cfg}).nsPrefix()
		if !regexp.MustCompile(`^[a-z0-9-]{1,16}$`).MatchString(p) {
			t.Errorf("%s lab: prefix %q is not a valid netns prefix", kind, p)
		}
		if other, ok := seen[p]; ok {
			t.Errorf("%s and %s labs share the prefix %q", kind, other, p)
		}
		seen[p] = kind
	}
}
