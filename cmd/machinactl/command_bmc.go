package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/bmc"
)

// bmcFlags are the connection flags shared by every `machinactl bmc` verb.
type bmcFlags struct {
	driver, address, username string
	passwordStdin, insecure   bool
	timeout, softOffTimeout   time.Duration
	auth, caFile              string
	verbose                   bool
}

// newBMCCmd is `machinactl bmc`: act on one BMC directly, without any
// inventory. The password comes from --password-stdin or
// MACHINA_BMC_PASSWORD, never from a flag value.
func newBMCCmd(e *env) *cobra.Command {
	f := &bmcFlags{}
	cmd := &cobra.Command{
		Use:   "bmc",
		Short: "Act on one BMC directly: power, boot override, virtual media, info, BIOS, RAID, firmware, Secure Boot",
		Long: `Act on one BMC directly, without any inventory.

The password is read from the first line of stdin with --password-stdin, or
from the MACHINA_BMC_PASSWORD environment variable. It is never a flag value.
--driver, --address and --username also read MACHINA_BMC_DRIVER,
MACHINA_BMC_ADDRESS and MACHINA_BMC_USERNAME. Without --username no
credentials are sent (BMCs with authentication off).

The driver's warnings (a refused PATCH whose read-back matched, a soft-off
that had to be forced, an authentication fallback) are printed on stderr.`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.driver, "driver", envOr("MACHINA_BMC_DRIVER", "redfish"), "BMC protocol: redfish or ipmi")
	pf.StringVar(&f.address, "address", os.Getenv("MACHINA_BMC_ADDRESS"), "BMC address: host[:port], https://host, or https://host/redfish/v1/Systems/<ID> to pick a system")
	pf.StringVar(&f.username, "username", os.Getenv("MACHINA_BMC_USERNAME"), "BMC user name")
	pf.BoolVar(&f.passwordStdin, "password-stdin", false, "read the password from the first line of stdin (else MACHINA_BMC_PASSWORD)")
	pf.BoolVar(&f.insecure, "insecure", false, "skip TLS certificate verification for this BMC")
	pf.StringVar(&f.caFile, "ca-file", "", "PEM file with the CA (or the BMC's own self-signed certificate) to trust for this BMC")
	pf.StringVar(&f.auth, "auth", "auto", "redfish authentication: auto (session, else HTTP Basic), session or basic")
	pf.BoolVar(&f.verbose, "verbose", false, "also print the driver's hardware actions (Info) on stderr")
	pf.DurationVar(&f.timeout, "timeout", 10*time.Minute, "bound for the whole command")
	pf.DurationVar(&f.softOffTimeout, "soft-off-timeout", 2*time.Minute, "soft-off: how long to wait for the OS to shut down before forcing off")
	cmd.AddCommand(newBMCPowerCmd(e, f), newBMCBootCmd(e, f), newBMCMediaCmd(e, f), newBMCInfoCmd(e, f),
		newBMCBIOSCmd(e, f), newBMCRAIDCmd(e, f), newBMCFirmwareCmd(e, f), newBMCSecureBootCmd(e, f))
	return cmd
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// withDriver connects, runs fn, and closes the driver (deleting the BMC
// session) whatever fn returned.
func withDriver(ctx context.Context, e *env, f *bmcFlags, fn func(context.Context, bmc.Driver) error) error {
	pass := ""
	if f.username != "" || f.passwordStdin {
		var err error
		if pass, err = readBMCPassword(e.stdin, f.passwordStdin); err != nil {
			return &exitError{code: 2, err: err}
		}
	}
	if f.username == "" && f.driver == "ipmi" {
		return &exitError{code: 2, err: errors.New("bmc: --username is required for ipmi")}
	}
	switch f.auth {
	case "auto", "session", "basic":
	default:
		return &exitError{code: 2, err: fmt.Errorf("bmc: --auth %q: want auto, session or basic", f.auth)}
	}
	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	if f.insecure {
		log.Warn("TLS certificate verification is off for this BMC (--insecure); pin its CA or certificate with --ca-file instead")
	}
	d, err := newDriver(f.driver, f.address, f.username, pass, f.insecure, driverOpts{auth: f.auth, caFile: f.caFile, logger: log, powerTimeout: f.timeout, softOffTimeout: f.softOffTimeout})
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("bmc: %w", err)}
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	err = fn(ctx, d)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("bmc: --timeout %s reached: %w", f.timeout, err)
	}
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer ccancel()
	return errors.Join(err, d.Close(cctx))
}

// readBMCPassword reads the BMC password from stdin (--password-stdin) or
// MACHINA_BMC_PASSWORD; never from a flag.
func readBMCPassword(stdin io.Reader, fromStdin bool) (string, error) {
	if fromStdin {
		pw, err := readPassword(stdin)
		if err != nil {
			return "", fmt.Errorf("bmc: --password-stdin: %w", err)
		}
		return pw, nil
	}
	if p := os.Getenv("MACHINA_BMC_PASSWORD"); p != "" {
		return p, nil
	}
	return "", errors.New("bmc: no password: use --password-stdin or set MACHINA_BMC_PASSWORD")
}

func newBMCPowerCmd(e *env, f *bmcFlags) *cobra.Command {
	return &cobra.Command{
		Use:       "power on|off|soft-off|reset|cycle|status",
		Short:     "Change or show chassis power (idempotent; waits until the BMC reports the state)",
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"on", "off", "soft-off", "reset", "cycle", "status"},
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] == "status" {
				return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
					ps, err := d.PowerState(ctx)
					if err != nil {
						return err
					}
					fmt.Fprintln(e.stdout, ps)
					return nil
				})
			}
			a, err := bmc.ParsePowerAction(args[0])
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
				perr := d.Power(ctx, a)
				var re *bmc.ResetError
				if perr != nil && !errors.As(perr, &re) {
					return perr
				}
				ps, err := d.PowerState(ctx)
				if err != nil {
					return err
				}
				if re != nil {
					// Accepted, and the machine is on, but nothing proves it
					// restarted: say so, never "done".
					fmt.Fprintf(e.stdout, "power %s: accepted, NOT verified (%s); now %s\n", a, re.Why, ps)
					return nil
				}
				how := ""
				if r, ok := d.(bmc.ResetEvidence); ok && (a == bmc.PowerActionReset || a == bmc.PowerActionCycle) && r.LastResetEvidence() != "" {
					how = " (verified: " + r.LastResetEvidence() + ")"
				}
				fmt.Fprintf(e.stdout, "power %s: done%s, now %s\n", a, how, ps)
				return nil
			})
		},
	}
}

func newBMCBootCmd(e *env, f *bmcFlags) *cobra.Command {
	var persistent bool
	var mode string
	cmd := &cobra.Command{
		Use:   "boot pxe|disk|cd|bios-setup|status",
		Short: "Set the boot override (next boot, or every boot with --persistent), or show it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] == "status" {
				return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
					o, err := d.BootOverride(ctx)
					if err != nil {
						return err
					}
					fmt.Fprintln(e.stdout, describeBoot(o))
					return nil
				})
			}
			dev, err := bmc.ParseBootDevice(args[0])
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			o := bmc.BootOverride{Device: dev, Persistent: persistent}
			switch mode {
			case "":
			case "uefi":
				o.Mode = bmc.BootModeUEFI
			case "bios", "legacy":
				o.Mode = bmc.BootModeLegacy
			default:
				return &exitError{code: 2, err: fmt.Errorf("bmc boot: --mode %q: want uefi or bios", mode)}
			}
			return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
				err := d.SetBootOverride(ctx, o)
				var oe *bmc.OnceError
				if errors.As(err, &oe) {
					return onceNotHonoured(f, oe)
				}
				var ke *bmc.KeptError
				if errors.As(err, &ke) {
					// The BMC changed something: say what it kept, exit 0.
					fmt.Fprintf(e.stdout, "boot override set: %s (asked %s)\n", describeBoot(ke.Got), describeBoot(o))
					fmt.Fprintf(e.stderr, "warning: %s\n", keptWarning(ke))
					return nil
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "boot override set: %s\n", describeBoot(o))
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&persistent, "persistent", false, "boot from the device every time, not only next time")
	cmd.Flags().StringVar(&mode, "mode", "", "firmware mode: uefi or bios (default: leave as is)")
	return cmd
}

// onceNotHonoured is the exit-1 error for a one-time override the BMC did
// not honour: what the BMC is set to now, and the command that undoes it.
func onceNotHonoured(f *bmcFlags, oe *bmc.OnceError) error {
	undo := fmt.Sprintf("machinactl bmc --driver %s --address %s", f.driver, f.address)
	if f.username != "" {
		undo += " --username " + f.username
	}
	undo += " boot disk --persistent"
	return &exitError{code: 1, err: fmt.Errorf("bmc boot: one-time %s override not honoured (%s): the BMC is now set to %s; to undo: %s",
		oe.Want.Device, oe.Outcome, describeBoot(oe.Got), undo)}
}

// keptWarning says, per quirk, what the BMC did not keep of ke.Want and
// what follows for the operator.
func keptWarning(ke *bmc.KeptError) string {
	var parts []string
	for _, q := range ke.Quirks {
		switch q {
		case bmc.QuirkBootFlagsNotPersistent:
			parts = append(parts, "the BMC does not keep the persistent flag (it reads back once; whether the device lasts past the next boot is up to the BMC)")
		case bmc.QuirkBootModeIgnored:
			parts = append(parts, fmt.Sprintf("the BMC ignored the boot mode %s (the firmware boots in the mode it is configured for)", ke.Want.Mode))
		case bmc.QuirkBootDeviceAtPowerOn:
			parts = append(parts, fmt.Sprintf("the BMC still reads %s while the machine runs: the new device applies at the next power-on (power off, then on; a reset does not apply it)", describeBoot(bmc.BootOverride{Device: ke.Got.Device})))
		default:
			parts = append(parts, string(q))
		}
	}
	return fmt.Sprintf("bmc boot: %s override kept only in part: %s", describeBoot(ke.Want), strings.Join(parts, "; "))
}

func describeBoot(o bmc.BootOverride) string {
	if o.Device == "" {
		return "none"
	}
	s := string(o.Device) + " once"
	if o.Persistent {
		s = string(o.Device) + " persistent"
	}
	if o.Mode != bmc.BootModeUnset {
		s += " " + string(o.Mode)
	}
	return s
}

func newBMCMediaCmd(e *env, f *bmcFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "media", Short: "Insert or eject the virtual CD"}
	var boot bool
	insert := &cobra.Command{
		Use:   "insert URL",
		Short: "Mount an ISO at URL as the virtual CD (ejecting what is there), optionally boot once from it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
				if err := d.InsertMedia(ctx, args[0]); err != nil {
					return err
				}
				fmt.Fprintln(e.stdout, "media inserted")
				if boot {
					err := d.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootCD})
					var oe *bmc.OnceError
					if errors.As(err, &oe) {
						return onceNotHonoured(f, oe)
					}
					if err != nil {
						return err
					}
					fmt.Fprintln(e.stdout, "boot override set: cd once")
				}
				return nil
			})
		},
	}
	insert.Flags().BoolVar(&boot, "boot", false, "also set the next boot to the virtual CD")
	eject := &cobra.Command{
		Use:   "eject",
		Short: "Eject the virtual CD (nothing to do when empty)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
				if err := d.EjectMedia(ctx); err != nil {
					return err
				}
				fmt.Fprintln(e.stdout, "media ejected")
				return nil
			})
		},
	}
	cmd.AddCommand(insert, eject)
	return cmd
}

func newBMCInfoCmd(e *env, f *bmcFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "info",
		Short: "Show the BMC's read model: identity, health, temperatures, power, firmware, logs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
				in, err := d.Info(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					enc := json.NewEncoder(e.stdout)
					enc.SetIndent("", "  ")
					return enc.Encode(in)
				}
				return printInfo(e.stdout, in)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return cmd
}

func printInfo(w io.Writer, in *bmc.Info) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v == "" {
			v = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\n", k, termSafe(v))
	}
	row("manufacturer", in.Manufacturer)
	row("model", in.Model)
	row("serial", in.Serial)
	row("uuid", in.UUID)
	row("bios", in.BIOSVersion)
	row("bmc firmware", in.BMCFirmware)
	row("power", string(in.Power))
	row("health", in.Health)
	row("nic macs", strings.Join(in.NICMACs, " "))
	if in.PowerWatts != nil {
		row("power draw", fmt.Sprintf("%.0f W", *in.PowerWatts))
	}
	for _, t := range in.Temperatures {
		row("temp "+t.Name, fmt.Sprintf("%.1f C %s", t.Celsius, t.Health))
	}
	for _, fw := range in.Firmware {
		row("firmware "+fw.Name, fw.Version)
	}
	for _, l := range in.Logs {
		ts := "-"
		if !l.Created.IsZero() {
			ts = l.Created.Format(time.RFC3339)
		}
		row("log "+ts, strings.TrimSpace(l.Severity+" "+l.Message))
	}
	row("missing", strings.Join(in.Missing, " "))
	return tw.Flush()
}
