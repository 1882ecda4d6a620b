package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// Storage layout steps, as a failure names them (v1.DeployResult
// FailedStep).
const (
	StepResolve   = "resolve"          // match the plan's disks to the disks found
	StepClear     = "clear-signatures" // zero the head and tail of every disk the layout takes
	StepMDCreate  = "mdadm-create"     // the RAID1 of the root, and of each volume group on one
	StepWrite     = "write-image"      // the verified image write and seed
	StepPartition = "partition"        // the root partition grown, the rest made a PV partition
	StepPVCreate  = "pvcreate"
	StepVGCreate  = "vgcreate"
	StepLVCreate  = "lvcreate"
	StepMkfs      = "mkfs"
	StepGrowRoot  = "grow-root"  // the root filesystem grown to its partition
	StepOSConfig  = "os-config"  // mdadm.conf and fstab written into the deployed OS
	StepSettle    = "settle"     // volume groups deactivated, the array stopped
	StepSpoil     = "spoil-root" // after a failure: the root device made unbootable
)

// RootArrayName is the md array's name (mdadm --name) and its
// /dev/md/ link: the deployed OS's mdadm.conf names it.
const RootArrayName = "machina-root"

// GroupArrayName is the md array name (and /dev/md/ link) of the RAID1 a
// volume group lies on: "machina-" and the group's name, at most
// groupArrayMaxName characters so that "any:" and it fit the 32-byte
// name of md's version-1 superblock.
func GroupArrayName(vg string) string { return "machina-" + vg }

const groupArrayMaxName = 19

// LayoutError is a failed storage layout step: which step, on which device
// (a stable identity, an md array or a volume group), and why.
type LayoutError struct {
	Step   string
	Device string
	Err    error
}

func (e *LayoutError) Error() string {
	return fmt.Sprintf("layout step %s on %s: %v", e.Step, e.Device, e.Err)
}

func (e *LayoutError) Unwrap() error { return e.Err }

func stepErr(step, dev string, err error) error {
	if err == nil {
		return nil
	}
	return &LayoutError{Step: step, Device: dev, Err: err}
}

// Commander runs one of the ramdisk's tools (mdadm, lvm, mkfs.*) with argv
// and returns its combined output. The agent builds argv only from
// validated values (kernel device names, checked LVM names, sizes in
// bytes), never through a shell.
type Commander func(ctx context.Context, name string, args ...string) ([]byte, error)

// ToolTimeout bounds each tool the layout runs.
const ToolTimeout = 10 * time.Minute

// ToolPath is where the ramdisk's tools are looked up: the kernel starts
// /init with no PATH, and a tool is never taken from anywhere else.
const ToolPath = "/usr/sbin:/usr/bin:/sbin:/bin"

// ExecCommander runs tools found on ToolPath with exec under ToolTimeout,
// with PATH=ToolPath and env added to the agent's environment
// (LVM_SYSTEM_DIR names the ramdisk's udev-free lvm.conf).
func ExecCommander(env []string) Commander {
	return func(ctx context.Context, name string, args ...string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(ctx, ToolTimeout)
		defer cancel()
		bin := ""
		for _, d := range strings.Split(ToolPath, ":") {
			if st, err := os.Stat(d + "/" + name); err == nil && st.Mode().IsRegular() {
				bin = d + "/" + name
				break
			}
		}
		if bin == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("%s: not in the ramdisk (%s)", name, ToolPath)
		}
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(append(os.Environ(), "PATH="+ToolPath), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, lastLines(out, 4))
		}
		return out, nil
	}
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// ResolvedLayout is a StoragePlan matched to the disks found: the root's
// disks and each volume group's disks, as kernel devices.
type ResolvedLayout struct {
	Plan   v1.StoragePlan
	Root   []v1.Disk
	Groups [][]v1.Disk
}

var (
	kernelNameRe = regexp.MustCompile(`^[a-z][a-z0-9]{1,31}$`)
	lvmNameRe    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)
	mountRe      = regexp.MustCompile(`^(/[A-Za-z0-9._-]+)+$`)
)

// CheckStoragePlan validates every value of p that reaches a command line
// or a file of the deployed OS: RAID "" or raid1 with one or two disks,
// each disk named by a stable identity, LVM names (lvm(8) VALID NAMES,
// without the reserved prefixes), a group on a RAID1 on exactly two disks
// (not on the rest) with a name its array name can hold, sizes,
// filesystems, mount points.
func CheckStoragePlan(p v1.StoragePlan) error {
	want := 1
	if p.Root.RAID == v1.StorageRAID1 {
		want = 2
	} else if p.Root.RAID != "" {
		return fmt.Errorf("storage plan: root raid %q: want raid1 or none", p.Root.RAID)
	}
	if len(p.Root.Disks) != want || p.Root.SizeBytes < 0 {
		return fmt.Errorf("storage plan: root has %d disks (want %d), size %d", len(p.Root.Disks), want, p.Root.SizeBytes)
	}
	rest := 0
	for _, g := range p.VolumeGroups {
		if err := lvmName(g.Name); err != nil {
			return fmt.Errorf("storage plan: volume group: %w", err)
		}
		if g.Rest {
			rest++
		}
		if g.Rest == (len(g.Disks) > 0) || (g.Rest && p.Root.SizeBytes == 0) {
			return fmt.Errorf("storage plan: volume group %s: on the rest of a root with a size, or on disks", g.Name)
		}
		switch g.RAID {
		case "":
		case v1.StorageRAID1:
			if len(g.Disks) != 2 || len(g.Name) > groupArrayMaxName {
				return fmt.Errorf("storage plan: volume group %s on raid1: %d disks (want 2), name of %d characters (at most %d)", g.Name, len(g.Disks), len(g.Name), groupArrayMaxName)
			}
		default:
			return fmt.Errorf("storage plan: volume group %s: raid %q: want raid1 or none", g.Name, g.RAID)
		}
		for i, v := range g.Volumes {
			if err := lvmName(v.Name); err != nil {
				return fmt.Errorf("storage plan: volume group %s: %w", g.Name, err)
			}
			if v.SizeBytes < 0 || (v.SizeBytes == 0 && i != len(g.Volumes)-1) {
				return fmt.Errorf("storage plan: %s/%s: size %d", g.Name, v.Name, v.SizeBytes)
			}
			switch v.Filesystem {
			case "", "swap", "ext4", "xfs":
			default:
				return fmt.Errorf("storage plan: %s/%s: filesystem %q", g.Name, v.Name, v.Filesystem)
			}
			if v.MountPoint != "" && (v.Filesystem == "" || v.Filesystem == "swap" || !mountRe.MatchString(v.MountPoint) || path.Clean(v.MountPoint) != v.MountPoint || strings.Contains(v.MountPoint, "/..")) {
				return fmt.Errorf("storage plan: %s/%s: mount point %q", g.Name, v.Name, v.MountPoint)
			}
		}
	}
	if rest > 1 {
		return errors.New("storage plan: more than one volume group on the rest")
	}
	return nil
}

func lvmName(s string) error {
	if !lvmNameRe.MatchString(s) || strings.HasPrefix(s, "snapshot") || strings.HasPrefix(s, "pvmove") {
		return fmt.Errorf("name %q is not a valid LVM name", s)
	}
	return nil
}

// refID is how a failure names a planned disk.
func refID(r v1.StorageDiskRef) string { return firstNonEmpty(r.ByPath, r.WWN, r.Serial, r.Name) }

// refMatches reports whether disk d is the disk r names: by r's by-path,
// else its WWN (wwnEqual), else its serial (case-insensitive), the first r
// sets; a reference with none of them matches no disk.
func refMatches(r v1.StorageDiskRef, d v1.Disk) bool {
	switch {
	case r.ByPath != "":
		return d.ByPath == r.ByPath
	case r.WWN != "":
		return wwnEqual(d.WWN, r.WWN)
	case r.Serial != "":
		return strings.EqualFold(d.Serial, r.Serial)
	}
	return false
}

// ResolveLayout matches each planned disk to exactly one disk found, by
// its by-path, WWN or serial (the first the plan sets), and requires the
// size commissioning reported: a disk that changed (swapped, smaller)
// since commissioning refuses the whole layout before anything is written.
// Ineligible disks (the ramdisk's source, read-only, removable, USB,
// virtual media) and a disk named twice are refused too.
func ResolveLayout(p v1.StoragePlan, disks []v1.Disk, exclude map[string]bool) (ResolvedLayout, error) {
	res := ResolvedLayout{Plan: p}
	if err := CheckStoragePlan(p); err != nil {
		return res, stepErr(StepResolve, "plan", err)
	}
	taken := map[string]bool{}
	find := func(r v1.StorageDiskRef) (v1.Disk, error) {
		var got []v1.Disk
		for _, d := range disks {
			if refMatches(r, d) {
				got = append(got, d)
			}
		}
		switch {
		case r.ByPath == "" && r.WWN == "" && r.Serial == "":
			return v1.Disk{}, stepErr(StepResolve, r.Name, errors.New("the plan names this disk by kernel name only (not stable across boots)"))
		case len(got) == 0:
			return v1.Disk{}, stepErr(StepResolve, refID(r), errors.New("no such disk found"))
		case len(got) > 1:
			return v1.Disk{}, stepErr(StepResolve, refID(r), fmt.Errorf("%w: %s", ErrAmbiguousDisk, names(got)))
		}
		d := got[0]
		if why := ineligible(d, exclude); why != "" {
			return v1.Disk{}, stepErr(StepResolve, refID(r), fmt.Errorf("disk %s is not writable: %s", d.Name, why))
		}
		if d.SizeBytes != r.SizeBytes {
			return v1.Disk{}, stepErr(StepResolve, refID(r), fmt.Errorf("disk %s is %d bytes, commissioning reported %d: recommission", d.Name, d.SizeBytes, r.SizeBytes))
		}
		if !kernelNameRe.MatchString(d.Name) || taken[d.Name] {
			return v1.Disk{}, stepErr(StepResolve, refID(r), fmt.Errorf("disk %s named twice or not a kernel disk name", d.Name))
		}
		taken[d.Name] = true
		return d, nil
	}
	for _, r := range p.Root.Disks {
		d, err := find(r)
		if err != nil {
			return res, err
		}
		res.Root = append(res.Root, d)
	}
	for _, g := range p.VolumeGroups {
		var ds []v1.Disk
		for _, r := range g.Disks {
			d, err := find(r)
			if err != nil {
				return res, err
			}
			ds = append(ds, d)
		}
		res.Groups = append(res.Groups, ds)
	}
	return res, nil
}

// partName is the kernel name of partition n of disk (vdb2, nvme0n1p2,
// md127p2).
func partName(disk string, n int) string {
	if last := disk[len(disk)-1]; last >= '0' && last <= '9' {
		return disk + "p" + strconv.Itoa(n)
	}
	return disk + strconv.Itoa(n)
}

// waitNode polls for a device node (devtmpfs adds it after a partition
// rescan) for up to 10 s.
func waitNode(ctx context.Context, p string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear", p)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// readOut is a tool's output with bytes.TrimSpace.
func readOut(b []byte) string { return string(bytes.TrimSpace(b)) }
