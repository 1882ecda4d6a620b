package images

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// InstallerKind names a distribution installer whose ISO layout Machina
// knows.
type InstallerKind string

// Installer kinds (the profile's deploy: value).
const (
	// InstallerAutoinstall is Ubuntu Server's live-server ISO (subiquity):
	// kernel casper/vmlinuz, initrd casper/initrd; the installer then
	// downloads the whole ISO itself (casper's url=).
	InstallerAutoinstall InstallerKind = "autoinstall"
	// InstallerKickstart is a RHEL-family DVD or boot ISO (anaconda): kernel
	// images/pxeboot/vmlinuz, initrd images/pxeboot/initrd.img; the whole
	// tree is extracted, since anaconda reads its runtime image
	// (inst.stage2: .treeinfo, images/install.img) and packages
	// (inst.repo) from a directory tree, not from an ISO URL.
	InstallerKickstart InstallerKind = "kickstart"
)

// Kernel and Initrd return the paths of the installer's boot files inside
// its ISO (and inside the tree [Store.InstallerTree] extracts), without a
// leading slash; "" for an unknown kind.
func (k InstallerKind) Kernel() string {
	return map[InstallerKind]string{InstallerAutoinstall: "casper/vmlinuz", InstallerKickstart: "images/pxeboot/vmlinuz"}[k]
}

// Initrd: see [InstallerKind.Kernel].
func (k InstallerKind) Initrd() string {
	return map[InstallerKind]string{InstallerAutoinstall: "casper/initrd", InstallerKickstart: "images/pxeboot/initrd.img"}[k]
}

// ErrNotInstaller: the image is not an installer ISO of the asked kind
// (not an ISO, or the kernel or initrd is missing from it).
var ErrNotInstaller = errors.New("not an installer ISO")

// extractMu serialises extractions (one xorriso at a time per process).
var extractMu sync.Mutex

// installerDir is where the tree of the ISO with raw digest hex for kind
// lives: installer/<hex>-<kind>.
func (s *Store) installerDir(hex string, kind InstallerKind) string {
	return filepath.Join(s.root, "installer", hex+"-"+string(kind))
}

// InstallerReady returns the extracted tree of verified image name for kind,
// or an error when it is not extracted yet (ErrNotFound) or name is not
// verified. It does not extract; see [Store.InstallerTree].
func (s *Store) InstallerReady(name string, kind InstallerKind) (string, error) {
	rec, ok := s.verified(name)
	if !ok {
		return "", fmt.Errorf("installer tree %s: image not verified: %w", name, ErrNotFound)
	}
	if kind.Kernel() == "" {
		return "", fmt.Errorf("installer tree %s: kind %q: %w", name, kind, ErrNotInstaller)
	}
	dir := s.installerDir(rec.Raw.Hex, kind)
	for _, f := range []string{kind.Kernel(), kind.Initrd()} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || !st.Mode().IsRegular() {
			return "", fmt.Errorf("installer tree %s: %s not extracted: %w", name, f, ErrNotFound)
		}
	}
	return dir, nil
}

// InstallerTree returns the directory holding the boot files (and for
// kickstart the whole tree) of the verified installer ISO name, extracting
// them on first use with xorriso (Debian's xorriso package:
// `xorriso -osirrox on -indev ISO -extract SRC DST`, run without a shell;
// every argument is a store path or a fixed ISO path). The result is cached
// by the ISO's raw digest, so a refreshed ISO is extracted again. Errors:
// ErrNotFound (image not verified), ErrNotInstaller (not an ISO, or the
// kind's kernel or initrd is missing), or xorriso's failure with its output.
func (s *Store) InstallerTree(ctx context.Context, name string, kind InstallerKind) (string, error) {
	if dir, err := s.InstallerReady(name, kind); err == nil {
		return dir, nil
	}
	rec, ok := s.verified(name)
	if !ok {
		return "", fmt.Errorf("installer tree %s: image not verified: %w", name, ErrNotFound)
	}
	if kind.Kernel() == "" {
		return "", fmt.Errorf("installer tree %s: kind %q: %w", name, kind, ErrNotInstaller)
	}
	if rec.SourceFormat != FormatISO {
		return "", fmt.Errorf("installer tree %s: format %s: %w", name, rec.SourceFormat, ErrNotInstaller)
	}
	iso, err := s.BlobPath(rec.Raw)
	if err != nil {
		return "", fmt.Errorf("installer tree %s: %w", name, err)
	}
	extractMu.Lock()
	defer extractMu.Unlock()
	if dir, err := s.InstallerReady(name, kind); err == nil {
		return dir, nil // extracted while we waited
	}
	parent := filepath.Join(s.root, "installer")
	if err := os.MkdirAll(parent, 0o750); err != nil {
		return "", fmt.Errorf("installer tree %s: %w", name, err)
	}
	tmp, err := os.MkdirTemp(parent, ".extract-")
	if err != nil {
		return "", fmt.Errorf("installer tree %s: %w", name, err)
	}
	defer removeTree(tmp)
	args := []string{"-osirrox", "on", "-indev", iso}
	if kind == InstallerKickstart {
		args = append(args, "-extract", "/", tmp)
	} else {
		for _, f := range []string{kind.Kernel(), kind.Initrd()} {
			args = append(args, "-extract", "/"+f, filepath.Join(tmp, f))
		}
	}
	out, err := exec.CommandContext(ctx, "xorriso", args...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if len(msg) > 2000 {
			msg = msg[len(msg)-2000:]
		}
		if strings.Contains(msg, "Cannot determine attributes of source file") || strings.Contains(msg, "not found") {
			return "", fmt.Errorf("installer tree %s: %w: %s", name, ErrNotInstaller, msg)
		}
		return "", fmt.Errorf("installer tree %s: xorriso: %w: %s", name, err, msg)
	}
	// xorriso keeps the ISO's read-only modes: make the tree removable and
	// readable by the controller only.
	if err := filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		mode := fs.FileMode(0o640)
		if d.IsDir() {
			mode = 0o750
		}
		return os.Chmod(p, mode)
	}); err != nil {
		return "", fmt.Errorf("installer tree %s: %w", name, err)
	}
	for _, f := range []string{kind.Kernel(), kind.Initrd()} {
		if st, err := os.Stat(filepath.Join(tmp, f)); err != nil || !st.Mode().IsRegular() {
			return "", fmt.Errorf("installer tree %s: %s missing: %w", name, f, ErrNotInstaller)
		}
	}
	dir := s.installerDir(rec.Raw.Hex, kind)
	removeTree(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("installer tree %s: %w", name, err)
	}
	return dir, nil
}

// removeTree removes dir, making read-only directories writable first.
func removeTree(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o750)
		}
		return nil
	})
	_ = os.RemoveAll(dir)
}
