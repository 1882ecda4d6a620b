package pyghmibmc

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/ipmi"
)

// fakeChassis writes an ipmi_sim chassis_control program (the protocol of
// lab/vm/ipmichassis) that keeps the power state in a file and logs every
// `set` it is given, and returns the command and the log path.
func fakeChassis(t *testing.T) (cmd, log string) {
	t.Helper()
	dir := t.TempDir()
	prog, log := filepath.Join(dir, "chassis.sh"), filepath.Join(dir, "set.log")
	power := filepath.Join(dir, "power")
	if err := os.WriteFile(power, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := `#!/bin/sh
# fake chassis_control: get power | set PARAM VALUE
P=` + power + `
case "$1" in
get) echo "power:$(cat "$P")" ;;
set) echo "$2 $3" >> ` + log + `
     if [ "$2" = power ]; then echo "$3" > "$P"; fi
     if [ "$2" = shutdown ]; then echo 0 > "$P"; fi ;;
*) exit 1 ;;
esac
`
	if err := os.WriteFile(prog, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return "/bin/sh " + prog, log
}

func sets(t *testing.T, log string) []string {
	t.Helper()
	b, err := os.ReadFile(log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func driver(t *testing.T, b *BMC) (*ipmi.Driver, context.Context) {
	t.Helper()
	d, err := ipmi.New(ipmi.Config{Address: b.Addr(), Username: "admin", Password: "password", PowerTimeout: 5 * time.Second,
		PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	t.Cleanup(func() { d.Close(context.Background()) })
	return d, ctx
}

// TestChassisPowerBackend: pointed at a chassis_control program (as the VM
// lab's lab-chassis-control over its qemu VM), power on is `set power 1`,
// reset `set reset 1`, off `set power 0` and soft off `set shutdown 1`;
// with ApplyAtPowerOn (VirtualBMC over libvirt) a boot device set while
// the machine runs is handed to the program only just before the next
// power-on from off, never at a reset.
func TestChassisPowerBackend(t *testing.T) {
	cmd, log := fakeChassis(t)
	b := Start(t, Config{Power: "chassis:" + cmd, ApplyAtPowerOn: true})
	d, ctx := driver(t, b)
	if ps, err := d.PowerState(ctx); err != nil || ps != bmc.PowerOff {
		t.Fatalf("PowerState = %v, %v; want off", ps, err)
	}
	if err := d.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootPXE}); err != nil && !errors.As(err, new(*bmc.KeptError)) {
		t.Fatal(err)
	}
	if err := d.Power(ctx, bmc.PowerActionOn); err != nil {
		t.Fatal(err)
	}
	// Disk while running: kept for the next power-on only.
	if err := d.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootDisk}); err != nil && !errors.As(err, new(*bmc.KeptError)) {
		t.Fatal(err)
	}
	if err := d.Power(ctx, bmc.PowerActionReset); err != nil && !errors.Is(err, bmc.ErrUnverified) {
		t.Fatal(err)
	}
	if err := d.Power(ctx, bmc.PowerActionOff); err != nil {
		t.Fatal(err)
	}
	if err := d.Power(ctx, bmc.PowerActionOn); err != nil {
		t.Fatal(err)
	}
	if err := d.Power(ctx, bmc.PowerActionSoftOff); err != nil && !errors.Is(err, bmc.ErrUnverified) {
		t.Fatal(err)
	}
	want := []string{"boot pxe", "power 1", "reset 1", "power 0", "boot default", "power 1", "shutdown 1"}
	if got := sets(t, log); !slices.Equal(got, want) {
		t.Errorf("chassis_control sets %q, want %q", got, want)
	}
	if boots, err := b.Boots(); err != nil || !slices.Equal(boots, []string{"power-on network", "reset network", "power-on hd"}) {
		t.Errorf("boots %q, %v; want network at power-on and reset, hd at the next power-on", boots, err)
	}
}

// TestChassisBootAtOnce: without ApplyAtPowerOn the chassis backend is
// handed the boot device when it is set.
func TestChassisBootAtOnce(t *testing.T) {
	cmd, log := fakeChassis(t)
	b := Start(t, Config{Power: "chassis:" + cmd})
	d, ctx := driver(t, b)
	if err := d.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootPXE}); err != nil && !errors.As(err, new(*bmc.KeptError)) {
		t.Fatal(err)
	}
	if got := sets(t, log); !slices.Equal(got, []string{"boot pxe"}) {
		t.Errorf("chassis_control sets %q, want [boot pxe]", got)
	}
}
