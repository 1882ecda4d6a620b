package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// callTimeout bounds each small controller call (report, plan, done).
const callTimeout = 60 * time.Second

// Runner drives one ramdisk session against the controller: Commission
// (facts, tests, report) or Deploy (plan, disk choice, verified write, seed,
// done). cmd/machina-agent builds it from the kernel command line.
type Runner struct {
	// Client reaches the controller; required.
	Client *v1.AgentClient
	// Token is the single-use token from the kernel command line; required.
	Token string
	// BootMAC is the MAC of the boot NIC (lower-case colon form).
	BootMAC string
	// Root is where /proc and /sys are mounted; "" means "/".
	Root string
	// DevDir holds the disk device nodes; "" means "/dev".
	DevDir string
	// Tests configures the commissioning tests; its Payload is filled from Client.
	Tests CommissionConfig
	// MemoryLimit is WriteConfig.MemoryLimit; zero means a quarter of MemTotal.
	MemoryLimit int64
	// Version is reported as AgentVersion.
	Version string
	Logger  *slog.Logger
}

func (r *Runner) log() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Logger
}

func (r *Runner) root() string {
	if r.Root == "" {
		return "/"
	}
	return r.Root
}

func (r *Runner) devDir() string {
	if r.DevDir == "" {
		return "/dev"
	}
	return r.DevDir
}

// Commission collects facts, runs the four tests and posts the report. It
// returns the controller's answer; a failed test is reported, not returned
// as an error.
func (r *Runner) Commission(ctx context.Context) (v1.ReportAck, error) {
	facts, err := CollectFacts(r.root())
	if err != nil {
		return v1.ReportAck{}, fmt.Errorf("commission: %w", err)
	}
	r.log().Info("facts collected", "cpu", facts.CPU.Model, "threads", facts.CPU.Threads, "memBytes", facts.Memory.TotalBytes, "disks", len(facts.Disks), "nics", len(facts.NICs))
	cc := r.Tests
	cc.Root, cc.DevDir, cc.Logger = r.root(), r.devDir(), r.log()
	if cc.Payload == nil {
		cc.Payload = func(ctx context.Context, n int64) (io.ReadCloser, error) { return r.Client.Payload(ctx, r.Token, n) }
	}
	tests := RunCommissioning(ctx, facts, cc)
	rep := v1.AgentReport{BootMAC: r.BootMAC, AgentVersion: r.Version, Facts: facts, Tests: tests, StartedToReport: uptime(r.root())}
	rctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	ack, err := r.Client.Report(rctx, r.Token, rep)
	if err != nil {
		return ack, fmt.Errorf("commission: %w", err)
	}
	r.log().Info("report accepted", "lifecycle", ack.Lifecycle, "reason", ack.Reason, "sinceBoot", rep.StartedToReport.String())
	return ack, nil
}

// uptime reads /proc/uptime (seconds since kernel start); 0 when unreadable.
func uptime(root string) time.Duration {
	s := readTrim(filepath.Join(root, "proc/uptime"))
	var sec float64
	if _, err := fmt.Sscanf(s, "%f", &sec); err != nil {
		return 0
	}
	return time.Duration(sec * float64(time.Second))
}

// Deploy fetches the plan, picks the disk, writes the verified image and
// seed, and posts the outcome (success or the failure reason) to done. The
// returned error is the deploy failure, if any, joined with a failure to
// post it.
func (r *Runner) Deploy(ctx context.Context) (v1.DeployResult, error) {
	t0 := time.Now()
	pctx, cancel := context.WithTimeout(ctx, callTimeout)
	plan, err := r.Client.Plan(pctx, r.Token)
	cancel()
	if err != nil {
		return v1.DeployResult{}, fmt.Errorf("deploy: %w", err)
	}
	res, derr := r.deploy(ctx, plan)
	res.BootMAC = r.BootMAC
	res.Duration = time.Since(t0)
	res.OK = derr == nil
	if derr != nil {
		res.Reason = derr.Error()
		r.log().Error("deploy failed", "err", derr)
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	if err := r.Client.Done(dctx, plan.DoneToken, res); err != nil {
		return res, errors.Join(derr, fmt.Errorf("deploy: %w", err))
	}
	return res, derr
}

func (r *Runner) deploy(ctx context.Context, plan v1.Plan) (v1.DeployResult, error) {
	var res v1.DeployResult
	facts, err := CollectFacts(r.root())
	if err != nil {
		return res, err
	}
	need := plan.ImageSizeBytes + SeedSizeBytes + 2<<20
	disk, err := ChooseDisk(facts.Disks, plan.RootDevice, need, MountedDisks(r.root()))
	if err != nil {
		return res, err
	}
	res.DiskName = disk.Name
	res.Disk = firstNonEmpty(disk.ByPath, disk.WWN, disk.Serial, disk.Name)
	r.log().Info("target disk", "disk", disk.Name, "byPath", disk.ByPath, "serial", disk.Serial, "sizeBytes", disk.SizeBytes)
	dev, size, err := openTarget(filepath.Join(r.devDir(), disk.Name))
	if err != nil {
		return res, err
	}
	defer dev.Close()
	memLimit := r.MemoryLimit
	if memLimit == 0 {
		memLimit = facts.Memory.TotalBytes / 4
	}
	cfg := DeployConfig{
		Write: WriteConfig{
			Open: func(ctx context.Context) (io.ReadCloser, error) {
				return r.Client.Open(ctx, "get image", plan.ImageURL, plan.ImageToken)
			},
			SizeBytes:   plan.ImageSizeBytes,
			SHA256:      plan.ImageSHA256,
			MemoryLimit: memLimit,
			ReadBack:    plan.ReadBack,
			Logger:      r.log(),
		},
		Seed:   plan.Seed,
		Logger: r.log(),
	}
	dr, err := Deploy(ctx, dev, size, cfg)
	res.BytesWritten, res.SHA256, res.Mode = dr.BytesWritten, dr.SHA256, dr.Mode
	if err != nil {
		return res, err
	}
	r.log().Info("deploy written", "disk", disk.Name, "bytes", dr.BytesWritten, "verifySeconds", dr.Verify.Seconds(), "writeSeconds", dr.Write.Seconds(),
		"writeMBps", float64(dr.BytesWritten)/max(dr.Write.Seconds(), 1e-9)/1e6, "seedOffset", dr.SeedOffset)
	return res, nil
}

// openTarget opens a disk read-write and exclusively (O_EXCL on a block
// device fails with EBUSY if anything has it open or mounted) and returns
// its size.
func openTarget(path string) (*os.File, int64, error) {
	flags := os.O_RDWR
	if st, err := os.Stat(path); err == nil && st.Mode()&os.ModeDevice != 0 {
		flags |= syscall.O_EXCL
	}
	f, err := os.OpenFile(path, flags, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("open target: %w", err)
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil || size <= 0 {
		f.Close()
		return nil, 0, fmt.Errorf("open target %s: size: %v", strings.TrimPrefix(path, "/dev/"), err)
	}
	return f, size, nil
}
