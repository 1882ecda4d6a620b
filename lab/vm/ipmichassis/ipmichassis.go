// Package ipmichassis lets OpenIPMI's ipmi_sim act as the BMC of a lab qemu
// VM. ipmi_sim delegates chassis power and boot-device commands to an
// external program named by its `chassis_control "<cmd>"` directive
// (LAB-NOTES §3.1; ipmi_sim's extcmd.c): it runs `<cmd> get power`,
// `<cmd> get boot`, `<cmd> set power 1|0`, `<cmd> set reset 1`,
// `<cmd> set shutdown 1`, `<cmd> set boot pxe|default|cdrom|bios|none` and
// `<cmd> set identify <interval> <force>` through popen and parses lines
// like "power:1" from `get`. [Run] implements that program over a
// [vmpower.VM]; cmd/lab-chassis-control is its binary. [LanConf] and
// [EmuConf] generate the ipmi_sim configuration that points at it.
//
// Mapping (IPMI Chassis Control, NetFn 0x00 Cmd 0x02, and Set System Boot
// Options parameter 5):
//
//	power 1 -> Redfish "On"        power 0    -> "ForceOff"
//	reset 1 -> "ForceRestart"      shutdown 1 -> "GracefulShutdown"
//	boot pxe -> pxe, cdrom -> cd, default|none -> disk (persistent: ipmi_sim
//	passes only the device selector, LAB-NOTES §3.1); bios is unsupported.
//
// ipmi_sim's power cycle is its own `set power 0`, then `set power 1` after
// a 1 s timer.
package ipmichassis

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"strings"

	"github.com/machina-metal/machina/lab/vm/vmpower"
)

// ErrUsage is returned by Run for an operation, parameter or value the
// chassis_control protocol does not define or this backend cannot do.
var ErrUsage = errors.New("ipmichassis: bad chassis_control request")

// Run executes one chassis_control invocation; args are the words after
// the program's own arguments (e.g. ["get","power","boot"] or
// ["set","power","1"]). Answers to `get` are written to out, one
// "name:value" line per parameter.
func Run(ctx context.Context, vm *vmpower.VM, args []string, out io.Writer) error {
	if len(args) < 2 {
		return fmt.Errorf("%w: %q", ErrUsage, args)
	}
	switch args[0] {
	case "get":
		for _, p := range args[1:] {
			switch p {
			case "power":
				st, err := vm.PowerState(ctx)
				if err != nil {
					return fmt.Errorf("ipmichassis: get power: %w", err)
				}
				v := "0"
				if st == "On" {
					v = "1"
				}
				fmt.Fprintf(out, "power:%s\n", v)
			case "boot":
				dev, _ := vm.BootDevice()
				fmt.Fprintf(out, "boot:%s\n", ipmiBoot(dev))
			default:
				return fmt.Errorf("%w: get %q", ErrUsage, p)
			}
		}
		return nil
	case "set":
		rest := args[1:]
		for len(rest) > 0 {
			if len(rest) < 2 {
				return fmt.Errorf("%w: set %q without value", ErrUsage, rest[0])
			}
			p, val := rest[0], rest[1]
			rest = rest[2:]
			var err error
			switch p {
			case "power":
				switch val {
				case "1":
					err = vm.Reset(ctx, "On")
				case "0":
					err = vm.Reset(ctx, "ForceOff")
				default:
					return fmt.Errorf("%w: set power %q", ErrUsage, val)
				}
			case "reset":
				if val != "1" {
					continue
				}
				err = vm.Reset(ctx, "ForceRestart")
				if errors.Is(err, vmpower.ErrPoweredOff) {
					err = nil // IPMI reset of a machine that is off does nothing
				}
			case "shutdown":
				if val != "1" {
					continue
				}
				err = vm.Reset(ctx, "GracefulShutdown")
			case "boot":
				var dev vmpower.BootDevice
				switch val {
				case "pxe":
					dev = vmpower.BootPXE
				case "cdrom":
					dev = vmpower.BootCD
				case "default", "none":
					dev = vmpower.BootDisk
				default:
					return fmt.Errorf("%w: set boot %q", ErrUsage, val)
				}
				err = vm.SetBootDevice(dev, true)
			case "identify":
				// <interval> <force>: a VM has no identify LED; accepted so
				// `chassis identify` succeeds, and consumes its second value.
				if len(rest) > 0 {
					rest = rest[1:]
				}
			default:
				return fmt.Errorf("%w: set %q", ErrUsage, p)
			}
			if err != nil {
				return fmt.Errorf("ipmichassis: set %s %s: %w", p, val, err)
			}
		}
		return nil
	}
	return fmt.Errorf("%w: operation %q", ErrUsage, args[0])
}

func ipmiBoot(d vmpower.BootDevice) string {
	switch d {
	case vmpower.BootPXE:
		return "pxe"
	case vmpower.BootCD:
		return "cdrom"
	}
	return "default"
}

// LanConfig describes one simulated BMC.
type LanConfig struct {
	// Name is the BMC name, 1..32 of [A-Za-z0-9_-].
	Name string
	// Addr is the UDP address ipmi_sim listens on; keep it on loopback.
	Addr netip.AddrPort
	// User and Password are the admin account (user 2). The password ends
	// up in the generated file: write it mode 0600 and never log it.
	// 1..16 printable characters without '"' or '\'.
	User, Password string
	// Program is the chassis_control program (absolute path, e.g. the
	// lab-chassis-control binary) and VMDir the vmpower state directory it
	// is given as first argument. Neither may contain spaces, quotes or
	// shell metacharacters (ipmi_sim runs the command through a shell).
	Program, VMDir string
	// ProgramArgs are inserted between Program and VMDir (same rules).
	ProgramArgs []string
}

var (
	bmcNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)
	wordRE    = regexp.MustCompile(`^[A-Za-z0-9_./=^$+:@%-]+$`)
	credRE    = regexp.MustCompile(`^[\x21\x23-\x5b\x5d-\x7e]{1,16}$`)
)

// LanConf returns an ipmi_sim lan.conf (ipmi_lan(5)) for one BMC at 0x20
// with a LAN channel on cfg.Addr (RMCP+ with cipher suite 3 usable: use
// ipmitool -I lanplus -C 3, LAN-NOTES §3.1), an admin user, and
// chassis_control pointing at cfg.Program cfg.VMDir.
func LanConf(cfg LanConfig) ([]byte, error) {
	var errs []error
	if !bmcNameRE.MatchString(cfg.Name) {
		errs = append(errs, fmt.Errorf("name %q", cfg.Name))
	}
	if !cfg.Addr.IsValid() || cfg.Addr.Port() == 0 {
		errs = append(errs, fmt.Errorf("addr %v", cfg.Addr))
	}
	if !credRE.MatchString(cfg.User) || !credRE.MatchString(cfg.Password) {
		errs = append(errs, errors.New("user or password: want 1..16 printable characters without quotes or backslashes"))
	}
	words := append(append([]string{cfg.Program}, cfg.ProgramArgs...), cfg.VMDir)
	for _, w := range words {
		if !wordRE.MatchString(w) {
			errs = append(errs, fmt.Errorf("chassis_control word %q", w))
		}
	}
	if !strings.HasPrefix(cfg.Program, "/") || !strings.HasPrefix(cfg.VMDir, "/") {
		errs = append(errs, errors.New("program and vm dir must be absolute"))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("ipmichassis: lan.conf: %w", errors.Join(errs...))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# ipmi_sim BMC %q for a Machina lab VM (generated by lab/vm/ipmichassis)\n", cfg.Name)
	fmt.Fprintf(&b, "name \"%s\"\n", cfg.Name)
	b.WriteString("set_working_mc 0x20\n")
	b.WriteString("  startlan 1\n")
	fmt.Fprintf(&b, "    addr %s %d\n", cfg.Addr.Addr(), cfg.Addr.Port())
	b.WriteString("    priv_limit admin\n")
	b.WriteString("    allowed_auths_callback none\n")
	b.WriteString("    allowed_auths_user md5\n")
	b.WriteString("    allowed_auths_operator md5\n")
	b.WriteString("    allowed_auths_admin md5\n")
	// RMCP+ (lanplus) sessions fail without a system GUID; derive a stable
	// one from the name.
	g := sha256.Sum256([]byte("machina-lab-bmc/" + cfg.Name))
	fmt.Fprintf(&b, "    guid %s\n", hex.EncodeToString(g[:16]))
	b.WriteString("  endlan\n")
	fmt.Fprintf(&b, "  chassis_control \"%s\"\n", strings.Join(words, " "))
	fmt.Fprintf(&b, "  user 2 true \"%s\" \"%s\" admin 10 md5\n", cfg.User, cfg.Password)
	return []byte(b.String()), nil
}

// EmuConf returns the ipmi_sim emulator commands (ipmi_sim_cmd(5)) for a
// plain BMC at 0x20 with an SEL: pass it with -f.
func EmuConf() []byte {
	return []byte("mc_setbmc 0x20\n" +
		"mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\n" +
		"sel_enable 0x20 1000 0x0a\n" +
		"mc_enable 0x20\n")
}
