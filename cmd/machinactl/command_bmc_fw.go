package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/bmc"
)

// capability returns d as the optional firmware capability T, or an error
// wrapping bmc.ErrUnsupported naming what is missing (IPMI has none).
func capability[T any](d bmc.Driver, what string) (T, error) {
	c, ok := d.(T)
	if !ok {
		var zero T
		return zero, fmt.Errorf("bmc: %s: %w (the driver has no %s support)", what, bmc.ErrUnsupported, what)
	}
	return c, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// describeApply renders an ApplyResult as one line.
func describeApply(what string, r *bmc.ApplyResult) string {
	s := what + ": apply " + string(r.ApplyTime)
	if r.ResetRequired {
		s += ", reset required"
	} else {
		s += ", in effect"
	}
	if r.Task != nil && r.Task.URI != "" {
		s += " (job " + r.Task.URI + ")"
	}
	return s
}

// newBMCBIOSCmd is `machinactl bmc bios get|set`.
func newBMCBIOSCmd(e *env, f *bmcFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "bios", Short: "Read or write BIOS attributes (Redfish Bios, its settings object and AttributeRegistry)"}
	cmd.AddCommand(newBMCBIOSGetCmd(e, f), newBMCBIOSSetCmd(e, f))
	return cmd
}

// newBMCBIOSGetCmd is `machinactl bmc bios get`.
func newBMCBIOSGetCmd(e *env, f *bmcFlags) *cobra.Command {
	var asJSON bool
	get := &cobra.Command{
		Use:   "get [NAME...]",
		Short: "Print BIOS attributes (all, or those named) as NAME=VALUE, with pending values",
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
				bc, err := capability[bmc.BIOSConfigurer](d, "bios")
				if err != nil {
					return err
				}
				b, err := bc.BIOS(ctx)
				if err != nil {
					return err
				}
				if len(args) > 0 {
					keep := bmc.BIOSSettings{}
					for _, a := range args {
						v, ok := b.Attributes[a]
						if !ok {
							return &exitError{code: 1, err: fmt.Errorf("bmc: bios get: no attribute %q", a)}
						}
						keep[a] = v
					}
					b.Attributes = keep
				}
				if asJSON {
					return printJSON(e.stdout, b)
				}
				names := make([]string, 0, len(b.Attributes))
				for k := range b.Attributes {
					names = append(names, k)
				}
				sort.Strings(names)
				for _, k := range names {
					line := fmt.Sprintf("%s=%v", k, showAttr(b.Attributes[k]))
					if p, ok := b.Pending[k]; ok {
						line += fmt.Sprintf(" (pending: %v)", showAttr(p))
					}
					fmt.Fprintln(e.stdout, line)
				}
				return nil
			})
		},
	}
	get.Flags().BoolVar(&asJSON, "json", false, "print JSON (attributes, pending, registry, supported apply times)")
	return get
}

// newBMCBIOSSetCmd is `machinactl bmc bios set`.
func newBMCBIOSSetCmd(e *env, f *bmcFlags) *cobra.Command {
	var applyTime string
	set := &cobra.Command{
		Use:   "set NAME=VALUE...",
		Short: "Write BIOS settings, checked against the attribute registry; they apply at the next reset unless --apply-time says otherwise",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
				bc, err := capability[bmc.BIOSConfigurer](d, "bios")
				if err != nil {
					return err
				}
				b, err := bc.BIOS(ctx)
				if err != nil {
					return err
				}
				s := bmc.BIOSSettings{}
				for _, a := range args {
					k, v, ok := strings.Cut(a, "=")
					if !ok || k == "" {
						return &exitError{code: 2, err: fmt.Errorf("bmc: bios set: argument %q: want NAME=VALUE", a)}
					}
					s[k] = parseAttr(b.Registry, b.Attributes, k, v)
				}
				r, err := bc.SetBIOS(ctx, s, bmc.ApplyTime(applyTime))
				if err != nil {
					return err
				}
				fmt.Fprintln(e.stdout, describeApply("bios settings written", r))
				return nil
			})
		},
	}
	set.Flags().StringVar(&applyTime, "apply-time", "", "@Redfish.SettingsApplyTime: Immediate, OnReset, AtMaintenanceWindowStart, InMaintenanceWindowOnReset (default: OnReset)")
	return set
}

func showAttr(v any) any {
	if v == nil {
		return "<null>"
	}
	return v
}

// parseAttr types a command-line value by the registry (Integer, Boolean)
// or, without one, by the current value's type.
func parseAttr(reg *bmc.BIOSRegistry, cur bmc.BIOSSettings, k, v string) any {
	t := bmc.AttrString
	if a := reg.Lookup(k); a != nil {
		t = a.Type
	} else {
		switch cur[k].(type) {
		case int64:
			t = bmc.AttrInteger
		case bool:
			t = bmc.AttrBoolean
		}
	}
	switch t {
	case bmc.AttrInteger:
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
	case bmc.AttrBoolean:
		if b, err := strconv.ParseBool(v); err == nil {
			return b
		}
	}
	return v
}

// newBMCRAIDCmd is `machinactl bmc raid list|create|delete`.
func newBMCRAIDCmd(e *env, f *bmcFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "raid", Short: "List storage controllers, drives and volumes; create and delete volumes"}
	cmd.AddCommand(newBMCRAIDListCmd(e, f), newBMCRAIDCreateCmd(e, f), newBMCRAIDDeleteCmd(e, f))
	return cmd
}

// newBMCRAIDListCmd is `machinactl bmc raid list`.
func newBMCRAIDListCmd(e *env, f *bmcFlags) *cobra.Command {
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List storage controllers with their drives and volumes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
				rc, err := capability[bmc.RAIDConfigurer](d, "raid")
				if err != nil {
					return err
				}
				st, err := rc.Storage(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(e.stdout, st)
				}
				tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				for _, c := range st {
					raid := strings.Join(c.RAIDTypes, ",")
					if raid == "" {
						raid = "-"
					}
					fmt.Fprintf(tw, "controller %s\t%s\traid %s\tcreate %v\n", c.ID, c.Model, raid, c.CanCreateVolumes)
					for _, dr := range c.Drives {
						fmt.Fprintf(tw, "  drive %s\t%s %s\t%d bytes\t%s\n", dr.ID, dr.Protocol, dr.MediaType, dr.CapacityBytes, dr.Health)
					}
					for _, v := range c.Volumes {
						fmt.Fprintf(tw, "  volume %s\t%s %s\t%d bytes\tdrives %s\n", v.ID, v.Name, v.RAIDType, v.CapacityBytes, strings.Join(v.Drives, ","))
					}
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return list
}

// newBMCRAIDCreateCmd is `machinactl bmc raid create`.
func newBMCRAIDCreateCmd(e *env, f *bmcFlags) *cobra.Command {
	var req bmc.VolumeRequest
	var applyTime string
	create := &cobra.Command{
		Use:   "create --controller ID --raid RAIDn --drive ID [--drive ID...]",
		Short: "Create a volume",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
				rc, err := capability[bmc.RAIDConfigurer](d, "raid")
				if err != nil {
					return err
				}
				req.ApplyTime = bmc.ApplyTime(applyTime)
				r, err := rc.CreateVolume(ctx, req)
				if err != nil {
					return err
				}
				fmt.Fprintln(e.stdout, describeApply("volume create accepted", r))
				return nil
			})
		},
	}
	cf := create.Flags()
	cf.StringVar(&req.Controller, "controller", "", "storage controller ID (from raid list)")
	cf.StringVar(&req.RAIDType, "raid", "", "RAID type: RAID0, RAID1, RAID5, RAID6, RAID10, ...")
	cf.StringSliceVar(&req.Drives, "drive", nil, "drive ID (repeat)")
	cf.StringVar(&req.Name, "name", "", "volume name")
	cf.Int64Var(&req.CapacityBytes, "size", 0, "size in bytes (0: all the drives' space)")
	cf.StringVar(&applyTime, "apply-time", "", "@Redfish.OperationApplyTime (default: the BMC's)")
	_ = create.MarkFlagRequired("controller")
	_ = create.MarkFlagRequired("raid")
	return create
}

// newBMCRAIDDeleteCmd is `machinactl bmc raid delete`.
func newBMCRAIDDeleteCmd(e *env, f *bmcFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "delete CONTROLLER VOLUME",
		Short: "Delete a volume",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
				rc, err := capability[bmc.RAIDConfigurer](d, "raid")
				if err != nil {
					return err
				}
				r, err := rc.DeleteVolume(ctx, args[0], args[1])
				if err != nil {
					return err
				}
				fmt.Fprintln(e.stdout, describeApply("volume delete accepted", r))
				return nil
			})
		},
	}
}

// newBMCFirmwareCmd is `machinactl bmc firmware list|update`.
func newBMCFirmwareCmd(e *env, f *bmcFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "firmware", Short: "List the firmware inventory; update a component (SimpleUpdate or multipart push)"}
	cmd.AddCommand(newBMCFirmwareListCmd(e, f), newBMCFirmwareUpdateCmd(e, f))
	return cmd
}

// newBMCFirmwareListCmd is `machinactl bmc firmware list`.
func newBMCFirmwareListCmd(e *env, f *bmcFlags) *cobra.Command {
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List UpdateService.FirmwareInventory",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
				fu, err := capability[bmc.FirmwareUpdater](d, "firmware")
				if err != nil {
					return err
				}
				inv, err := fu.FirmwareInventory(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(e.stdout, inv)
				}
				tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tNAME\tVERSION\tUPDATEABLE")
				for _, c := range inv {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%v\n", c.ID, c.Name, c.Version, c.Updateable)
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return list
}

// newBMCFirmwareUpdateCmd is `machinactl bmc firmware update`.
func newBMCFirmwareUpdateCmd(e *env, f *bmcFlags) *cobra.Command {
	var file, protocol string
	var targets []string
	var noWait bool
	var poll time.Duration
	update := &cobra.Command{
		Use:   "update (IMAGE-URL | --file PATH)",
		Short: "Start an update and follow its task to the end, through the BMC restart",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 1) == (file != "") {
				return &exitError{code: 2, err: fmt.Errorf("bmc: firmware update: give an image URL or --file, not both")}
			}
			u := bmc.FirmwareUpdate{TransferProtocol: protocol, Targets: targets}
			if len(args) == 1 {
				u.ImageURI = args[0]
			} else {
				fh, err := os.Open(file)
				if err != nil {
					return &exitError{code: 2, err: fmt.Errorf("bmc: firmware update: --file: %w", err)}
				}
				defer fh.Close()
				u.Image, u.ImageName = fh, filepath.Base(file)
			}
			return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
				fu, err := capability[bmc.FirmwareUpdater](d, "firmware")
				if err != nil {
					return err
				}
				t, err := fu.UpdateFirmware(ctx, u)
				if err != nil {
					return err
				}
				if t.URI == "" || noWait {
					fmt.Fprintf(e.stdout, "update started: task %s %s\n", t.URI, t.State)
					return nil
				}
				last := -1
				done, err := bmc.WaitTask(ctx, fu, t.URI, poll, func(t *bmc.Task) {
					if t.PercentComplete != nil && *t.PercentComplete != last {
						last = *t.PercentComplete
						fmt.Fprintf(e.stderr, "task %s: %s %d%%\n", t.ID, t.State, last)
					}
				})
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "update done: task %s %s\n", done.URI, done.State)
				return nil
			})
		},
	}
	uf := update.Flags()
	uf.StringVar(&file, "file", "", "push this image file to UpdateService.MultipartHttpPushUri instead of a URL")
	uf.StringVar(&protocol, "protocol", "", "SimpleUpdate TransferProtocol (default HTTP, HTTPS for https URLs)")
	uf.StringSliceVar(&targets, "target", nil, "FirmwareInventory URI to update (repeat; default: the BMC chooses)")
	uf.BoolVar(&noWait, "no-wait", false, "print the task and return without following it")
	uf.DurationVar(&poll, "poll", 2*time.Second, "task poll interval")
	return update
}

// newBMCSecureBootCmd is `machinactl bmc secureboot [on|off]`.
func newBMCSecureBootCmd(e *env, f *bmcFlags) *cobra.Command {
	return &cobra.Command{
		Use:       "secureboot [on|off]",
		Short:     "Show UEFI Secure Boot, or turn it on or off (applies at the next reset)",
		Args:      cobra.MaximumNArgs(1),
		ValidArgs: []string{"on", "off"},
		RunE: func(cmd *cobra.Command, args []string) error {
			want := false
			if len(args) == 1 {
				switch args[0] {
				case "on":
					want = true
				case "off":
				default:
					return &exitError{code: 2, err: fmt.Errorf("bmc: secureboot: %q: want on or off", args[0])}
				}
			}
			return withDriver(cmd.Context(), e, f, func(ctx context.Context, d bmc.Driver) error {
				sc, err := capability[bmc.SecureBootConfigurer](d, "secureboot")
				if err != nil {
					return err
				}
				if len(args) == 1 {
					r, err := sc.SetSecureBoot(ctx, want)
					if err != nil {
						return err
					}
					fmt.Fprintln(e.stdout, describeApply("secureboot "+args[0], r))
					return nil
				}
				sb, err := sc.SecureBoot(ctx)
				if err != nil {
					return err
				}
				en := "off"
				if sb.Enable {
					en = "on"
				}
				cur, mode := sb.CurrentBoot, string(sb.Mode)
				if cur == "" {
					cur = "-"
				}
				if mode == "" {
					mode = "-"
				}
				fmt.Fprintf(e.stdout, "secureboot %s (current boot %s, mode %s)\n", en, cur, mode)
				return nil
			})
		},
	}
}
