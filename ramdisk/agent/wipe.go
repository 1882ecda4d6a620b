package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// WipeDisk removes the partition tables and the signatures a released
// server's disk carries, so the next user of the server cannot find the
// previous layout (or be confused by it): the first and last MiB of every
// partition of the current MBR or GPT (filesystem superblocks, LVM, md,
// ZFS and config-2/cidata labels at either end, as [WipeSignatures] does
// before a deploy), then the disk's last MiB (the backup GPT header and
// entries, UEFI 2.10 §5.3.2) and its first MiB (the MBR or protective MBR,
// the primary GPT header and entries, and whole-disk signatures such as an
// LVM label in sector 1). It fsyncs before returning. The rest of the data
// is left in place: this is `wipefs -a` plus `sgdisk --zap-all`, not an
// erase of the contents.
func WipeDisk(dev BlockDevice, diskSize int64) error {
	const mib = 1 << 20
	if err := WipeSignatures(dev, diskSize, 0); err != nil {
		return fmt.Errorf("wipe disk: %w", err)
	}
	if err := zeroRange(dev, 0, mib, 0, diskSize); err != nil {
		return fmt.Errorf("wipe disk: head: %w", err)
	}
	if err := dev.Sync(); err != nil {
		return fmt.Errorf("wipe disk: fsync: %w", err)
	}
	return nil
}

// WipeTargets picks the disks a release wipe clears: with a non-zero hint
// exactly the disk ChooseDisk picks for it (any size); without one every
// eligible disk (see ChooseDisk: never read-only, removable, USB, virtual
// media or the ramdisk's source), since the released tenant may have used
// any of them. Errors: ErrNoDisk, ErrAmbiguousDisk, ErrKernelNameHint.
func WipeTargets(disks []v1.Disk, hint v1.RootDeviceHint, exclude map[string]bool) ([]v1.Disk, error) {
	if hint != (v1.RootDeviceHint{}) {
		d, err := ChooseDisk(disks, hint, 0, exclude)
		if err != nil {
			return nil, err
		}
		return []v1.Disk{d}, nil
	}
	var out []v1.Disk
	for _, d := range disks {
		if ineligible(d, exclude) == "" {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("wipe targets: %w (%d disks, none eligible)", ErrNoDisk, len(disks))
	}
	return out, nil
}

// Wipe runs the release wipe (machina.mode=wipe): it fetches the wipe plan
// with the single-use wipe token, erases the planned disks (WipeTargets,
// EraseDisk with each disk's method, EraseMethodFor: the plan's per-disk
// EraseDisks entry, else its Erase; reporting StepErase progress with the
// plan's ProgressToken) and posts the outcome, good or bad, with
// the plan's DoneToken: each erased disk's method, bytes, duration and
// verified samples, and on failure the step and disk, with Unsupported
// set when a disk cannot do the method. The returned error is the wipe
// failure, if any, joined with a failure to post it.
func (r *Runner) Wipe(ctx context.Context) (v1.WipeResult, error) {
	t0 := time.Now()
	var plan v1.WipePlan
	err := call(ctx, r.log(), "wipe plan", func(ctx context.Context) error {
		return r.attested(ctx, r.Token, func() (err error) {
			plan, err = r.Client.WipePlan(ctx, r.Token)
			return err
		})
	})
	if err != nil {
		return v1.WipeResult{}, fmt.Errorf("wipe: %w", err)
	}
	res := v1.WipeResult{BootMAC: r.BootMAC}
	var meter ProgressMeter
	rctx, stopReports := context.WithCancel(ctx)
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		if plan.ProgressToken == "" {
			return
		}
		ReportProgress(rctx, plan.ProgressEvery, &meter, func(ctx context.Context, p v1.Progress) error {
			return r.Client.Progress(ctx, plan.ProgressToken, p)
		}, r.log())
	}()
	erased, werr := r.wipe(ctx, plan, meter.Set)
	stopReports()
	<-reported
	for _, e := range erased {
		res.Disks = append(res.Disks, e.Disk)
	}
	if planErases(plan) {
		res.Erased = erased
	}
	res.Duration = time.Since(t0)
	res.OK = werr == nil
	if werr != nil {
		res.Reason = werr.Error()
		res.Unsupported = errors.Is(werr, ErrEraseUnsupported)
		r.log().Error("wipe failed", "err", werr)
	}
	if err := call(context.WithoutCancel(ctx), r.log(), "wiped", func(ctx context.Context) error {
		return r.Client.Wiped(ctx, plan.DoneToken, res)
	}); err != nil {
		return res, errors.Join(werr, fmt.Errorf("wipe: %w", err))
	}
	return res, werr
}

// ErrEraseUnplanned is matched (errors.Is) by the error of a release wipe
// whose plan chose methods per disk (WipePlan.EraseDisks) and does not
// list a disk the ramdisk found: the disk's method was never chosen (it
// was not in the commissioning report the allocation chose from), and
// the profile's default may be weaker than an override meant for it.
var ErrEraseUnplanned = errors.New("disk not in the wipe plan's per-disk erase methods")

// EraseMethodFor returns the erase method of disk d in plan: with
// plan.EraseDisks, the method of the one entry that names d (refMatches:
// by-path, WWN or serial), else an error wrapping ErrEraseUnplanned
// naming the disk (no default is taken); without them, plan.Erase.
func EraseMethodFor(plan v1.WipePlan, d v1.Disk) (string, error) {
	if len(plan.EraseDisks) == 0 {
		return plan.Erase, nil
	}
	for _, e := range plan.EraseDisks {
		if refMatches(e.Disk, d) {
			return e.Method, nil
		}
	}
	return "", fmt.Errorf("%s (%s): %w: it was not in the commissioning report the erase methods were chosen from; commission the server again", d.Name, firstNonEmpty(d.ByPath, d.WWN, d.Serial, d.Name), ErrEraseUnplanned)
}

// planErases reports whether the plan erases any disk beyond its
// metadata (then the outcome lists every disk's erase).
func planErases(plan v1.WipePlan) bool {
	if plan.Erase != "" && plan.Erase != v1.EraseMetadata {
		return true
	}
	for _, e := range plan.EraseDisks {
		if e.Method != "" && e.Method != v1.EraseMetadata {
			return true
		}
	}
	return false
}

func (r *Runner) wipe(ctx context.Context, plan v1.WipePlan, progress func(string, int64, int64)) ([]v1.DiskErase, error) {
	facts, err := CollectFacts(r.root())
	if err != nil {
		return nil, err
	}
	targets, err := WipeTargets(facts.Disks, plan.RootDevice, MountedDisks(r.root()))
	if err != nil {
		return nil, err
	}
	methods := make([]string, len(targets))
	for i, d := range targets {
		if methods[i], err = EraseMethodFor(plan, d); err != nil {
			return nil, err
		}
	}
	cfgOf := func(i int) EraseConfig {
		d := targets[i]
		return EraseConfig{Method: methods[i], Disk: d, SysBlock: filepath.Join(r.root(), "sys/block", d.Name), Progress: progress, Logger: r.log()}
	}
	// Every disk is checked before any is erased.
	for i, d := range targets {
		id := firstNonEmpty(d.ByPath, d.WWN, d.Serial, d.Name)
		dev, _, err := openTarget(filepath.Join(r.devDir(), d.Name))
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", d.Name, id, err)
		}
		err = CheckErase(dev, cfgOf(i))
		dev.Close()
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", d.Name, id, err)
		}
	}
	var done []v1.DiskErase
	for i, d := range targets {
		id := firstNonEmpty(d.ByPath, d.WWN, d.Serial, d.Name)
		dev, size, err := openTarget(filepath.Join(r.devDir(), d.Name))
		if err != nil {
			return done, fmt.Errorf("%s (%s): %w", d.Name, id, err)
		}
		e, err := EraseDisk(ctx, dev, size, cfgOf(i))
		dev.Close()
		if err != nil {
			return done, fmt.Errorf("%s (%s): %w", d.Name, id, err)
		}
		e.Disk = id
		r.log().Info("disk erased", "disk", d.Name, "id", id, "method", e.Method, "sizeBytes", size,
			"seconds", e.Duration.Seconds(), "verifiedSamples", e.VerifiedSamples)
		done = append(done, e)
	}
	return done, nil
}
