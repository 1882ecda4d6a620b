package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/machina-metal/machina/images"
	"github.com/spf13/cobra"
)

// newImagesCommand builds `machinactl images` with its import, list and
// catalog verbs. list asks the controller (GET /api/v1/images); import,
// and list --local, work on a local store directory (--store, env
// MACHINA_IMAGE_STORE, default ./machina-images), e.g. to prepare a store
// for a controller without internet access.
func newImagesCommand(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "images",
		Short: "Import and list OS images",
	}
	var store string
	cmd.PersistentFlags().StringVar(&store, "store", envOr("MACHINA_IMAGE_STORE", "./machina-images"), "image store directory (env MACHINA_IMAGE_STORE)")
	cmd.AddCommand(newImagesImportCommand(e, &store), newImagesListCommand(e, &store), newImagesCatalogCommand(e))
	cmd.PersistentFlags().Lookup("store").Usage = "local image store directory for import and list --local (env MACHINA_IMAGE_STORE)"
	return cmd
}

func newImagesImportCommand(e *env, store *string) *cobra.Command {
	var (
		mirror, checksum, name, arch string
		mirrorFor                    map[string]string
		quiet, verbose               bool
	)
	cmd := &cobra.Command{
		Use:   "import NAME|URL",
		Short: "Import a catalog image or an image URL into the store",
		Long: `Import a catalog image (e.g. ubuntu-24.04) or an image URL into the store.

A catalog image is fetched from upstream, or from --mirror, a base URL laid out
like upstream; --mirror-for NAME=URL overrides it for one catalog image or
family (ubuntu, debian, rocky, almalinux). A URL import needs --checksum,
either sha256:HEX / sha512:HEX or the URL of a checksum file (SHA256SUMS,
SHA512SUMS, CHECKSUM). The image is kept only if its checksum matches; qcow2
images are converted to raw.

Exit status: 0 imported (or already present), 1 refused (checksum mismatch,
unsupported format), 2 usage or I/O error.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := images.OpenStore(*store)
			if err != nil {
				return err
			}
			logger := slog.New(slog.DiscardHandler)
			if verbose {
				logger = slog.New(slog.NewTextHandler(e.stderr, nil))
			}
			im, err := images.New(images.Config{Store: st, Logger: logger, AllowFileURLs: true})
			if err != nil {
				return err
			}
			req, err := importRequest(args[0], name, arch, checksum, mirror, mirrorFor)
			if err != nil {
				return err
			}
			var bar *progressBar
			if !quiet {
				bar = &progressBar{w: e.stderr}
				req.Progress = bar.report
			}
			rec, err := im.Import(cmd.Context(), req)
			if bar != nil {
				bar.end()
			}
			if err != nil {
				if errors.Is(err, images.ErrChecksumMismatch) || errors.Is(err, images.ErrUnsupportedFormat) {
					return &exitError{code: 1, err: err}
				}
				return err
			}
			fmt.Fprintf(e.stdout, "%s: verified %s (%s, upstream %s) raw %s, %s\n",
				rec.Name, rec.Source, rec.SourceFormat, rec.Upstream, rec.Raw, humanBytes(float64(rec.SizeBytes)))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&mirror, "mirror", os.Getenv("MACHINA_MIRROR"), "base URL of a mirror laid out like upstream (env MACHINA_MIRROR)")
	f.StringToStringVar(&mirrorFor, "mirror-for", nil, "per-image or per-family mirror override, NAME=URL (repeatable)")
	f.StringVar(&checksum, "checksum", "", "sha256:HEX, sha512:HEX, or a checksum file URL")
	f.StringVar(&name, "name", "", "image name in the store (default: the catalog name)")
	f.StringVar(&arch, "arch", "amd64", "architecture for catalog images: amd64 or arm64")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	f.BoolVarP(&verbose, "verbose", "v", false, "log retries and phases to stderr")
	return cmd
}

// importRequest is the import request for arg: a URL (needs name and a
// checksum, no mirror) or a catalog image (a checksum only pins a digest).
func importRequest(arg, name, arch, checksum, mirror string, mirrorFor map[string]string) (images.Request, error) {
	req := images.Request{Name: name, Arch: arch, Mirrors: images.Mirrors{Base: mirror, PerImage: mirrorFor}}
	if strings.Contains(arg, "://") {
		req.URL = arg
		if req.Name == "" {
			return req, &exitError{code: 2, err: errors.New("images import: a URL import needs --name")}
		}
		if strings.Contains(checksum, "://") {
			req.ChecksumURL = checksum
		} else {
			req.Checksum = checksum
		}
		if mirror != "" || len(mirrorFor) > 0 {
			return req, &exitError{code: 2, err: errors.New("images import: --mirror applies to catalog images only")}
		}
	} else {
		req.Catalog = arg
		if strings.Contains(checksum, "://") {
			return req, &exitError{code: 2, err: errors.New("images import: a catalog import takes its checksum file from the catalog; --checksum may only pin a digest")}
		}
		req.Checksum = checksum
	}
	return req, nil
}

func newImagesListCommand(e *env, store *string) *cobra.Command {
	var (
		apiURL string
		local  bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the controller's images with their import state",
		Long: `List the images the controller knows (GET /api/v1/images): every image
the acting inventory's images.yaml names and every image in the controller's
store, with its state (pending, downloading, converting, verified, failed),
size, raw digest, and the last import error while the controller retries it.
The first line says which controller.

--local lists a local image store directory (--store) instead, as
"machinactl images import" fills it; that is not the controller's store.

Exit code: 0 listed, 2 the API or the store could not be read.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !local {
				return listControllerImages(cmd, e, apiURL)
			}
			st, err := images.OpenStore(*store)
			if err != nil {
				return err
			}
			recs, err := st.List()
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "Images in the local store %s (not the controller's; without --local: the controller's):\n", *store)
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tSIZE\tRAW\tREASON")
			for _, r := range recs {
				raw := r.Raw.String()
				if len(raw) > 19 {
					raw = raw[:19]
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Name, r.State, humanBytes(float64(r.SizeBytes)), raw, termSafe(r.Reason))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&apiURL, "api", envOr(envAPI, defaultAPI), "admin API base URL (env "+envAPI+"); the token comes from "+envToken)
	cmd.Flags().BoolVar(&local, "local", false, "list the local store directory (--store) instead of the controller's images")
	return cmd
}

// listControllerImages prints GET /api/v1/images as a table.
func listControllerImages(cmd *cobra.Command, e *env, apiURL string) error {
	c, err := e.apiClient(apiURL)
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("images list: %w", err)}
	}
	list, err := c.Images(cmd.Context())
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("images list: %w", err)}
	}
	fmt.Fprintf(e.stdout, "Images of the controller at %s (acting inventory and the controller's store):\n", apiURL)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tINVENTORY\tSTATE\tSIZE\tRAW\tREASON")
	for _, im := range list.Items {
		inv := "no"
		if im.InInventory {
			inv = "yes"
		}
		state := im.State
		if state == "" {
			state = "-"
		}
		if (im.State == "downloading" || im.State == "converting") && im.Percent >= 0 {
			state = fmt.Sprintf("%s %.0f%%", im.State, im.Percent)
		}
		size := "-"
		if im.SizeBytes > 0 {
			size = humanBytes(float64(im.SizeBytes))
		}
		raw := im.Digest
		if len(raw) > 19 {
			raw = raw[:19]
		}
		reason := im.Reason
		if im.ImportError != "" {
			reason = im.ImportError
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", im.Name, inv, state, size, orDash(raw), oneLine(reason, 120))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newImagesCatalogCommand(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "catalog",
		Short: "List the built-in image catalog",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := images.DefaultCatalog()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tARCHES\tUPSTREAM (amd64)\tCHECKSUM FILE")
			for _, n := range c.Names() {
				en, _ := c.Entry(n)
				s, err := c.Resolve(n, "", images.Mirrors{})
				if err != nil {
					return err
				}
				var arches []string
				for _, a := range []string{"amd64", "arm64"} {
					if _, ok := en.Arches[a]; ok {
						arches = append(arches, a)
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n, strings.Join(arches, ","), s.URL, en.ChecksumFile)
			}
			return tw.Flush()
		},
	}
}

// progressBar renders images.Progress reports on one terminal line.
type progressBar struct {
	mu    sync.Mutex
	w     io.Writer
	width int // length of the last line, to blank it
	dirty bool
}

func (b *progressBar) report(p images.Progress) {
	b.mu.Lock()
	defer b.mu.Unlock()
	const cells = 30
	line := fmt.Sprintf("%s %-8s ", p.Image, p.Phase)
	if pct := p.Percent(); pct >= 0 {
		n := int(pct / 100 * cells)
		line += "[" + strings.Repeat("=", n) + strings.Repeat(" ", cells-n) + "]" + fmt.Sprintf(" %5.1f%%", pct)
	} else {
		line += "[" + strings.Repeat("?", cells) + "]"
	}
	line += " " + humanBytes(float64(p.Bytes))
	if p.Total >= 0 {
		line += "/" + humanBytes(float64(p.Total))
	}
	if p.Rate > 0 {
		line += " " + humanBytes(p.Rate) + "/s"
	}
	if p.ETA >= 0 && !p.Done {
		line += " ETA " + p.ETA.Round(time.Second).String()
	}
	pad := ""
	if len(line) < b.width {
		pad = strings.Repeat(" ", b.width-len(line))
	}
	b.width = len(line)
	fmt.Fprint(b.w, "\r"+line+pad)
	b.dirty = true
	if p.Done {
		fmt.Fprintln(b.w)
		b.width, b.dirty = 0, false
	}
}

func (b *progressBar) end() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dirty {
		fmt.Fprintln(b.w)
		b.dirty = false
	}
}

// humanBytes formats n bytes with binary units.
func humanBytes(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f %s", n, units[i])
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}
