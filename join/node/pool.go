package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join/spec"
)

// ErrPoolConflict: a directory path is not a directory, or a volume group
// or disk is already in use differently from what the pool asks.
var ErrPoolConflict = errors.New("existing storage conflicts with the pool")

// Runner runs a program with arguments, never through a shell, and returns
// its combined output.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// ExecRunner runs commands with os/exec, each bounded by Timeout (zero
// means 2 minutes), with LVM_SUPPRESS_FD_WARNINGS set.
type ExecRunner struct{ Timeout time.Duration }

// Run implements Runner.
func (r ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	t := r.Timeout
	if t <= 0 {
		t = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, t)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LVM_SUPPRESS_FD_WARNINGS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

// ApplyPool builds p after validating it: a dir pool is created (mode
// 0750) or accepted if it already is a directory (not a symlink); an lvm
// pool runs `vgcreate NAME DISK...` unless a volume group NAME already
// exists on exactly those disks. Disks in another VG, or a VG on other
// disks, give ErrPoolConflict. Idempotent; returns a one-line summary.
func ApplyPool(ctx context.Context, r Runner, p v1.JoinPool) (string, error) {
	if err := spec.Pool(0, p); err != nil {
		return "", fmt.Errorf("node: pool %s: %w", p.Name, err)
	}
	switch p.Type {
	case v1.PoolDir:
		fi, err := os.Lstat(p.Path)
		switch {
		case err == nil && fi.IsDir():
			return fmt.Sprintf("pool %s: directory %s already in place", p.Name, p.Path), nil
		case err == nil:
			return "", fmt.Errorf("node: pool %s: %s is a %s, not a directory: %w", p.Name, p.Path, fi.Mode().Type(), ErrPoolConflict)
		case errors.Is(err, os.ErrNotExist):
			if err := os.MkdirAll(p.Path, 0o750); err != nil {
				return "", fmt.Errorf("node: pool %s: %w", p.Name, err)
			}
			return fmt.Sprintf("pool %s: created directory %s", p.Name, p.Path), nil
		default:
			return "", fmt.Errorf("node: pool %s: %w", p.Name, err)
		}
	default: // v1.PoolLVM, validated
		out, err := r.Run(ctx, "pvs", "--noheadings", "--separator", "|", "-o", "pv_name,vg_name")
		if err != nil {
			return "", fmt.Errorf("node: pool %s: list physical volumes: %w", p.Name, err)
		}
		var inVG []string
		owner := map[string]string{}
		for line := range strings.SplitSeq(string(out), "\n") {
			pv, vg, ok := strings.Cut(strings.TrimSpace(line), "|")
			if !ok {
				continue
			}
			owner[pv] = vg
			if vg == p.Name {
				inVG = append(inVG, pv)
			}
		}
		want := slices.Sorted(slices.Values(p.Disks))
		if len(inVG) > 0 {
			slices.Sort(inVG)
			if !slices.Equal(inVG, want) {
				return "", fmt.Errorf("node: pool %s: volume group exists on %v, want %v: %w", p.Name, inVG, want, ErrPoolConflict)
			}
			return fmt.Sprintf("pool %s: volume group already on %s", p.Name, strings.Join(want, ", ")), nil
		}
		for _, d := range p.Disks {
			if vg := owner[d]; vg != "" {
				return "", fmt.Errorf("node: pool %s: %s belongs to volume group %s: %w", p.Name, d, vg, ErrPoolConflict)
			}
			fi, err := os.Stat(d)
			if err != nil {
				return "", fmt.Errorf("node: pool %s: disk %w", p.Name, err)
			}
			if fi.Mode()&os.ModeDevice == 0 {
				return "", fmt.Errorf("node: pool %s: %s is not a block device", p.Name, d)
			}
		}
		args := append([]string{p.Name}, p.Disks...)
		if _, err := r.Run(ctx, "vgcreate", args...); err != nil {
			return "", fmt.Errorf("node: pool %s: %w", p.Name, err)
		}
		return fmt.Sprintf("pool %s: created volume group on %s", p.Name, strings.Join(p.Disks, ", ")), nil
	}
}
