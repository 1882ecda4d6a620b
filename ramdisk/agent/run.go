package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
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
	// Storage runs a plan's storage layout (layout_run.go); zero uses the
	// ramdisk's tools.
	Storage StorageTools
	// MemoryLimit is WriteConfig.MemoryLimit; zero means a quarter of MemTotal.
	MemoryLimit int64
	// TPM, when set, attests before each request that releases a secret
	// or moves the server (report, plan, done, wipe plan); nil on a
	// machine without a TPM 2.0.
	TPM *TPM
	// LLDPWait bounds the LLDP listen on every NIC during commissioning
	// (ListenLLDP), which runs alongside the tests; zero means
	// DefaultLLDPWait, negative turns it off. Only on the machine itself
	// (Root "" or "/"): a recorded tree's NICs are not this machine's.
	LLDPWait time.Duration
	// Version is reported as AgentVersion.
	Version string
	// Pieces, when set, serves this agent's image pieces to its deploy
	// wave on TCP port PiecePort (announced with the plan request); nil
	// fetches the whole image from the controller (pieces.go).
	Pieces    *PeerServer
	PiecePort int
	// StallTimeout aborts an image download or piece request whose
	// response delivers no bytes for this long, which is then asked again
	// (bounded, with doubling delays); zero means DefaultStallTimeout.
	StallTimeout time.Duration
	// ImageAttempts bounds the whole-image downloads of one deploy and,
	// when it shares pieces with a wave, the controller requests for one
	// piece; zero means 20.
	ImageAttempts int
	Logger        *slog.Logger
}

func (r *Runner) imageAttempts() int {
	if r.ImageAttempts > 0 {
		return r.ImageAttempts
	}
	return imageAttempts
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
		// A controller that restarts under the test is not a slow
		// network: opening the payload is retried like any call.
		// (Not through call: its context would end the body's read.)
		cc.Payload = func(ctx context.Context, n int64) (io.ReadCloser, error) {
			delay, end := retryBase, time.Now().Add(callTimeout)
			for {
				rc, err := r.Client.Payload(ctx, r.Token, n)
				if err == nil || !retryable(err) || ctx.Err() != nil || time.Now().After(end) {
					return rc, err
				}
				r.log().Warn("controller call failed; retrying", "op", "payload", "err", err, "delay", delay.String())
				t := time.NewTimer(delay)
				select {
				case <-ctx.Done():
					t.Stop()
					return nil, ctx.Err()
				case <-t.C:
				}
				delay = min(delay*2, retryMax)
			}
		}
	}
	lldp := r.startLLDP(ctx, facts.NICs)
	tests := RunCommissioning(ctx, facts, cc)
	heard := <-lldp
	for i, n := range facts.NICs {
		facts.NICs[i].LLDP = heard[n.Name]
	}
	rep := v1.AgentReport{BootMAC: r.BootMAC, AgentVersion: r.Version, Facts: facts, Tests: tests, StartedToReport: uptime(r.root())}
	var ack v1.ReportAck
	err = call(ctx, r.log(), "report", func(ctx context.Context) error {
		return r.attested(ctx, r.Token, func() (err error) {
			ack, err = r.Client.Report(ctx, r.Token, rep)
			return err
		})
	})
	if err != nil {
		return ack, fmt.Errorf("commission: %w", err)
	}
	r.log().Info("report accepted", "lifecycle", ack.Lifecycle, "reason", ack.Reason, "sinceBoot", rep.StartedToReport.String())
	return ack, nil
}

// retryBase and retryMax pace the retries of call.
const (
	retryBase = 250 * time.Millisecond
	retryMax  = 5 * time.Second
)

// call runs f, the controller call op, until it succeeds, fails for good,
// or callTimeout has passed. A controller that is unreachable or answers
// 502, 503 or 504 (restarting, or its image still importing) is retried
// with doubling delays, so a controller restart of a few seconds does not
// lose a commissioning report or a deploy outcome; any other answer (a
// refused or used-up token, a conflict) is final. The token is consumed
// only by a call the controller accepted, so a retry never applies a
// report twice.
func call(ctx context.Context, log *slog.Logger, op string, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	delay := retryBase
	for {
		err := f(ctx)
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return err
		}
		log.Warn("controller call failed; retrying", "op", op, "err", err, "delay", delay.String())
		if !backoff(ctx, &delay) {
			return err
		}
	}
}

// backoff waits *delay, then doubles it up to retryMax; false means ctx
// ended first.
func backoff(ctx context.Context, delay *time.Duration) bool {
	t := time.NewTimer(*delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	*delay = min(*delay*2, retryMax)
	return true
}

// imageAttempts is the default bound on the image downloads of one
// deploy (Runner.ImageAttempts).
const imageAttempts = 20

// transientFetch reports whether a deploy failed because the image
// download was interrupted (not because of what it received).
func transientFetch(err error) bool {
	if pf := (*pieceFailure)(nil); errors.As(err, &pf) {
		return false // its requests were retried already
	}
	var se *v1.AgentStatusError
	if errors.As(err, &se) {
		return se.Code == http.StatusBadGateway || se.Code == http.StatusServiceUnavailable || se.Code == http.StatusGatewayTimeout
	}
	var ne net.Error
	return errors.Is(err, errStreamEnded) || errors.Is(err, errStalled) || errors.Is(err, errBadPeer) || errors.As(err, &ne) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED)
}

// retryable reports whether a controller call's error is worth repeating.
func retryable(err error) bool {
	var se *v1.AgentStatusError
	if errors.As(err, &se) {
		return se.Code == http.StatusBadGateway || se.Code == http.StatusServiceUnavailable || se.Code == http.StatusGatewayTimeout
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
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
	var plan v1.Plan
	err := call(ctx, r.log(), "plan", func(ctx context.Context) error {
		return r.attested(ctx, r.Token, func() (err error) {
			plan, err = r.Client.PlanWithPeer(ctx, r.Token, r.PiecePort)
			return err
		})
	})
	if err != nil {
		return v1.DeployResult{}, fmt.Errorf("deploy: %w", err)
	}
	res, derr := r.deploy(ctx, plan)
	res.BootMAC = r.BootMAC
	res.Duration = time.Since(t0)
	res.OK = derr == nil
	if derr != nil {
		res.Reason = derr.Error()
		if le := (*LayoutError)(nil); errors.As(derr, &le) {
			res.FailedStep, res.FailedDevice = le.Step, le.Device
		}
		r.log().Error("deploy failed", "err", derr)
	}
	if err := call(context.WithoutCancel(ctx), r.log(), "done", func(ctx context.Context) error {
		return r.attested(ctx, plan.DoneToken, func() error { return r.Client.Done(ctx, plan.DoneToken, res) })
	}); err != nil {
		return res, errors.Join(derr, fmt.Errorf("deploy: %w", err))
	}
	return res, derr
}

func (r *Runner) deploy(ctx context.Context, plan v1.Plan) (res v1.DeployResult, err error) {
	facts, err := CollectFacts(r.root())
	if err != nil {
		return res, err
	}
	lay, disk, err := r.target(ctx, plan, facts)
	if err != nil {
		return res, err
	}
	res.DiskName, res.Disk = disk.Name, diskID(disk)
	r.log().Info("target disk", "disk", disk.Name, "byPath", disk.ByPath, "serial", disk.Serial, "sizeBytes", disk.SizeBytes)
	dev, size, err := openTarget(filepath.Join(r.devDir(), disk.Name))
	if err != nil {
		return res, err
	}
	defer dev.Close()
	lay.markWritten()
	memLimit := r.MemoryLimit
	if memLimit == 0 {
		memLimit = facts.Memory.TotalBytes / 4
	}
	cfg := DeployConfig{
		Write: WriteConfig{
			Open:        r.openImage(plan),
			SizeBytes:   plan.ImageSizeBytes,
			SHA256:      plan.ImageSHA256,
			MemoryLimit: memLimit,
			ReadBack:    plan.ReadBack,
			CheckHead:   lay.checkImageHead(plan.ImageSizeBytes),
			Logger:      r.log(),
		},
		Seed:   plan.Seed,
		Logger: r.log(),
	}
	var meter ProgressMeter
	defer r.usePieces(plan, memLimit, &cfg.Write, &res, &meter)() // fetch from the wave (pieces.go)
	cfg.Write.Progress = meter.Set
	defer r.reportProgress(ctx, plan, &meter)()
	dr, err := r.writeImage(ctx, dev, size, cfg, plan, &meter)
	res.BytesWritten, res.SHA256, res.ReadBackSHA256, res.Mode = dr.BytesWritten, dr.SHA256, dr.ReadBackSHA256, dr.Mode
	if err = lay.complete(ctx, dev, size, dr.SeedOffset, err); err != nil {
		return res, err
	}
	r.log().Info("deploy written", "disk", disk.Name, "bytes", dr.BytesWritten, "verifySeconds", dr.Verify.Seconds(), "writeSeconds", dr.Write.Seconds(),
		"writeMBps", float64(dr.BytesWritten)/max(dr.Write.Seconds(), 1e-9)/1e6, "seedOffset", dr.SeedOffset)
	return res, nil
}

// reportProgress posts meter's progress under the plan's image token
// every plan.ProgressEvery until the returned stop is called (stop waits
// for the last post to end).
func (r *Runner) reportProgress(ctx context.Context, plan v1.Plan, meter *ProgressMeter) (stop func()) {
	rctx, cancel := context.WithCancel(ctx)
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		ReportProgress(rctx, plan.ProgressEvery, meter, func(ctx context.Context, p v1.Progress) error {
			if plan.SilentAfter <= 0 {
				p.Retry = "" // an older controller refuses the field
			}
			return r.Client.Progress(ctx, plan.ImageToken, p)
		}, r.log())
	}()
	return func() {
		cancel()
		<-reported
	}
}

// writeImage runs Deploy onto dev, fetching the image again when the
// controller went away under it (restarted, connection reset,
// 502/503/504, stream cut short, no bytes for StallTimeout): the image
// token is reusable and nothing reaches the disk before the whole image is
// verified, so a new attempt starts clean. Each retry is reported
// (Progress.Retry through meter), and none starts later than the plan's
// SilentAfter (less a progress interval: retryWithin) after the first
// attempt, or the last byte of the attempt that got furthest, so the
// controller hears the cause in done rather than a silent machine. Errors:
// Deploy's, or imageFailure's when the attempts or the time bound ran out.
func (r *Runner) writeImage(ctx context.Context, dev *os.File, size int64, cfg DeployConfig, plan v1.Plan, meter *ProgressMeter) (dr DeployResult, err error) {
	pol := retryPolicy{attempts: r.imageAttempts(), within: retryWithin(plan), stall: stallTimeoutOr(r.StallTimeout),
		note: func(msg string) { meter.Retrying(msg, plan.ImageSizeBytes) }}
	delay, first := retryBase, time.Now()
	var furthest int64 // the most bytes an attempt got
	for attempt := 1; ; attempt++ {
		dr, err = Deploy(ctx, dev, size, cfg)
		if err == nil || !transientFetch(err) || ctx.Err() != nil {
			return dr, err
		}
		// An attempt that got further than any before made progress: the
		// time bound counts from its last byte. One that fetched the
		// same bytes again did not.
		if step, done, _ := meter.Read(); step == v1.StepImageDownload && done > furthest {
			furthest, first = done, meter.movedAt()
		}
		if why, stop := pol.giveUp(attempt, first, delay); stop {
			return dr, imageFailure(attempt, time.Since(first), why, err)
		}
		r.log().Warn("image download interrupted; fetching it again", "attempt", attempt, "err", err, "delay", delay.String())
		pol.retrying("image download", attempt, delay, err)
		backoff(ctx, &delay) // a cancelled ctx ends the next attempt at once
	}
}

// imageFailure is the deploy's image download given up after attempts;
// why, when set, is the time bound that ended it after elapsed.
func imageFailure(attempts int, elapsed time.Duration, why string, err error) error {
	times := "attempts"
	if attempts == 1 {
		times = "attempt"
	}
	if why != "" {
		return fmt.Errorf("image download: gave up after %d %s in %v (%s): %w", attempts, times, elapsed.Round(time.Millisecond), why, err)
	}
	return fmt.Errorf("image download: gave up after %d %s: %w", attempts, times, err)
}

// openImage opens the plan's whole image from the controller; a response
// that delivers no bytes for StallTimeout fails the attempt (errStalled,
// retried by deploy like a cut stream).
func (r *Runner) openImage(plan v1.Plan) ImageOpener {
	d := stallTimeoutOr(r.StallTimeout)
	return func(ctx context.Context) (io.ReadCloser, error) {
		return openStalling(ctx, d, func(ctx context.Context) (io.ReadCloser, error) {
			return r.Client.Open(ctx, "get image", plan.ImageURL, plan.ImageToken)
		})
	}
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
