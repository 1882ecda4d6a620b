// Package osimage builds and caches the VM lab's OS image: a minimal
// Debian 12 made with debootstrap from Debian's packages, with a kernel
// (linux-image-amd64, signed by Debian), syslinux for BIOS, Debian's
// signed shim and GRUB at the UEFI removable-media path (it boots with
// Secure Boot on or off), cloud-init (NoCloud datasource first) and
// openssh-server, as a 512 MiB sparse raw disk image (kernel modules for
// hardware no lab VM has are removed, so the root fits).
// The layout and contents are documented in build.sh, which is embedded and
// run as root.
//
// The image is built once per version of build.sh and kept outside the
// repository, in <cacheDir>/<Key()>/ with os.img, SHA256SUMS (sha256sum
// format) and kernel-version. It is what the lab imports through the normal
// image import path, and what a deployed lab VM boots from its disk.
//
// The package imports no other project package.
package osimage

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

//go:embed build.sh
var buildScript []byte

// File names inside the cache entry directory.
const (
	// ImageFile is the raw disk image.
	ImageFile = "os.img"
	// SumsFile is the checksum list, one "<sha256 hex>  os.img" line, as
	// written by sha256sum(1) and read by the image import's checksumURL.
	SumsFile = "SHA256SUMS"
	// KernelVersionFile holds the installed kernel's version, e.g. "6.1.0-50-amd64".
	KernelVersionFile = "kernel-version"
)

// Boot facts of the image, for tests and the lab harness.
const (
	// Hostname is the image's hostname before cloud-init sets one.
	Hostname = "machina-os"
	// RootUUID is the ext4 root file system UUID (fixed at build time).
	RootUUID = "6d616368-696e-4120-8f73-696d61676521"
	// SizeBytes is the apparent size of the raw image (512 MiB). A deploy
	// grows the root partition to the target disk.
	SizeBytes = 512 << 20
)

// Errors.
var (
	// ErrNotRoot is returned by Ensure when a build is needed and the
	// process is not root (debootstrap and chroot need it).
	ErrNotRoot = errors.New("osimage: building the image needs root")
	// ErrBadSums is returned when SHA256SUMS is missing its os.img line or
	// is malformed.
	ErrBadSums = errors.New("osimage: malformed SHA256SUMS")
	// ErrChecksum is returned by Verify when the image's sha256 differs.
	ErrChecksum = errors.New("osimage: checksum mismatch")
)

// Key identifies the build inputs: the first 16 hex digits of the sha256 of
// the embedded build.sh. Any change to the script makes a new cache entry.
func Key() string {
	h := sha256.Sum256(buildScript)
	return hex.EncodeToString(h[:8])
}

// DefaultCacheDir is ${XDG_CACHE_HOME:-$HOME/.cache}/machina/os-image, or
// os.TempDir()/machina/os-image if neither is set.
func DefaultCacheDir() string {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		if home, err := os.UserHomeDir(); err == nil && home != "" {
			base = filepath.Join(home, ".cache")
		} else {
			base = os.TempDir()
		}
	}
	return filepath.Join(base, "machina", "os-image")
}

// Ensure returns the path of the cached image and its sha256 (lowercase
// hex), building it first if the cache entry for Key() is missing. cacheDir
// "" means DefaultCacheDir(). Concurrent callers (goroutines or processes)
// serialise on an flock of <cacheDir>/<Key()>.lock, so the image is built
// once. A build takes a few minutes and needs root and the Debian mirror
// that the host's apt uses; ctx cancels it (the partial build is removed).
// A cached entry is trusted as is; use Verify to re-hash it.
func Ensure(ctx context.Context, cacheDir string) (path, sha256hex string, err error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	dir := filepath.Join(cacheDir, Key())
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", "", fmt.Errorf("osimage: ensure: %w", err)
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", "", fmt.Errorf("osimage: ensure: %w", err)
	}
	defer lock.Close()
	if err := flock(ctx, lock); err != nil {
		return "", "", fmt.Errorf("osimage: ensure: lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	path = filepath.Join(dir, ImageFile)
	if sum, err := ReadSums(filepath.Join(dir, SumsFile)); err == nil {
		if _, err := os.Stat(path); err == nil {
			return path, sum, nil
		}
	}
	if os.Geteuid() != 0 {
		return "", "", ErrNotRoot
	}
	if err := build(ctx, dir); err != nil {
		return "", "", err
	}
	sum, err := ReadSums(filepath.Join(dir, SumsFile))
	if err != nil {
		return "", "", fmt.Errorf("osimage: ensure: %w", err)
	}
	return path, sum, nil
}

// flock takes an exclusive lock, retrying a non-blocking flock every
// 250ms (a build holds it for minutes) until ctx ends.
func flock(ctx context.Context, f *os.File) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func build(ctx context.Context, dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("osimage: build: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("osimage: build: %w", err)
	}
	script := filepath.Join(dir, ".build.sh")
	if err := os.WriteFile(script, buildScript, 0o755); err != nil {
		return fmt.Errorf("osimage: build: %w", err)
	}
	defer os.Remove(script)
	cmd := exec.CommandContext(ctx, "sh", script, dir)
	var out tailBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// sh's trap removes the scratch tree and unmounts on SIGTERM.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	if err := cmd.Run(); err != nil {
		_ = os.Remove(filepath.Join(dir, SumsFile))
		return fmt.Errorf("osimage: build: %w\n%s", err, out.String())
	}
	return nil
}

// tailBuffer keeps the last 8 KiB written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 8<<10 {
		t.b = t.b[len(t.b)-8<<10:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }

var sumLine = regexp.MustCompile(`^([0-9a-f]{64}) [ *]` + regexp.QuoteMeta(ImageFile) + `$`)

// ReadSums returns the sha256 of os.img from a SHA256SUMS file, or
// ErrBadSums.
func ReadSums(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if m := sumLine.FindStringSubmatch(strings.TrimSpace(sc.Text())); m != nil {
			return m[1], nil
		}
	}
	return "", fmt.Errorf("%w: %s", ErrBadSums, path)
}

// Verify hashes the file at path (every byte, holes included) and returns
// ErrChecksum if it differs from want (lowercase hex).
func Verify(path, want string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("osimage: verify: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, f, make([]byte, 4<<20)); err != nil {
		return fmt.Errorf("osimage: verify: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%w: %s is %s, want %s", ErrChecksum, path, got, want)
	}
	return nil
}
