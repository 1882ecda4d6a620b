package agent

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	v1 "github.com/machina-metal/machina/api/v1"
)

// StorageTools are what a storage layout runs. Every zero field uses the
// ramdisk's own: ExecCommander with LVM_SYSTEM_DIR=/etc/lvm (the ramdisk's
// udev-free lvm.conf), mount(2), umount(2), the BLKRRPART ioctl, and a
// temporary mount point.
type StorageTools struct {
	Run     Commander
	Mount   func(src, dst, fstype string) error
	Unmount func(dst string) error
	// Rescan asks the kernel to re-read f's partition table.
	Rescan func(f *os.File) error
	// MountDir is the parent of the deployed root's temporary mount point;
	// "" is os.TempDir().
	MountDir string
	// ProcDir is where the kernel's /proc is read (mdstat, for the log of
	// what the layout made); "" is /proc.
	ProcDir string
	// Prepare loads what the layout needs before its first tool runs (the
	// ramdisk's md, dm, ext4 and xfs modules); nil does nothing. A module
	// that did not load shows as the failure of the tool that needs it.
	Prepare func()
}

func (t StorageTools) withDefaults() StorageTools {
	if t.Run == nil {
		t.Run = ExecCommander([]string{"LVM_SYSTEM_DIR=/etc/lvm"})
	}
	if t.Mount == nil {
		t.Mount = func(src, dst, fstype string) error {
			return unix.Mount(src, dst, fstype, unix.MS_NOSUID|unix.MS_NODEV, "")
		}
	}
	if t.Unmount == nil {
		t.Unmount = func(dst string) error { return unix.Unmount(dst, 0) }
	}
	if t.ProcDir == "" {
		t.ProcDir = "/proc"
	}
	if t.Rescan == nil {
		t.Rescan = func(f *os.File) error { return unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0) }
	}
	return t
}

// layoutRun is one storage layout being made: the resolved disks, the
// root device the image goes to, and what has been made so far (so a
// failure knows whether the root must be spoiled).
type layoutRun struct {
	lay     ResolvedLayout
	tools   StorageTools
	devDir  string
	log     *slog.Logger
	root    string // kernel name of the root device: a disk, or the md array
	rootID  string // how reports name it
	written bool   // the image write began: a failure must spoil the root
	// arrays are the md arrays made, the root's first; groupArray maps a
	// volume group's index to the kernel name of the RAID1 it lies on.
	arrays     []mdArray
	groupArray map[int]string
}

// mdArray is one md array the layout made: its name (mdadm --name), its
// kernel name (md127) and its superblock version.
type mdArray struct{ name, dev, metadata string }

// prepareLayout resolves the plan's disks, clears the signatures at the
// head and tail of every disk the layout takes (old GPTs, md superblocks
// of either end, LVM labels), and creates the root's RAID1: md metadata
// 1.0, so the superblock sits at the end of each member and each member
// starts with the image, a plain disk to BIOS and UEFI firmware; a
// write-intent bitmap so a member that comes back resyncs only what
// changed; homehost "any" so the deployed OS assembles it under its name.
// Then the RAID1 of each volume group on one, with metadata 1.2 (the
// superblock at the start of each member, so neither member alone shows
// the group's LVM label: LVM never sees a duplicate physical volume), the
// same bitmap and homehost. Every array exists before the first image
// byte is written.
func (r *Runner) prepareLayout(ctx context.Context, p v1.StoragePlan, disks []v1.Disk) (*layoutRun, error) {
	lay, err := ResolveLayout(p, disks, MountedDisks(r.root()))
	if err != nil {
		return nil, err
	}
	l := &layoutRun{lay: lay, tools: r.Storage.withDefaults(), devDir: r.devDir(), log: r.log()}
	if l.tools.Prepare != nil {
		l.tools.Prepare()
	}
	all := append([]v1.Disk(nil), lay.Root...)
	for _, g := range lay.Groups {
		all = append(all, g...)
	}
	for _, d := range all {
		if err := clearEnds(filepath.Join(l.devDir, d.Name), false); err != nil {
			return l, stepErr(StepClear, diskID(d), err)
		}
	}
	l.root, l.rootID = lay.Root[0].Name, diskID(lay.Root[0])
	if p.Root.RAID == v1.StorageRAID1 {
		md, err := l.createArray(ctx, RootArrayName, "1.0", lay.Root)
		if err != nil {
			return l, err
		}
		l.root, l.rootID = md, "md/"+RootArrayName+" ("+diskID(lay.Root[0])+", "+diskID(lay.Root[1])+")"
		l.log.Info("root array created", "array", l.root, "members", lay.Root[0].Name+","+lay.Root[1].Name)
	}
	for i, g := range p.VolumeGroups {
		if g.RAID != v1.StorageRAID1 {
			continue
		}
		name := GroupArrayName(g.Name)
		md, err := l.createArray(ctx, name, "1.2", lay.Groups[i])
		if err != nil {
			return l, err
		}
		if l.groupArray == nil {
			l.groupArray = map[int]string{}
		}
		l.groupArray[i] = md
		l.log.Info("volume group array created", "group", g.Name, "array", md, "members", lay.Groups[i][0].Name+","+lay.Groups[i][1].Name)
	}
	return l, nil
}

// createArray makes the md RAID1 name of members (metadata 1.0 or 1.2,
// internal bitmap, homehost any) and returns its kernel name.
func (l *layoutRun) createArray(ctx context.Context, name, metadata string, members []v1.Disk) (string, error) {
	link := filepath.Join(l.devDir, "md", name)
	args := []string{"--create", link, "--run", "--level=1", "--raid-devices=2", "--metadata=" + metadata, "--bitmap=internal",
		"--homehost=any", "--name=" + name}
	for _, d := range members {
		args = append(args, filepath.Join(l.devDir, d.Name))
	}
	if _, err := l.tools.Run(ctx, "mdadm", args...); err != nil {
		return "", stepErr(StepMDCreate, name, err)
	}
	real, err := filepath.EvalSymlinks(link)
	if err != nil || !kernelNameRe.MatchString(filepath.Base(real)) {
		return "", stepErr(StepMDCreate, name, fmt.Errorf("array device: %v", err))
	}
	l.arrays = append(l.arrays, mdArray{name: name, dev: filepath.Base(real), metadata: metadata})
	return filepath.Base(real), nil
}

func diskID(d v1.Disk) string { return firstNonEmpty(d.ByPath, d.WWN, d.Serial, d.Name) }

// clearEnds zeroes the first and last MiB of a disk, opened exclusively
// (openTarget) or, for spoil, shared: after a failed step the root's
// partitions may still be held (an active volume group on the rest), and
// an exclusive open would fail with EBUSY (seen in the VM test).
func clearEnds(p string, shared bool) error {
	open := openTarget
	if shared {
		open = openShared
	}
	f, size, err := open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := zeroRange(f, 0, 1<<20, 0, size); err != nil {
		return err
	}
	if err := zeroRange(f, size-(1<<20), 1<<20, 0, size); err != nil {
		return err
	}
	return f.Sync()
}

// finish makes the rest of the layout once the image and seed are on the
// root device dev (size bytes, seed at seedStart): the root partition
// grown to the layout's size and a PV partition after it for the group on
// the rest (partition), the volume groups, logical volumes and their
// filesystems, the root filesystem grown, mdadm.conf and fstab written
// into the deployed OS, the result logged (report), and the groups and
// arrays settled. dev is closed here, before the tools open the
// partitions.
func (l *layoutRun) finish(ctx context.Context, dev *os.File, size, seedStart int64) error {
	rest := false
	for _, g := range l.lay.Plan.VolumeGroups {
		rest = rest || g.Rest
	}
	rootPart, pvPart, err := layoutPartitions(dev, size, l.lay.Plan.Root.SizeBytes, rest, seedStart, l.root)
	if err != nil {
		dev.Close()
		return stepErr(StepPartition, l.rootID, err)
	}
	if err := l.tools.Rescan(dev); err != nil {
		dev.Close()
		return stepErr(StepPartition, l.rootID, fmt.Errorf("re-read partition table: %w", err))
	}
	if err := dev.Close(); err != nil {
		return stepErr(StepPartition, l.rootID, err)
	}
	rootDev := filepath.Join(l.devDir, partName(l.root, rootPart))
	if err := waitNode(ctx, rootDev); err != nil {
		return stepErr(StepPartition, l.rootID, err)
	}
	var mounts []fstabEntry
	for i, g := range l.lay.Plan.VolumeGroups {
		var pvs []string
		if g.Rest {
			pvs = []string{filepath.Join(l.devDir, partName(l.root, pvPart))}
		}
		if md, ok := l.groupArray[i]; ok {
			pvs = append(pvs, filepath.Join(l.devDir, md))
		} else {
			for _, d := range l.lay.Groups[i] {
				pvs = append(pvs, filepath.Join(l.devDir, d.Name))
			}
		}
		m, err := l.volumeGroup(ctx, g, pvs)
		if err != nil {
			return err
		}
		mounts = append(mounts, m...)
	}
	if err := l.configureOS(ctx, rootDev, mounts); err != nil {
		return err
	}
	l.report(ctx)
	return l.settle(ctx)
}

// report logs what the layout made, as the kernel and LVM see it: the
// arrays of /proc/mdstat and `lvm vgs` (name, physical volumes, logical
// volumes, size), so the console shows the result. It changes nothing; a
// tool that fails is logged with its error.
func (l *layoutRun) report(ctx context.Context) {
	if len(l.arrays) > 0 {
		b, err := os.ReadFile(filepath.Join(l.tools.ProcDir, "mdstat"))
		if err != nil {
			l.log.Warn("layout made: /proc/mdstat unreadable", "err", err)
		} else {
			l.log.Info("layout made: mdstat", "mdstat", readOut(b))
		}
	}
	if len(l.lay.Plan.VolumeGroups) > 0 {
		out, err := l.tools.Run(ctx, "lvm", "vgs", "--noheadings", "--units", "b", "-o", "vg_name,pv_count,lv_count,vg_size,pv_name")
		if err != nil {
			l.log.Warn("layout made: lvm vgs failed", "err", err)
		} else {
			l.log.Info("layout made: vgs", "vgs", readOut(out))
		}
	}
}

// fstabEntry is one line the layout adds to the deployed OS's fstab.
type fstabEntry struct{ dev, mountPoint, fs string }

// volumeGroup makes one group on pvs, its volumes and their filesystems.
func (l *layoutRun) volumeGroup(ctx context.Context, g v1.StorageVolumeGroup, pvs []string) ([]fstabEntry, error) {
	for _, pv := range pvs {
		if err := waitNode(ctx, pv); err != nil {
			return nil, stepErr(StepPVCreate, pv, err)
		}
	}
	if _, err := l.tools.Run(ctx, "lvm", append([]string{"pvcreate", "-ff", "-y"}, pvs...)...); err != nil {
		return nil, stepErr(StepPVCreate, strings.Join(pvs, ","), err)
	}
	if _, err := l.tools.Run(ctx, "lvm", append([]string{"vgcreate", g.Name}, pvs...)...); err != nil {
		return nil, stepErr(StepVGCreate, g.Name, err)
	}
	var out []fstabEntry
	for _, v := range g.Volumes {
		size := []string{"-l", "100%FREE"}
		if v.SizeBytes > 0 {
			size = []string{"-L", strconv.FormatInt(v.SizeBytes, 10) + "b"}
		}
		args := append([]string{"lvcreate", "-y", "-n", v.Name}, size...)
		if _, err := l.tools.Run(ctx, "lvm", append(args, g.Name)...); err != nil {
			return nil, stepErr(StepLVCreate, g.Name+"/"+v.Name, err)
		}
		lv := filepath.Join(l.devDir, g.Name, v.Name)
		if v.Filesystem == "" {
			continue
		}
		if err := waitNode(ctx, lv); err != nil {
			return nil, stepErr(StepMkfs, g.Name+"/"+v.Name, err)
		}
		var err error
		switch v.Filesystem {
		case "ext4":
			_, err = l.tools.Run(ctx, "mkfs.ext4", "-q", "-F", lv)
		case "xfs":
			_, err = l.tools.Run(ctx, "mkfs.xfs", "-q", "-f", lv)
		case "swap":
			_, err = l.tools.Run(ctx, "mkswap", lv)
		}
		if err != nil {
			return nil, stepErr(StepMkfs, g.Name+"/"+v.Name, err)
		}
		if v.MountPoint != "" || v.Filesystem == "swap" {
			out = append(out, fstabEntry{dev: "/dev/" + g.Name + "/" + v.Name, mountPoint: v.MountPoint, fs: v.Filesystem})
		}
	}
	return out, nil
}

// configureOS mounts the deployed root, grows its filesystem to the
// partition (resize2fs online for ext4, xfs_growfs for xfs), writes the
// array's mdadm.conf (RAID1) and the layout's fstab lines, creates the
// mount points, and unmounts.
func (l *layoutRun) configureOS(ctx context.Context, rootDev string, mounts []fstabEntry) (err error) {
	fs, err := fsType(rootDev)
	if err != nil {
		return stepErr(StepGrowRoot, rootDev, err)
	}
	mnt, err := os.MkdirTemp(l.tools.MountDir, "machina-root-")
	if err != nil {
		return stepErr(StepGrowRoot, rootDev, err)
	}
	defer os.Remove(mnt)
	if err := l.tools.Mount(rootDev, mnt, fs); err != nil {
		return stepErr(StepGrowRoot, rootDev, fmt.Errorf("mount %s: %w", fs, err))
	}
	defer func() {
		if uerr := l.tools.Unmount(mnt); uerr != nil && err == nil {
			err = stepErr(StepOSConfig, rootDev, fmt.Errorf("unmount: %w", uerr))
		}
	}()
	if fs == "ext4" {
		_, err = l.tools.Run(ctx, "resize2fs", rootDev)
	} else {
		_, err = l.tools.Run(ctx, "xfs_growfs", mnt)
	}
	if err != nil {
		return stepErr(StepGrowRoot, rootDev, err)
	}
	if len(l.arrays) > 0 {
		if err := l.writeMdadmConf(ctx, mnt); err != nil {
			return stepErr(StepOSConfig, rootDev, err)
		}
	}
	if err := writeFstab(mnt, mounts); err != nil {
		return stepErr(StepOSConfig, rootDev, err)
	}
	return nil
}

var mdUUIDRe = regexp.MustCompile(`^[0-9a-f]{8}(:[0-9a-f]{8}){3}$`)

// writeMdadmConf writes each array's ARRAY line, by UUID, into the
// deployed OS: /etc/mdadm/mdadm.conf where /etc/mdadm exists (Debian,
// Ubuntu), else /etc/mdadm.conf (RHEL family). The OS's initramfs must
// carry mdadm (see docs/storage.md).
func (l *layoutRun) writeMdadmConf(ctx context.Context, mnt string) error {
	conf := "# written by the Machina ramdisk (docs/storage.md): the layout's RAID1 arrays\n" +
		"HOMEHOST <ignore>\n"
	for _, a := range l.arrays {
		out, err := l.tools.Run(ctx, "mdadm", "--detail", "--export", filepath.Join(l.devDir, a.dev))
		if err != nil {
			return err
		}
		var id string
		for _, line := range strings.Split(readOut(out), "\n") {
			if v, ok := strings.CutPrefix(line, "MD_UUID="); ok {
				id = v
			}
		}
		if !mdUUIDRe.MatchString(id) {
			return fmt.Errorf("mdadm --detail %s: no array UUID (%q)", a.name, id)
		}
		conf += "ARRAY /dev/md/" + a.name + " metadata=" + a.metadata + " UUID=" + id + " name=any:" + a.name + "\n"
	}
	p := filepath.Join(mnt, "etc", "mdadm.conf")
	if st, err := os.Stat(filepath.Join(mnt, "etc", "mdadm")); err == nil && st.IsDir() {
		p = filepath.Join(mnt, "etc", "mdadm", "mdadm.conf")
	}
	return os.WriteFile(p, []byte(conf), 0o644)
}

// writeFstab appends the layout's mounts to etc/fstab (nofail: a missing
// data disk never stops the boot) and creates the mount points.
func writeFstab(mnt string, mounts []fstabEntry) error {
	if len(mounts) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("# storage layout, written by the Machina ramdisk (docs/storage.md)\n")
	for _, m := range mounts {
		if m.fs == "swap" {
			fmt.Fprintf(&b, "%s none swap sw,nofail 0 0\n", m.dev)
			continue
		}
		fmt.Fprintf(&b, "%s %s %s defaults,nofail 0 2\n", m.dev, m.mountPoint, m.fs)
		if err := os.MkdirAll(filepath.Join(mnt, m.mountPoint), 0o755); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(filepath.Join(mnt, "etc", "fstab"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// settle deactivates the volume groups and stops the arrays (the groups'
// first, the root's last), so every
// write has reached the disks and the next boot assembles them afresh.
func (l *layoutRun) settle(ctx context.Context) error {
	for _, g := range l.lay.Plan.VolumeGroups {
		if _, err := l.tools.Run(ctx, "lvm", "vgchange", "-an", g.Name); err != nil {
			return stepErr(StepSettle, g.Name, err)
		}
	}
	for i := len(l.arrays) - 1; i >= 0; i-- {
		a := l.arrays[i]
		if _, err := l.tools.Run(ctx, "mdadm", "--stop", filepath.Join(l.devDir, a.dev)); err != nil {
			return stepErr(StepSettle, a.name, err)
		}
	}
	return nil
}

// spoil makes the root device unbootable after a failed layout step: it
// zeroes the first and last MiB of the root device (the protective MBR,
// both GPT headers and entries; through the array, both members' heads),
// so no firmware boots a half-made layout and nothing looks deployed.
func (l *layoutRun) spoil() error {
	if !l.written {
		return nil
	}
	if err := clearEnds(filepath.Join(l.devDir, l.root), true); err != nil {
		return stepErr(StepSpoil, l.rootID, err)
	}
	return nil
}

// fsType reads a filesystem's magic: ext2/3/4 (0xEF53 at byte 1080) is
// "ext4" (the kernel's ext4 driver mounts all three), "XFSB" at byte 0 is
// "xfs".
func fsType(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b := make([]byte, 1082)
	if _, err := f.ReadAt(b, 0); err != nil {
		return "", fmt.Errorf("read superblock: %w", err)
	}
	switch {
	case binary.LittleEndian.Uint16(b[1080:]) == 0xEF53:
		return "ext4", nil
	case string(b[:4]) == "XFSB":
		return "xfs", nil
	}
	return "", errors.New("the image's root partition holds neither ext4 nor xfs: cannot grow it")
}

// layoutPartitions edits the image's GPT on the root device: the root
// partition (the image's last Linux root or filesystem partition, which
// must be its last partition) ends at rootSize (0: just before the seed),
// and with rest a Linux LVM partition runs from there to the seed. It
// returns both partition numbers (pv 0 without rest).
func layoutPartitions(dev BlockDevice, size, rootSize int64, rest bool, seedStart int64, guidSeed string) (rootIdx, pvIdx int, err error) {
	const mib = 1 << 20
	t, err := readPartTable(dev, size)
	if err != nil {
		return 0, 0, err
	}
	if t.kind != "gpt" {
		return 0, 0, fmt.Errorf("%w: a storage layout needs a GPT image (found %q)", ErrBadPartitionTable, t.kind)
	}
	ss := int64(t.sectorSize)
	var root *gpt.Partition
	for _, p := range t.gpt.Partitions {
		switch p.Type {
		case gpt.LinuxRootX86_64, gpt.LinuxRootArm64, gpt.LinuxFilesystem:
			if root == nil || p.Start > root.Start {
				root = p
			}
		}
	}
	if root == nil {
		return 0, 0, errors.New("the image has no Linux root or filesystem partition")
	}
	for _, p := range t.gpt.Partitions {
		if p != root && p.Start > root.Start && int64(p.Start)*ss < seedStart {
			return 0, 0, fmt.Errorf("partition %d lies after the root partition %d: cannot grow the root", p.Index, root.Index)
		}
	}
	end := seedStart
	if rootSize > 0 {
		end = rootSize / mib * mib
	}
	if end <= int64(root.End+1)*ss || end > seedStart || (rest && seedStart-end < 16*mib) {
		return 0, 0, fmt.Errorf("root size %d bytes: the image's root ends at %d, the seed starts at %d", rootSize, int64(root.End+1)*ss, seedStart)
	}
	root.End = uint64(end/ss) - 1
	root.Size = (root.End - root.Start + 1) * uint64(ss)
	rootIdx = root.Index
	if rest {
		taken := map[int]bool{}
		for _, p := range t.gpt.Partitions {
			taken[p.Index] = true
		}
		for i := 1; i <= t.gptSlots && pvIdx == 0; i++ {
			if !taken[i] {
				pvIdx = i
			}
		}
		if pvIdx == 0 {
			return 0, 0, errors.New("gpt has no free entry for the volume group's partition")
		}
		g := sha256.Sum256([]byte("machina-pv:" + guidSeed))
		id, _ := uuid.FromBytes(g[:16])
		id[6], id[8] = id[6]&0x0F|0x40, id[8]&0x3F|0x80
		t.gpt.Partitions = append(t.gpt.Partitions, &gpt.Partition{Index: pvIdx, Start: uint64(end / ss), End: uint64(seedStart/ss) - 1,
			Size: uint64(seedStart - end), Type: gpt.LinuxLVM, Name: "machina-pv", GUID: id.String()})
	}
	if err := t.gpt.Write(&devFile{dev: dev, size: size}, size); err != nil {
		return 0, 0, fmt.Errorf("write gpt: %w", err)
	}
	return rootIdx, pvIdx, dev.Sync()
}

// target is the device the image goes to: with a storage plan the root
// device of the layout (prepared: disks resolved and cleared, the RAID1
// created; a failure there spoils nothing, since no image byte was
// written), else the disk ChooseDisk picks.
func (r *Runner) target(ctx context.Context, plan v1.Plan, facts v1.Facts) (*layoutRun, v1.Disk, error) {
	if plan.Storage == nil {
		need := plan.ImageSizeBytes + SeedSizeBytes + 2<<20
		d, err := ChooseDisk(facts.Disks, plan.RootDevice, need, MountedDisks(r.root()))
		return nil, d, err
	}
	l, err := r.prepareLayout(ctx, *plan.Storage, facts.Disks)
	if err != nil {
		return nil, v1.Disk{}, err
	}
	d := l.lay.Root[0]
	if l.root != d.Name {
		d = v1.Disk{Name: l.root, ByPath: l.rootID}
	}
	return l, d, nil
}

// openShared opens a device read-write without O_EXCL and returns its
// size.
func openShared(p string) (*os.File, int64, error) {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return nil, 0, err
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, size, nil
}

// checkImageHead is the layout's WriteConfig.CheckHead: the partition
// step edits the image's GPT, so an image with another table (or none) is
// refused from its first chunk, before the write (complete reports it as
// the LayoutError of StepWrite on the root device). Nil without a layout.
func (l *layoutRun) checkImageHead(imageSize int64) func(head []byte) error {
	if l == nil {
		return nil
	}
	return func(head []byte) error {
		kind, err := imageHeadTable(head, imageSize)
		if err == nil && kind != "gpt" {
			err = fmt.Errorf("%w: a storage layout needs a GPT image (found %q)", ErrBadPartitionTable, kind)
		}
		return err // complete makes it the LayoutError of StepWrite
	}
}

// markWritten records that the image write begins: from here on a
// failure spoils the root device. Nil-safe (no layout).
func (l *layoutRun) markWritten() {
	if l != nil {
		l.written = true
	}
}

// complete ends a layout deploy after the image write returned werr: on
// success it makes the rest of the layout (finish); a failure of either is
// a LayoutError and spoils the root device. Without a layout it returns
// werr.
func (l *layoutRun) complete(ctx context.Context, dev *os.File, size, seedStart int64, werr error) error {
	if l == nil {
		return werr
	}
	err := stepErr(StepWrite, l.rootID, werr)
	if err == nil {
		err = l.finish(ctx, dev, size, seedStart)
	}
	if err != nil {
		return errors.Join(err, l.spoil())
	}
	return nil
}
