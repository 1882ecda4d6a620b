package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/inventory"
)

// newValidateCmd is `machinactl validate [DIR]`: exit 0 valid, 1 invalid
// (or warnings with --strict), 2 usage or I/O error.
func newValidateCmd(e *env) *cobra.Command {
	var format string
	var strict bool
	var maxFile int64
	var base string
	cmd := &cobra.Command{
		Use:   "validate [DIR]",
		Short: "Validate an inventory repository (servers.yaml, profiles.yaml, images.yaml)",
		Long: `Validate the inventory files at the root of DIR (default ".") against
Machina's JSON Schemas and the cross-file rules. Every problem is printed at
once as FILE:LINE:COL: PATH: MESSAGE, sorted.

Exit status: 0 valid, 1 invalid (or warnings with --strict), 2 usage or I/O error.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "."
			if len(args) == 1 {
				dir = args[0]
			}
			switch format {
			case "text", "json", "github":
			default:
				return &exitError{code: 2, err: fmt.Errorf("--format %q: want text, json or github", format)}
			}
			if st, err := os.Stat(dir); err != nil || !st.IsDir() {
				if err == nil {
					err = errors.New("not a directory")
				}
				return &exitError{code: 2, err: fmt.Errorf("validate %s: %w", dir, err)}
			}
			if e.tuneGC != nil {
				e.tuneGC(inventoryBytes(dir))
			}
			res, err := inventory.Load(os.DirFS(dir), inventory.Limits{MaxFileBytes: maxFile})
			var verr *inventory.ValidationError
			if err != nil && !errors.As(err, &verr) {
				return &exitError{code: 2, err: err}
			}
			rep := report{Dir: dir}
			if verr != nil {
				rep.Errors, rep.Warnings = verr.Errors, verr.Warnings
			}
			if base != "" {
				// status/ belongs to the controller: a change that edits it
				// by hand is refused.
				var sed *gitops.StatusEditError
				switch err := gitops.CheckStatusUntouched(dir, base, "HEAD"); {
				case errors.As(err, &sed):
					for _, p := range sed.Paths {
						rep.Errors = append(rep.Errors, inventory.FieldError{File: p, Msg: "edited by hand; status/ is written by the controller only", Severity: inventory.SeverityError})
					}
				case err != nil:
					return &exitError{code: 2, err: fmt.Errorf("--base %s: %w", base, err)}
				}
			}
			if len(rep.Errors) == 0 && res != nil {
				rep.Valid = true
				rep.Warnings = res.Warnings
				rep.Digest = res.Inventory.Digest
				rep.Servers, rep.Profiles, rep.Images = len(res.Inventory.Servers), len(res.Inventory.Profiles), len(res.Inventory.Images)
			}
			if err := rep.write(e.stdout, format); err != nil {
				return &exitError{code: 2, err: err}
			}
			if !rep.Valid || (strict && len(rep.Warnings) > 0) {
				return &exitError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&format, "format", "text", "output format: text, json or github (GitHub Actions annotations, then the plain list)")
	cmd.Flags().BoolVar(&strict, "strict", false, "fail on warnings too")
	cmd.Flags().StringVar(&base, "base", "", "also refuse hand edits of status/ between this revision (e.g. origin/main) and HEAD")
	cmd.Flags().Int64Var(&maxFile, "max-file-size", 16<<20, "refuse inventory files larger than this many bytes")
	return cmd
}

// inventoryBytes is the size of the inventory files at the root of dir,
// those that exist.
func inventoryBytes(dir string) int64 {
	var n int64
	for _, f := range []string{inventory.ServersFile, inventory.ProfilesFile, inventory.ImagesFile, inventory.NetworksFile} {
		if st, err := os.Stat(filepath.Join(dir, f)); err == nil && st.Mode().IsRegular() {
			n += st.Size()
		}
	}
	return n
}

// gcSettings is the garbage collector's setting for validating yamlBytes
// of inventory in a process that exits right after: GOGC 400, so the heap
// may grow to five times what is live between collections instead of
// twice, capped by a soft memory limit of 48 bytes per byte of YAML and at
// least 160 MiB. Loading keeps about 50 bytes live per byte of YAML at its
// peak (a 3 MB inventory of 10,000 servers peaks near 150 MiB), so the
// limit, not GOGC, sets when the collector runs on a large inventory: it
// collects less often than GOGC 100 would, and never thrashes below a
// live heap the inventory needs anyway.
func gcSettings(yamlBytes int64) (percent int, limit int64) {
	return 400, max(160<<20, 48*yamlBytes)
}

// tuneGC applies gcSettings unless GOGC or GOMEMLIMIT is set in the
// environment: an operator's own setting wins.
func tuneGC(yamlBytes int64) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	percent, limit := gcSettings(yamlBytes)
	debug.SetGCPercent(percent)
	debug.SetMemoryLimit(limit)
}

// report is the outcome of one validation, in every output format.
type report struct {
	Dir      string                 `json:"dir"`
	Valid    bool                   `json:"valid"`
	Digest   string                 `json:"digest,omitempty"`
	Servers  int                    `json:"servers"`
	Profiles int                    `json:"profiles"`
	Images   int                    `json:"images"`
	Errors   []inventory.FieldError `json:"errors"`
	Warnings []inventory.FieldError `json:"warnings"`
}

func (r *report) write(w io.Writer, format string) error {
	if r.Errors == nil {
		r.Errors = []inventory.FieldError{}
	}
	if r.Warnings == nil {
		r.Warnings = []inventory.FieldError{}
	}
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	case "github":
		// GitHub shows only the first few annotations of a step, so the
		// plain list follows.
		for _, p := range append(append([]inventory.FieldError{}, r.Errors...), r.Warnings...) {
			level := "error"
			if p.Severity == inventory.SeverityWarning {
				level = "warning"
			}
			file := filepath.ToSlash(filepath.Join(r.Dir, p.File))
			fmt.Fprintf(w, "::%s file=%s,line=%d,col=%d,title=%s::%s\n", level,
				ghProp(file), max(p.Line, 1), max(p.Col, 1), ghProp(titleOf(p)), ghData(p.Msg))
		}
	}
	var b strings.Builder
	for _, p := range r.Errors {
		b.WriteString(p.Error() + "\n")
	}
	for _, p := range r.Warnings {
		b.WriteString(p.Error() + "\n")
	}
	if r.Valid {
		fmt.Fprintf(&b, "%s: valid: %s, %s, %s, %s (digest %s)\n", r.Dir, plural(r.Servers, "server"), plural(r.Profiles, "profile"), plural(r.Images, "image"), plural(len(r.Warnings), "warning"), r.Digest)
	} else {
		fmt.Fprintf(&b, "%s: invalid: %s, %s\n", r.Dir, plural(len(r.Errors), "error"), plural(len(r.Warnings), "warning"))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func titleOf(p inventory.FieldError) string {
	if p.Path != "" {
		return p.Path
	}
	return "inventory"
}

// ghData escapes a workflow-command message (GitHub Actions
// "workflow commands": %, CR and LF are percent-encoded).
func ghData(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A").Replace(s)
}

// ghProp escapes a workflow-command property value (also ':' and ',').
func ghProp(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A", ":", "%3A", ",", "%2C").Replace(s)
}

// plural is "1 error", "2 errors", "0 errors": n and the noun, with an s
// unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
