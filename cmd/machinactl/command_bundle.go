package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
)

// bundleInstall is the bundle's entry point: `./install --join URL TOKEN`
// (or TOKEN "-" to read it from stdin, or MACHINA_JOIN_TOKEN).
const bundleInstall = `#!/bin/sh
# Offline Machina install: ./install --join URL TOKEN   (TOKEN "-" reads stdin)
set -eu
d="$(cd "$(dirname "$0")" && pwd)"
exec sh "$d/install.sh" --bundle "$d" "$@"
`

// newBundleCmd is `machinactl bundle --node-binary PATH -o FILE`: an
// offline tarball with machina-node, the install script (checksum
// verified), the CA and its pinned fingerprint.
func newBundleCmd(e *env) *cobra.Command {
	var apiURL, nodeBinary, out string
	cmd := &cobra.Command{
		Use:   "bundle --node-binary PATH [-o machina-bundle.tar.gz]",
		Short: "Write an offline install tarball (machina-node, install script, CA)",
		Long: "The tarball unpacks into machina-bundle/; on the host run\n" +
			"  sudo ./machina-bundle/install --join https://CONTROLLER:8443 TOKEN\n" +
			"(TOKEN \"-\" reads it from stdin). The installer checks the CA against the fingerprint in the bundle.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if nodeBinary == "" {
				return &exitError{code: 2, err: errors.New("bundle: --node-binary is required")}
			}
			c, err := e.apiClient(apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("bundle: %w", err)}
			}
			in, err := fetchInstaller(cmd.Context(), c)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("bundle: %w", err)}
			}
			bin, err := os.ReadFile(nodeBinary)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("bundle: %w", err)}
			}
			if err := writeBundle(out, in, bin); err != nil {
				return &exitError{code: 2, err: fmt.Errorf("bundle: %w", err)}
			}
			fmt.Fprintf(e.stdout, "wrote %s (CA %s, script %s)\n", out, in.info.CAFingerprint, in.info.ScriptSHA256)
			return nil
		},
	}
	cmd.Flags().StringVar(&apiURL, "api", apiFlagDefault(), "admin API base URL (env "+envAPI+"); the token comes from "+envToken)
	cmd.Flags().StringVar(&nodeBinary, "node-binary", "", "the machina-node executable to ship")
	cmd.Flags().StringVarP(&out, "output", "o", "machina-bundle.tar.gz", "tarball to write")
	return cmd
}

func writeBundle(path string, in installer, bin []byte) (err error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	now := time.Now().UTC().Truncate(time.Second)
	files := []struct {
		name string
		mode int64
		data []byte
	}{
		{"install", 0o755, []byte(bundleInstall)},
		{"install.sh", 0o755, in.script},
		{"machina-node", 0o755, bin},
		{"ca.pem", 0o644, []byte(in.info.CA)},
		{"ca.sha256", 0o644, []byte(in.info.CAFingerprint + "\n")},
	}
	if err := tw.WriteHeader(&tar.Header{Name: "machina-bundle/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now}); err != nil {
		return err
	}
	for _, fl := range files {
		h := &tar.Header{Name: filepath.Join("machina-bundle", fl.name), Mode: fl.mode, Size: int64(len(fl.data)), ModTime: now, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, bytes.NewReader(fl.data)); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
