// Package fence powers a lost host's server off and proves it: through the
// server's BMC (a bmc.Driver) or through a separate fencing device (a PDU
// or chassis manager speaking IPMI or Redfish), and it succeeds only when
// the power reads back off. It is what `machinactl host fence` and the
// auto-fence policy run.
//
// The IPMI fencing device is driven by ipmitool, as the cluster fence agent
// fence_ipmilan does: a second, independent IPMI implementation next to the
// go-ipmi BMC driver, so one library's fault cannot keep a host both lost
// and running. The password reaches ipmitool only in its environment
// (IPMI_PASSWORD with -E), never in argv, where any local user could read
// it from /proc/PID/cmdline. The Redfish device holds it in memory only.
//
// fence imports bmc and bmc/redfish only; the caller records the outcome.
package fence

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/machina-metal/machina/bmc"
)

// Device is one thing that can cut a server's power: its BMC or a fencing
// device. PowerOff is a hard off (Redfish ForceOff, IPMI Chassis Control
// 00h); PowerState reads the power as the device reports it.
type Device interface {
	PowerOff(ctx context.Context) error
	PowerState(ctx context.Context) (bmc.PowerState, error)
}

// ErrNotOff is returned by Fence when the power did not read back off
// within the timeout.
var ErrNotOff = errors.New("fence: power did not read back off")

// Options bound Fence. Zero values are usable.
type Options struct {
	// Timeout bounds the whole fence (power off and read-back); zero
	// means 60s.
	Timeout time.Duration
	// Poll is the pause between read-backs; zero means 500ms.
	Poll time.Duration
}

// Fence sends a hard power off through d and reads the power back until it
// is off. It returns nil only once d reports PowerOff; ErrNotOff (wrapped,
// naming the last reading) when the timeout passes first; the device's
// error when the power off itself failed and no read-back showed off.
func Fence(ctx context.Context, d Device, o Options) error {
	if o.Timeout <= 0 {
		o.Timeout = 60 * time.Second
	}
	if o.Poll <= 0 {
		o.Poll = 500 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	offErr := d.PowerOff(ctx)
	last := bmc.PowerUnknown
	var readErr error
	for {
		p, err := d.PowerState(ctx)
		if err == nil && p == bmc.PowerOff {
			return nil // read back off: fenced, whatever PowerOff said
		}
		if err == nil {
			last = p
		} else {
			readErr = err
		}
		select {
		case <-ctx.Done():
			why := fmt.Errorf("%w (last read %s)", ErrNotOff, last)
			if readErr != nil {
				why = fmt.Errorf("%w (last read %s, read error: %v)", ErrNotOff, last, readErr)
			}
			if offErr != nil {
				return errors.Join(fmt.Errorf("fence: power off: %w", offErr), why)
			}
			return why
		case <-time.After(o.Poll):
		}
	}
}

// BMC adapts a bmc.Driver as a Device.
type BMC struct{ Driver bmc.Driver }

// PowerOff implements Device with bmc.PowerActionOff.
func (b BMC) PowerOff(ctx context.Context) error { return b.Driver.Power(ctx, bmc.PowerActionOff) }

// PowerState implements Device.
func (b BMC) PowerState(ctx context.Context) (bmc.PowerState, error) { return b.Driver.PowerState(ctx) }

// IPMITool is an IPMI v2.0 fencing device reached over RMCP+ (lanplus) by
// ipmitool. Address is "host" or "host:port" (default 623).
type IPMITool struct {
	Address  string
	Username string
	// Password reaches ipmitool in IPMI_PASSWORD only (ipmitool -E).
	Password string
	// CipherSuite is ipmitool's -C; zero means 3 (RAKP-HMAC-SHA1, what
	// most fencing devices and ipmi_sim offer). 17 for OpenBMC.
	CipherSuite int
	// Path is the ipmitool binary; "" means "ipmitool" in PATH.
	Path string
	// Timeout bounds one ipmitool run; zero means 20s.
	Timeout time.Duration
}

// args is ipmitool's argv for a chassis power verb ("off", "status"). It
// never holds the password.
func (d *IPMITool) args(verb string) ([]string, error) {
	host, port, err := net.SplitHostPort(d.Address)
	if err != nil {
		host, port = strings.Trim(d.Address, "[]"), "623"
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil || host == "" || strings.HasPrefix(host, "-") {
		return nil, fmt.Errorf("fence: ipmi address %q is not host[:port]", d.Address)
	}
	for _, r := range d.Username {
		if r < 0x20 || r == 0x7f {
			return nil, errors.New("fence: ipmi username contains control characters")
		}
	}
	suite := d.CipherSuite
	if suite == 0 {
		suite = 3
	}
	return []string{"-I", "lanplus", "-C", strconv.Itoa(suite), "-H", host, "-p", port, "-U", d.Username, "-E", "-N", "1", "-R", "3",
		"chassis", "power", verb}, nil
}

func (d *IPMITool) run(ctx context.Context, verb string) (string, error) {
	args, err := d.args(verb)
	if err != nil {
		return "", err
	}
	path := d.Path
	if path == "" {
		path = "ipmitool"
	}
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = 20 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	// The whole environment: the password, PATH for its helpers, a fixed
	// locale for the output we parse.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "IPMI_PASSWORD=" + d.Password}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if d.Password != "" {
			msg = strings.ReplaceAll(msg, d.Password, "[redacted]")
		}
		if len(msg) > 300 {
			msg = msg[:300]
		}
		if strings.Contains(msg, "RAKP") || strings.Contains(strings.ToLower(msg), "unauthorized") {
			return "", fmt.Errorf("fence: ipmitool chassis power %s on %s: %s: %w", verb, d.Address, msg, bmc.ErrAuth)
		}
		return "", fmt.Errorf("fence: ipmitool chassis power %s on %s: %v: %s", verb, d.Address, err, msg)
	}
	return out.String(), nil
}

// PowerOff implements Device: "chassis power off" (Chassis Control 00h,
// IPMI v2.0 §28.3).
func (d *IPMITool) PowerOff(ctx context.Context) error {
	_, err := d.run(ctx, "off")
	return err
}

// PowerState implements Device: "chassis power status" (Get Chassis
// Status, IPMI v2.0 §28.2), "Chassis Power is on|off".
func (d *IPMITool) PowerState(ctx context.Context) (bmc.PowerState, error) {
	out, err := d.run(ctx, "status")
	if err != nil {
		return bmc.PowerUnknown, err
	}
	switch s := strings.ToLower(strings.TrimSpace(out)); {
	case strings.HasSuffix(s, "is off"):
		return bmc.PowerOff, nil
	case strings.HasSuffix(s, "is on"):
		return bmc.PowerOn, nil
	}
	return bmc.PowerUnknown, fmt.Errorf("fence: ipmitool chassis power status on %s: unexpected output %q", d.Address, strings.TrimSpace(out))
}
