package ipmi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/machina-metal/machina/bmc"
)

// Chassis Control data byte 1 values (IPMI v2.0 §28.3, table 28-4).
const (
	ctlPowerDown  uint8 = 0x00
	ctlPowerUp    uint8 = 0x01
	ctlPowerCycle uint8 = 0x02
	ctlHardReset  uint8 = 0x03
	ctlSoftOff    uint8 = 0x05
)

var ctlNames = map[uint8]string{
	ctlPowerDown: "power down", ctlPowerUp: "power up", ctlPowerCycle: "power cycle",
	ctlHardReset: "hard reset", ctlSoftOff: "soft shutdown",
}

// PowerState reads Get Chassis Status (NetFn 00h, Cmd 01h) byte 1 bit 0.
func (d *Driver) PowerState(ctx context.Context) (_ bmc.PowerState, err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Address, err) }()
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.powerState(ctx)
}

func (d *Driver) powerState(ctx context.Context) (bmc.PowerState, error) {
	res, err := d.raw(ctx, "get chassis status", types.NetFnChassisRequest, 0x01, nil)
	if err != nil {
		return bmc.PowerUnknown, err
	}
	if len(res) < 1 {
		return bmc.PowerUnknown, fmt.Errorf("ipmi: get chassis status: %d data bytes, want at least 1", len(res))
	}
	if res[0]&0x01 != 0 {
		return bmc.PowerOn, nil
	}
	return bmc.PowerOff, nil
}

// chassisControl sends Chassis Control (NetFn 00h, Cmd 02h) with value ctl.
func (d *Driver) chassisControl(ctx context.Context, ctl uint8) error {
	d.log.Info("ipmi chassis control", "action", ctlNames[ctl])
	_, err := d.raw(ctx, "chassis control "+ctlNames[ctl], types.NetFnChassisRequest, 0x02, []byte{ctl})
	return err
}

// Power performs a idempotently and verifies it by reading chassis status:
//
//   - on/off/soft-off in the wanted state already send nothing;
//   - reset and cycle of a powered-off chassis send power up;
//   - cycle rejected with 0xD5, 0xCC, 0xC1, 0xC9 or 0xD6 falls back to hard
//     reset, and if that is rejected too, to power down + power up;
//   - soft-off waits SoftOffTimeout for the chassis to go off, then powers
//     it down hard.
//
// It returns nil once the chassis reports the wanted state, an error
// wrapping bmc.ErrTimeout (naming wanted and read state) after
// PowerTimeout (also wrapping bmc.ErrUnreachable, and saying the BMC
// stopped answering, when its newest reads failed), or the classified BMC
// error.
func (d *Driver) Power(ctx context.Context, a bmc.PowerAction) (err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Address, err) }()
	if _, err := bmc.ParsePowerAction(string(a)); err != nil {
		return fmt.Errorf("ipmi: power: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	cur, err := d.powerState(ctx)
	if err != nil {
		return err
	}
	switch a {
	case bmc.PowerActionOn:
		if cur == bmc.PowerOn {
			return nil
		}
		return d.controlAndWait(ctx, ctlPowerUp, bmc.PowerOn, d.cfg.PowerTimeout)
	case bmc.PowerActionOff:
		if cur == bmc.PowerOff {
			return nil
		}
		return d.controlAndWait(ctx, ctlPowerDown, bmc.PowerOff, d.cfg.PowerTimeout)
	case bmc.PowerActionSoftOff:
		if cur == bmc.PowerOff {
			return nil
		}
		err := d.controlAndWait(ctx, ctlSoftOff, bmc.PowerOff, d.cfg.SoftOffTimeout)
		if err == nil {
			return nil
		}
		if !errors.Is(err, bmc.ErrTimeout) && !isRejected(err) {
			return err
		}
		d.log.Warn("ipmi soft shutdown did not power off; forcing off", "err", err)
		return d.controlAndWait(ctx, ctlPowerDown, bmc.PowerOff, d.cfg.PowerTimeout)
	case bmc.PowerActionReset:
		if cur == bmc.PowerOff {
			// Some BMCs ack a reset of an off host and do nothing (bmclib#211).
			return d.controlAndWait(ctx, ctlPowerUp, bmc.PowerOn, d.cfg.PowerTimeout)
		}
		d.sawOff, d.lostAnswer, d.evidence = false, false, ""
		if err := d.controlAndWait(ctx, ctlHardReset, bmc.PowerOn, d.cfg.PowerTimeout); err != nil {
			return err
		}
		return d.verified(a)
	case bmc.PowerActionCycle:
		if cur == bmc.PowerOff {
			return d.controlAndWait(ctx, ctlPowerUp, bmc.PowerOn, d.cfg.PowerTimeout)
		}
		d.sawOff, d.lostAnswer, d.evidence = false, false, ""
		if err := d.cycle(ctx); err != nil {
			return err
		}
		return d.verified(a)
	}
	return fmt.Errorf("ipmi: power %s: %w", a, bmc.ErrUnsupported)
}

// verified turns the chassis status sequence seen during a reset or cycle
// of a running chassis into evidence: off then on proves it; on throughout
// (a hard reset keeps the power on, and Get Chassis Status has nothing
// else that moves) is a *bmc.ResetError.
func (d *Driver) verified(a bmc.PowerAction) error {
	if d.sawOff {
		d.evidence = "IPMI chassis status: off, then on"
		return nil
	}
	if d.lostAnswer {
		return &bmc.ResetError{Action: a, Why: "the BMC's answer to Chassis Control was lost and it was not resent (a second one would restart the machine again); IPMI chassis status read on throughout"}
	}
	return &bmc.ResetError{Action: a, Why: "IPMI chassis status read on throughout (a hard reset keeps power on); no other evidence over IPMI"}
}

// LastResetEvidence implements bmc.ResetEvidence.
func (d *Driver) LastResetEvidence() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.evidence
}

// cycle runs power cycle with its fallbacks; the chassis is on.
func (d *Driver) cycle(ctx context.Context) error {
	err := d.controlAndWait(ctx, ctlPowerCycle, bmc.PowerOn, d.cfg.PowerTimeout)
	if !isRejected(err) {
		return err
	}
	d.log.Info("ipmi power cycle rejected; trying hard reset", "err", err)
	err = d.controlAndWait(ctx, ctlHardReset, bmc.PowerOn, d.cfg.PowerTimeout)
	if !isRejected(err) {
		return err
	}
	d.log.Info("ipmi hard reset rejected; powering down and up", "err", err)
	if err := d.controlAndWait(ctx, ctlPowerDown, bmc.PowerOff, d.cfg.PowerTimeout); err != nil {
		return err
	}
	return d.controlAndWait(ctx, ctlPowerUp, bmc.PowerOn, d.cfg.PowerTimeout)
}

// isRejected reports a completion code that means "not this way" rather than
// "broken": the fallbacks of cycle apply to these.
func isRejected(err error) bool {
	var ce *CompletionError
	if !errors.As(err, &ce) {
		return false
	}
	switch ce.Code {
	case 0xD5, 0xCC, 0xC1, 0xC9, 0xD6:
		return true
	}
	return false
}

// controlAndWait sends ctl and polls chassis status until want is read or
// timeout passes. Cycle and hard reset are not idempotent: a retransmitted
// request is a second cycle (ipmi_sim runs it again, and IPMI v2.0 §6.12.13
// lets a BMC accept a repeated session sequence number inside its window),
// so they go out once, without retransmission or session re-run
// (controlOnce); see lostControl for what a lost answer leads to.
func (d *Driver) controlAndWait(ctx context.Context, ctl uint8, want bmc.PowerState, timeout time.Duration) error {
	var err error
	if ctl == ctlPowerCycle || ctl == ctlHardReset {
		if err = d.controlOnce(ctx, ctl); errors.Is(err, errAnswerLost) {
			return d.lostControl(ctx, ctl, want, timeout, err)
		}
	} else {
		err = d.chassisControl(ctx, ctl)
	}
	if err != nil {
		return err
	}
	return d.waitPower(ctx, ctlNames[ctl], want, timeout)
}

// errAnswerLost marks a Chassis Control request sent once whose answer did
// not come within Config.Timeout: the BMC may or may not have acted on it.
var errAnswerLost = errors.New("no answer to a request sent once")

// controlOnce sends Chassis Control ctl in one datagram: no retransmission
// (the client's retry count is 0 for this exchange) and no session re-run.
// A lost answer is errAnswerLost; other errors are classified like raw's.
func (d *Driver) controlOnce(ctx context.Context, ctl uint8) error {
	op := "chassis control " + ctlNames[ctl]
	d.log.Info("ipmi chassis control", "action", ctlNames[ctl], "retransmit", false)
	c, err := d.session(ctx)
	if err != nil {
		return err
	}
	c.WithRetry(0)
	_, err = c.RawCommand(ctx, types.NetFnChassisRequest, 0x02, []byte{ctl}, op)
	c.WithRetry(d.cfg.Retries)
	if err != nil && ctx.Err() == nil && isTimeout(err) {
		return fmt.Errorf("ipmi: %s: %w: %v", op, errAnswerLost, err)
	}
	return classify(op, err)
}

// lostControl decides what a cycle or hard reset whose answer was lost did,
// from Get Chassis Status alone, and never sends it a second time:
//
//   - cycle: IPMI v2.0 §28.3 (table 28-4) gives a power cycle an off
//     interval of at least 1 s, so the chassis is polled for off for up to
//     three exchange timeouts (bounded by timeout). Reading off proves the
//     cycle was carried out, and the wait for on continues as usual. On
//     throughout means either the request never arrived or its off phase
//     passed while the answer was awaited: Power then reports the cycle
//     unverified (*bmc.ResetError) rather than risk cycling the machine twice.
//   - hard reset: nothing in chassis status can tell (power stays on); the
//     wait for on returns at once and Power reports the reset unverified, as
//     it does for every hard reset of a running chassis.
func (d *Driver) lostControl(ctx context.Context, ctl uint8, want bmc.PowerState, timeout time.Duration, lost error) error {
	d.log.Warn("ipmi chassis control answer lost; reading chassis status instead of resending", "action", ctlNames[ctl], "err", lost)
	d.lostAnswer = true
	if ctl == ctlPowerCycle {
		grace := min(3*d.cfg.Timeout, timeout)
		err := d.waitPower(ctx, ctlNames[ctl], bmc.PowerOff, grace)
		if err != nil && !errors.Is(err, bmc.ErrTimeout) {
			return err
		}
		if err != nil {
			d.log.Warn("ipmi chassis read on throughout after a power cycle whose answer was lost; not resending it", "grace", grace)
		}
	}
	return d.waitPower(ctx, ctlNames[ctl], want, timeout)
}

func (d *Driver) waitPower(ctx context.Context, op string, want bmc.PowerState, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTimer(0)
	defer t.Stop()
	start := time.Now()
	var last bmc.PowerState = bmc.PowerUnknown
	var lastOK time.Time // when the BMC last answered a read
	var lastErr error    // the newest read's (transient) error; nil when it answered
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("ipmi: %s: wait for power %s (read %s): %w", op, want, last, ctx.Err())
		case <-t.C:
		}
		got, err := d.powerState(ctx)
		if err != nil && !bmc.IsTransient(err) {
			return err
		}
		lastErr = err
		if err == nil {
			last, lastOK = got, time.Now()
			if got == bmc.PowerOff {
				d.sawOff = true
			}
			if got == want {
				return nil
			}
		}
		if time.Now().After(deadline) {
			if lastErr != nil {
				// The BMC stopped answering (it reboots itself, or the
				// network dropped): "read off" would be a stale reading.
				said := "it never answered a power state read"
				if !lastOK.IsZero() {
					said = fmt.Sprintf("it last answered %s in, reading %s", lastOK.Sub(start).Round(100*time.Millisecond), last)
				}
				return fmt.Errorf("ipmi: %s: wanted power %s: the BMC stopped answering (%s; waited %s; last error: %v): %w",
					op, want, said, timeout, lastErr, errors.Join(bmc.ErrTimeout, bmc.ErrUnreachable))
			}
			return fmt.Errorf("ipmi: %s: %w: wanted power %s, read %s after %s", op, bmc.ErrTimeout, want, last, timeout)
		}
		t.Reset(d.cfg.PollInterval)
	}
}
