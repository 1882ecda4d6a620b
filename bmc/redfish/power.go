package redfish

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/stmcginnis/gofish/schemas"

	"github.com/machina-metal/machina/bmc"
)

// resetAction is the ComputerSystem.Reset action of one System.
type resetAction struct {
	target string
	// allowed are the ResetType values the BMC lists; known is false when it
	// lists none (neither inline nor in an ActionInfo): unknown, not all.
	allowed []string
	known   bool
}

// resetInfo reads the Reset target and its allowed ResetTypes, inline
// (`ResetType@Redfish.AllowableValues`) or from `@Redfish.ActionInfo`
// (ActionInfo.Parameters[Name=ResetType].AllowableValues).
func (d *Driver) resetInfo(ctx context.Context, sys map[string]any) (resetAction, error) {
	act := obj(obj(sys, "Actions"), "#ComputerSystem.Reset")
	ra := resetAction{target: strv(act, "target")}
	if ra.target == "" {
		return ra, fmt.Errorf("redfish: power: system has no ComputerSystem.Reset action: %w", bmc.ErrUnsupported)
	}
	if v, ok := strList(act, "ResetType@Redfish.AllowableValues"); ok {
		ra.allowed, ra.known = v, true
		return ra, nil
	}
	if ai := strv(act, "@Redfish.ActionInfo"); ai != "" {
		info, err := d.get(ctx, "power: read reset action info", ai)
		if err != nil {
			return ra, err
		}
		ps, _ := info["Parameters"].([]any)
		for _, p := range ps {
			pm, _ := p.(map[string]any)
			if strv(pm, "Name") == "ResetType" {
				if v, ok := strList(pm, "AllowableValues"); ok {
					ra.allowed, ra.known = v, true
				}
			}
		}
	}
	return ra, nil
}

// candidates are the ResetTypes for each step, most preferred first.
var (
	rtOn      = []schemas.ResetType{schemas.OnResetType, schemas.ForceOnResetType, schemas.PushPowerButtonResetType}
	rtOff     = []schemas.ResetType{schemas.ForceOffResetType, schemas.PushPowerButtonResetType}
	rtSoftOff = []schemas.ResetType{schemas.GracefulShutdownResetType}
	rtRestart = []schemas.ResetType{schemas.ForceRestartResetType, schemas.GracefulRestartResetType}
	rtCycle   = []schemas.ResetType{schemas.PowerCycleResetType, schemas.ForceRestartResetType}
)

// choose returns the candidates the BMC allows, in preference order. With
// no AllowableValues every candidate is returned: they are tried in turn,
// falling back when the BMC says the value is not supported.
func (ra resetAction) choose(cands []schemas.ResetType) []string {
	var out []string
	for _, c := range cands {
		if !ra.known || slices.Contains(ra.allowed, string(c)) {
			out = append(out, string(c))
		}
	}
	return out
}

// Power performs a idempotently: on for a running machine and off for a
// stopped one send nothing; reset and cycle of a stopped machine power it
// on. After a command it polls PowerState until it matches or
// Config.PowerTimeout passes (bmc.ErrTimeout). A reset whose answer was lost
// is never repeated without re-reading PowerState.
//
// Requests, and the BMC behaviour each is for:
//   - GET System first: the power state (idempotency: nothing is sent to
//     a machine already there), the Reset target and its allowed
//     ResetTypes, and LastResetTime/BootProgress before the reset (reset
//     evidence). Under bmc.ShareReads it may be the operation's newest
//     System answer when nothing was written since (a netboot's override
//     read-back), as it only chooses the reset.
//   - GET @Redfish.ActionInfo when the allowed types are not inline
//     (OpenBMC bmcweb, Supermicro X13).
//   - POST ComputerSystem.Reset, once per type the BMC accepts.
//   - GET System polls after it, always from the BMC: BMCs read
//     PoweringOn/Off or the old state for seconds after accepting a
//     reset (iDRAC 9, iLO 5, bmcweb), and a reset of a running machine
//     is proved only by a dip to Off or moved reset marks.
func (d *Driver) Power(ctx context.Context, a bmc.PowerAction) (err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	if _, err := bmc.ParsePowerAction(string(a)); err != nil {
		return err
	}
	_, sys, err := d.sysState(ctx, "power "+string(a), readShared)
	if err != nil {
		return err
	}
	ra, err := d.resetInfo(ctx, sys)
	if err != nil {
		return err
	}
	cur := powerOf(sys)
	log := d.cfg.Logger.With("action", string(a))
	switch a {
	case bmc.PowerActionOn:
		if cur == bmc.PowerOn {
			log.Debug("redfish power: already on")
			return nil
		}
		return d.resetTo(ctx, ra, rtOn, bmc.PowerOn, d.cfg.PowerTimeout, resetMarks(sys))
	case bmc.PowerActionOff:
		if cur == bmc.PowerOff {
			log.Debug("redfish power: already off")
			return nil
		}
		return d.resetTo(ctx, ra, rtOff, bmc.PowerOff, d.cfg.PowerTimeout, marks{})
	case bmc.PowerActionSoftOff:
		if cur == bmc.PowerOff {
			return nil
		}
		if len(ra.choose(rtSoftOff)) > 0 {
			err := d.resetTo(ctx, ra, rtSoftOff, bmc.PowerOff, d.cfg.SoftOffTimeout, marks{})
			if err == nil || !errors.Is(err, bmc.ErrTimeout) && !errors.Is(err, bmc.ErrUnsupported) {
				return err
			}
			log.Warn("redfish power: graceful shutdown did not finish, forcing off", "waited", d.cfg.SoftOffTimeout)
		}
		return d.resetTo(ctx, ra, rtOff, bmc.PowerOff, d.cfg.PowerTimeout, marks{})
	case bmc.PowerActionReset, bmc.PowerActionCycle:
		if cur == bmc.PowerOff {
			log.Debug("redfish power: machine is off, powering on instead")
			return d.resetTo(ctx, ra, rtOn, bmc.PowerOn, d.cfg.PowerTimeout, resetMarks(sys))
		}
		cands := rtRestart
		if a == bmc.PowerActionCycle {
			cands = rtCycle
		}
		before := resetMarks(sys)
		d.setEvidence("", false)
		if len(ra.choose(cands)) > 0 {
			err := d.resetTo(ctx, ra, cands, bmc.PowerOn, d.cfg.PowerTimeout, marks{})
			if err == nil {
				return d.verifyReset(ctx, a, before)
			}
			if !errors.Is(err, bmc.ErrUnsupported) {
				return err
			}
		}
		// No restart type: ForceOff, wait for Off, then On. Off was seen.
		if err := d.resetTo(ctx, ra, rtOff, bmc.PowerOff, d.cfg.PowerTimeout, marks{}); err != nil {
			return err
		}
		if err := d.resetTo(ctx, ra, rtOn, bmc.PowerOn, d.cfg.PowerTimeout, marks{}); err != nil {
			return err
		}
		d.setEvidence("power-off observed (ForceOff, then On)", false)
		return nil
	}
	return nil
}

// marks are the System properties that move when the host restarts:
// LastResetTime (ComputerSystem v1.12) and BootProgress (LastState,
// LastStateTime; v1.13). has is false when the BMC reports neither.
type marks struct {
	lastReset, bootState, bootTime string
	has                            bool
}

func resetMarks(sys map[string]any) marks {
	bp := obj(sys, "BootProgress")
	m := marks{lastReset: strv(sys, "LastResetTime"), bootState: strv(bp, "LastState"), bootTime: strv(bp, "LastStateTime")}
	_, hasLRT := sys["LastResetTime"]
	m.has = hasLRT || bp != nil
	return m
}

// LastReset implements bmc.ResetClock: one GET of the ComputerSystem, its
// PowerState and LastResetTime (ComputerSystem v1.12, RFC 3339 with the
// BMC's offset). ok is false when the property is absent, empty or does
// not parse.
func (d *Driver) LastReset(ctx context.Context) (ps bmc.PowerState, last time.Time, ok bool, err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	_, sys, err := d.sysState(ctx, "read last reset time", readFresh)
	if err != nil {
		return bmc.PowerUnknown, time.Time{}, false, err
	}
	ps = powerOf(sys)
	t, perr := time.Parse(time.RFC3339Nano, strv(sys, "LastResetTime"))
	if perr != nil || t.IsZero() {
		return ps, time.Time{}, false, nil
	}
	return ps, t, true, nil
}

// setEvidence records what proved the last reset; off notes a power-off
// seen while waiting.
func (d *Driver) setEvidence(ev string, off bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.evidence = ev
	if off {
		d.sawOff = true
	} else if ev == "" {
		d.sawOff = false
	}
}

// LastResetEvidence implements bmc.ResetEvidence: what proved the last
// reset or cycle ("" when none did or none was sent).
func (d *Driver) LastResetEvidence() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.evidence
}

// verifyReset looks for proof that a reset of a running machine happened.
// A reset keeps the machine on by design, so "on" after it proves nothing
// either way, unlike on and off, which are verified by the PowerState they
// reach. The proof is a power-off seen while waiting for On or while
// watching here (the host then waits for On again), a completed task, or a
// changed LastResetTime or BootProgress, watched for
// Config.ResetEvidenceTimeout (BMCs stamp the marks a few seconds after the
// reset). A BMC that reports neither mark has nothing to watch: the answer
// is at once. Without proof it is a *bmc.ResetError saying what was looked
// at, never success.
func (d *Driver) verifyReset(ctx context.Context, a bmc.PowerAction, before marks) error {
	d.mu.Lock()
	off, ev := d.sawOff, d.evidence
	d.mu.Unlock()
	switch {
	case ev != "":
		return nil // a completed task
	case off:
		d.setEvidence("power-off observed", false)
		return nil
	case !before.has:
		return &bmc.ResetError{Action: a, Why: "a reset keeps the machine on by design, so its power state cannot show it; this BMC answered with no task and reports neither LastResetTime nor BootProgress, which would, and no power-off was seen while waiting for On"}
	}
	wctx, cancel := context.WithTimeout(ctx, d.cfg.ResetEvidenceTimeout)
	defer cancel()
	for {
		_, sys, err := d.sysState(wctx, "power "+string(a)+": verify", readFresh)
		if err == nil {
			now := resetMarks(sys)
			switch {
			case now.lastReset != before.lastReset && now.lastReset != "":
				d.setEvidence("LastResetTime changed", false)
				return nil
			case (now.bootTime != before.bootTime && now.bootTime != "") || (now.bootState != before.bootState && now.bootState != ""):
				d.setEvidence("BootProgress moved", false)
				return nil
			case powerOf(sys) == bmc.PowerOff:
				// The restart is under way: proof, once the host is back on.
				if err := d.waitPower(ctx, bmc.PowerOn, d.cfg.PowerTimeout, marks{}); err != nil {
					return err
				}
				d.setEvidence("power-off observed", false)
				return nil
			}
		}
		t := time.NewTimer(d.cfg.PollInterval)
		select {
		case <-wctx.Done():
			t.Stop()
			if ctx.Err() != nil {
				return fmt.Errorf("redfish: power %s: verify: %w", a, ctx.Err())
			}
			return &bmc.ResetError{Action: a, Why: fmt.Sprintf("a reset keeps the machine on by design, and in %s of watching there was no power-off dip, no task, and LastResetTime and BootProgress did not change", d.cfg.ResetEvidenceTimeout)}
		case <-t.C:
		}
	}
}

// resetTo sends the first allowed ResetType of cands and waits for want.
// A value the BMC rejects as not supported moves on to the next candidate.
// A lost answer (connection dropped, timeout) re-reads PowerState before
// anything is sent again.
func (d *Driver) resetTo(ctx context.Context, ra resetAction, cands []schemas.ResetType, want bmc.PowerState, wait time.Duration, since marks) error {
	choices := ra.choose(cands)
	if len(choices) == 0 {
		return fmt.Errorf("redfish: power: none of %v allowed (BMC allows %v): %w", cands, ra.allowed, bmc.ErrUnsupported)
	}
	var lastErr error
	for _, rt := range choices {
		for attempt := 0; attempt <= d.cfg.Retries; attempt++ {
			d.cfg.Logger.Info("redfish reset", "resetType", rt, "want", want)
			r, err := d.conn.do(ctx, "reset "+rt, http.MethodPost, ra.target, map[string]any{"ResetType": rt}, reqOpts{once: true})
			if err == nil {
				if err := d.followTask(ctx, "reset "+rt, r); err != nil {
					return err
				}
				return d.waitPower(ctx, want, wait, since)
			}
			lastErr = err
			if notSupported(err) && !ra.known {
				d.cfg.Logger.Debug("redfish reset type refused, trying next", "resetType", rt)
				break
			}
			if !errors.Is(err, bmc.ErrUnreachable) {
				return err
			}
			// The answer was lost: the BMC may have acted. Re-read first.
			ps, perr := d.powerState(ctx, readFresh)
			if perr == nil && ps == want {
				return nil
			}
		}
		if !notSupported(lastErr) {
			return lastErr
		}
	}
	return fmt.Errorf("redfish: power: no ResetType of %v accepted: %w", choices, errors.Join(bmc.ErrUnsupported, lastErr))
}

// notSupported reports a 400 whose message says the parameter value is not
// allowed (Base ActionParameterValueNotInList / ...NotSupported).
func notSupported(err error) bool {
	var se *statusError
	if !errors.As(err, &se) || se.Status != http.StatusBadRequest {
		return false
	}
	for _, id := range append(se.ids, se.Code) {
		for _, m := range []string{"ActionParameterValueNotInList", "ActionParameterNotSupported", "PropertyValueNotInList", "ActionParameterValueError", "ActionNotSupported"} {
			if containsFold(id, m) {
				return true
			}
		}
	}
	return false
}

// waitPower polls PowerState until want, or returns bmc.ErrTimeout after
// wait. Power changes take time on real BMCs (iDRAC 9, iLO 5 and bmcweb
// read PoweringOn/PoweringOff meanwhile; some keep the old state until
// they poll the host again), so for want On it also accepts the BMC's word
// that the host is starting: PowerState "PoweringOn" (DSP2046: "a temporary
// state between off and on"), or LastResetTime or BootProgress moved past
// since (the System read before the reset; zero since skips that check).
// Without this, a host whose first boot is shorter than the BMC's
// transition (a ramdisk that reports and powers itself off while the BMC
// still reads PoweringOn or Off) was never seen On and the power-on timed
// out although it had happened.
func (d *Driver) waitPower(ctx context.Context, want bmc.PowerState, wait time.Duration, since marks) error {
	// Report the limit that fires: the caller's deadline when it comes
	// before Config.PowerTimeout (a CLI --timeout 40s), else the latter.
	limit := fmt.Sprintf("%s (power timeout)", wait)
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
		limit = fmt.Sprintf("%s (the caller's deadline)", time.Until(dl).Round(100*time.Millisecond))
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	last := bmc.PowerUnknown
	var lastOK time.Time // when the BMC last answered a read
	var lastErr error    // the newest read's error; nil when it answered
	for {
		_, sys, err := d.sysState(ctx, "power state", readFresh)
		if err == nil || ctx.Err() == nil {
			// A read cut short by the wait's own limit says nothing
			// about the BMC: keep the previous read's outcome.
			lastErr = err
		}
		if err == nil {
			ps := powerOf(sys)
			last, lastOK = ps, time.Now()
			if ps == want {
				return nil
			}
			if want == bmc.PowerOn {
				if raw := strv(sys, "PowerState"); raw == "PoweringOn" {
					d.cfg.Logger.Debug("redfish power: the BMC reads PoweringOn: the power-on took")
					return nil
				}
				if now := resetMarks(sys); since.has && ((now.lastReset != since.lastReset && now.lastReset != "") ||
					(now.bootTime != since.bootTime && now.bootTime != "")) {
					d.cfg.Logger.Debug("redfish power: LastResetTime or BootProgress moved: the host started", "power", string(ps))
					return nil
				}
			}
			if ps == bmc.PowerOff {
				d.setEvidence("", true)
			}
		}
		t := time.NewTimer(d.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return waitPowerError(d.cfg.Endpoint, want, last, limit, start, lastOK, lastErr)
		case <-t.C:
		}
	}
}

// waitPowerError is waitPower's error at its limit. When the newest read
// failed (the BMC stopped answering, as BMCs do while they reboot
// themselves or when the network drops) it says so, with when the BMC
// last answered and what it said, instead of "still <state>": the state
// is then unknown. It wraps bmc.ErrTimeout, and bmc.ErrUnreachable when
// the BMC stopped answering.
func waitPowerError(endpoint string, want, last bmc.PowerState, limit string, start, lastOK time.Time, lastErr error) error {
	if lastErr == nil {
		return fmt.Errorf("redfish %s: power: want %s, still %s after %s: %w", endpoint, want, last, limit, bmc.ErrTimeout)
	}
	said := "it never answered a power state read"
	if !lastOK.IsZero() {
		said = fmt.Sprintf("it last answered %s in, saying %s", lastOK.Sub(start).Round(100*time.Millisecond), last)
	}
	return fmt.Errorf("redfish %s: power: want %s: the BMC stopped answering (%s; waited %s; last error: %v): %w", endpoint, want, said, limit, lastErr, errors.Join(bmc.ErrTimeout, bmc.ErrUnreachable))
}

// followTask follows a 202 Accepted task monitor (DSP0266 §12.2: GET the
// Location until it stops answering 202) until the task completes, fails
// (error with the task's message) or Config.TaskTimeout passes.
func (d *Driver) followTask(ctx context.Context, op string, r *response) error {
	if r == nil || r.status != http.StatusAccepted {
		return nil
	}
	mon := r.header.Get("Location")
	if mon == "" {
		mon = strv(r.body, "@odata.id")
	}
	if mon == "" {
		return nil
	}
	if u, err := parseRef(mon); err == nil {
		mon = u
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.TaskTimeout)
	defer cancel()
	for {
		tr, err := d.conn.do(ctx, op+": task", http.MethodGet, mon, nil, reqOpts{})
		if err != nil {
			return err
		}
		state := strv(tr.body, "TaskState")
		switch state {
		case "Completed":
			if strings.HasPrefix(op, "reset ") {
				d.setEvidence("task completed", false)
			}
			return nil
		case "Exception", "Killed", "Cancelled", "Interrupted":
			msg := ""
			if ms, ok := tr.body["Messages"].([]any); ok && len(ms) > 0 {
				msg = strv(ms[0].(map[string]any), "Message")
			}
			return &bmc.BMCError{BMC: d.cfg.Endpoint, Op: op, Request: "GET " + mon, Status: tr.status, Code: "Task" + state, Message: sanitize(msg)}
		}
		if tr.status != http.StatusAccepted && state == "" {
			return nil // the operation's own answer
		}
		t := time.NewTimer(d.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("redfish: %s: task %s still %s: %w", op, mon, state, bmc.ErrTimeout)
		case <-t.C:
		}
	}
}
