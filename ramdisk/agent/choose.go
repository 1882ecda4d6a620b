package agent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	v1 "github.com/machina-metal/machina/api/v1"
)

// Errors from ChooseDisk. Each means "do not write anything": there is no
// fallback to another disk.
var (
	// ErrKernelNameHint: the hint names a kernel device (/dev/sda, nvme0n1),
	// which is not stable across boots.
	ErrKernelNameHint = errors.New("root device hint by kernel name is refused (not stable across boots); use serial, wwn, byPath or minSizeBytes")
	// ErrNoDisk: no eligible disk matches.
	ErrNoDisk = errors.New("no eligible disk matches")
	// ErrAmbiguousDisk: more than one eligible disk matches.
	ErrAmbiguousDisk = errors.New("several eligible disks match")
)

// ChooseDisk picks the deploy target from disks for an image (plus seed)
// needing need bytes.
//
// Never eligible: read-only, removable, USB, BMC virtual media, and disks
// named in exclude (the device the ramdisk came from; see MountedDisks).
// With a non-zero hint every set field must match (serial and WWN compared
// case-insensitively, byPath with or without /dev/disk/by-path/), and exactly
// one disk may match. Without a hint the smallest eligible disk that fits
// wins; a tie for the smallest size is ErrAmbiguousDisk, since picking one of
// two identical disks by probe order would not be repeatable.
func ChooseDisk(disks []v1.Disk, hint v1.RootDeviceHint, need int64, exclude map[string]bool) (v1.Disk, error) {
	if hint.DeviceName != "" || looksLikeKernelName(hint.ByPath) || looksLikeKernelName(hint.Serial) || looksLikeKernelName(hint.WWN) {
		return v1.Disk{}, ErrKernelNameHint
	}
	minSize := need
	if hint.MinSizeBytes > minSize {
		minSize = hint.MinSizeBytes
	}
	byPath := strings.TrimPrefix(hint.ByPath, "/dev/disk/by-path/")
	var cands []v1.Disk
	var skipped []string
	for _, d := range disks {
		why := ineligible(d, exclude)
		switch {
		case why != "":
		case d.SizeBytes < minSize:
			why = fmt.Sprintf("too small (%d < %d bytes)", d.SizeBytes, minSize)
		case hint.Serial != "" && !strings.EqualFold(d.Serial, hint.Serial):
			why = "serial differs"
		case hint.WWN != "" && !wwnEqual(d.WWN, hint.WWN):
			why = "wwn differs"
		case byPath != "" && d.ByPath != byPath:
			why = "by-path differs"
		}
		if why != "" {
			skipped = append(skipped, d.Name+": "+why)
			continue
		}
		cands = append(cands, d)
	}
	if len(cands) == 0 {
		return v1.Disk{}, fmt.Errorf("choose disk: %w (%s)", ErrNoDisk, strings.Join(skipped, "; "))
	}
	hinted := hint.Serial != "" || hint.WWN != "" || byPath != ""
	if hinted {
		if len(cands) > 1 {
			return v1.Disk{}, fmt.Errorf("choose disk: %w: %s", ErrAmbiguousDisk, names(cands))
		}
		return cands[0], nil
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].SizeBytes < cands[j].SizeBytes })
	if len(cands) > 1 && cands[0].SizeBytes == cands[1].SizeBytes {
		var tie []v1.Disk
		for _, c := range cands {
			if c.SizeBytes == cands[0].SizeBytes {
				tie = append(tie, c)
			}
		}
		return v1.Disk{}, fmt.Errorf("choose disk: %w: smallest fitting size %d bytes shared by %s; set a root device hint", ErrAmbiguousDisk, cands[0].SizeBytes, names(tie))
	}
	return cands[0], nil
}

// ineligible says why d may never be written (deployed or wiped), or "".
func ineligible(d v1.Disk, exclude map[string]bool) string {
	switch {
	case exclude[d.Name]:
		return "ramdisk source"
	case d.ReadOnly:
		return "read-only"
	case d.Removable:
		return "removable"
	case d.Transport == "usb":
		return "usb"
	case d.Virtual:
		return "virtual media"
	}
	return ""
}

func names(ds []v1.Disk) string {
	var s []string
	for _, d := range ds {
		s = append(s, d.Name)
	}
	return strings.Join(s, ", ")
}

// wwnEqual compares WWNs ignoring case and an optional "0x", "naa.", "eui."
// or "wwn-" prefix, so "0x5000c500a1b2c3d4" matches "naa.5000c500a1b2c3d4".
func wwnEqual(a, b string) bool {
	norm := func(s string) string {
		s = strings.ToLower(strings.TrimSpace(s))
		for _, p := range []string{"wwn-", "0x", "naa.", "eui.", "t10."} {
			s = strings.TrimPrefix(s, p)
		}
		return s
	}
	return a != "" && norm(a) == norm(b)
}

// looksLikeKernelName reports whether s names a kernel block device
// ("/dev/sda", "sdb", "/dev/nvme0n1", "vda") rather than a stable identity.
func looksLikeKernelName(s string) bool {
	if s == "" {
		return false
	}
	if strings.HasPrefix(s, "/dev/") && !strings.HasPrefix(s, "/dev/disk/by-") {
		return true
	}
	for _, p := range []string{"sd", "vd", "hd", "xvd"} {
		if rest, ok := strings.CutPrefix(s, p); ok && len(rest) >= 1 && len(rest) <= 3 && isLower(rest) {
			return true
		}
	}
	if rest, ok := strings.CutPrefix(s, "nvme"); ok && strings.Contains(rest, "n") && isDigits(strings.ReplaceAll(strings.ReplaceAll(rest, "n", ""), "p", "")) {
		return true
	}
	return false
}

func isLower(s string) bool {
	for _, r := range s {
		if r < 'a' || r > 'z' {
			return false
		}
	}
	return true
}

// MountedDisks returns the whole-disk kernel names of block devices mounted
// under root (from root/proc/mounts and root/sys/class/block). The ramdisk
// never mounts a target disk, so a mounted disk is the one it came from
// (for example boot media holding the initrd) and must not be overwritten.
func MountedDisks(root string) map[string]bool {
	out := map[string]bool{}
	f, err := os.Open(filepath.Join(root, "proc/mounts"))
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 1 || !strings.HasPrefix(fs[0], "/dev/") {
			continue
		}
		name := filepath.Base(fs[0])
		cls := filepath.Join(root, "sys/class/block", name)
		if _, err := os.Stat(filepath.Join(cls, "partition")); err == nil {
			if real, err := filepath.EvalSymlinks(cls); err == nil {
				name = filepath.Base(filepath.Dir(real))
			}
		}
		out[name] = true
	}
	return out
}
