package main

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/inventory"
)

// newInventoryCmd is `machinactl inventory show [DIR]`: validates DIR and
// prints its servers, profiles and images as tables.
func newInventoryCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "inventory", Short: "Inspect an inventory repository"}
	show := &cobra.Command{
		Use:   "show [DIR]",
		Short: "Validate DIR and print its servers, profiles and images",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "."
			if len(args) == 1 {
				dir = args[0]
			}
			res, err := inventory.Load(os.DirFS(dir), inventory.Limits{})
			var verr *inventory.ValidationError
			if errors.As(err, &verr) {
				for _, p := range verr.Errors {
					fmt.Fprintln(e.stderr, p.Error())
				}
				return &exitError{code: 1, err: fmt.Errorf("%s: invalid inventory (%s); see machinactl validate", dir, plural(len(verr.Errors), "error"))}
			}
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			inv := res.Inventory
			w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "SERVER\tZONE\tRACK\tBOOT MAC\tMODE\tBMC\tWANT\tPROFILE\n")
			for _, s := range inv.Servers {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s %s\t%s\t%s\n", s.Name, s.Zone, dash(s.Rack), s.BootMAC, s.BootMode, s.BMC.Driver, s.BMC.Address, s.Want, dash(s.Profile))
			}
			fmt.Fprintln(w)
			fmt.Fprintf(w, "PROFILE\tIMAGE\tDEPLOY\tZONE\tMIN (cores/GiB/GiB)\tCOUNT\tJOIN TAGS\n")
			for _, p := range inv.Profiles {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d/%d/%d\t%d\t%s\n", p.Name, p.Image, p.Deploy, dash(p.Zone), p.Min.Cores, p.Min.MemoryGiB, p.Min.DiskGiB, p.Count, dash(strings.Join(p.Join.Tags, ",")))
			}
			fmt.Fprintln(w)
			fmt.Fprintf(w, "IMAGE\tSOURCE\tARCH\n")
			for _, im := range inv.Images {
				src := "catalog " + im.Catalog
				if im.URL != "" {
					src = im.URL
				}
				fmt.Fprintf(w, "%s\t%s\t%s\n", im.Name, src, im.Arch)
			}
			if err := w.Flush(); err != nil {
				return &exitError{code: 2, err: err}
			}
			zones := map[string]int{}
			for _, s := range inv.Servers {
				zones[s.Zone]++
			}
			var zs []string
			for z, n := range zones {
				zs = append(zs, fmt.Sprintf("%s=%d", z, n))
			}
			sort.Strings(zs)
			fmt.Fprintf(e.stdout, "\n%d servers (%s), %d profiles, %d images; digest %s\n", len(inv.Servers), strings.Join(zs, " "), len(inv.Profiles), len(inv.Images), inv.Digest)
			return nil
		},
	}
	cmd.AddCommand(show)
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
