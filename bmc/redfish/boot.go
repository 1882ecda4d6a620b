package redfish

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/stmcginnis/gofish/schemas"

	"github.com/machina-metal/machina/bmc"
)

// Boot override targets (ComputerSystem.Boot.BootSourceOverrideTarget).
var bootTargets = map[bmc.BootDevice]string{
	bmc.BootPXE:       string(schemas.PxeBootSource),
	bmc.BootDisk:      string(schemas.HddBootSource),
	bmc.BootCD:        string(schemas.CdBootSource),
	bmc.BootBIOSSetup: string(schemas.BiosSetupBootSource),
}

var bootModes = map[bmc.BootMode]string{
	bmc.BootModeUEFI:   string(schemas.UEFIBootSourceOverrideMode),
	bmc.BootModeLegacy: string(schemas.LegacyBootSourceOverrideMode),
}

// SetBootOverride sets Boot.BootSourceOverrideTarget and
// BootSourceOverrideEnabled (Once, or Continuous when o.Persistent), and
// BootSourceOverrideMode only when it must change (or when the vendor's
// quirk says the BMC reverts it when left out). Where the System has
// @Redfish.Settings the settings object is PATCHed. Unsupported targets,
// enable values and systems without override properties are
// bmc.ErrUnsupported before anything is sent. The result is read back from
// the System; a mismatch is bmc.ErrMismatch, except that a one-time
// override the BMC did not honour (read back Continuous, or its old
// override kept, or Once not offered at all) is a *bmc.OnceError saying
// what the BMC is set to now.
//
// Requests, and the BMC behaviour each is for:
//   - GET System before the PATCH: the current override (a Once the BMC
//     then leaves unchanged is told from one it applied), its
//     @Redfish.AllowableValues (XCC offers no Continuous, some BMCs no
//     Legacy) and @Redfish.Settings (XCC takes the PATCH on
//     Systems/1/Pending). Under bmc.ShareReads it may be the operation's
//     newest System answer (a second override after a *bmc.OnceError
//     starts from the first one's read-back), as it only chooses the
//     PATCH.
//   - GET of the PATCH target for its ETag, first, on BMCs whose quirk
//     row says they require If-Match (Lenovo XCC), or after a 428/412.
//   - PATCH.
//   - GET System after the PATCH, always from the BMC: BMCs answer 2xx
//     and store Continuous for Once, keep their old override, or revert
//     BootSourceOverrideMode when it is left out (Supermicro); some
//     answer 400 and apply it. The read-back is the only truth.
func (d *Driver) SetBootOverride(ctx context.Context, o bmc.BootOverride) (err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	target, ok := bootTargets[o.Device]
	if !ok {
		return fmt.Errorf("redfish: set boot override: unknown device %q", o.Device)
	}
	sp, sys, err := d.sysState(ctx, "set boot override", readShared)
	if err != nil {
		return err
	}
	boot := obj(sys, "Boot")
	if _, has := boot["BootSourceOverrideTarget"]; !has {
		return fmt.Errorf("redfish: set boot override: system has no Boot.BootSourceOverrideTarget: %w", bmc.ErrUnsupported)
	}
	if allowed, ok := strList(boot, "BootSourceOverrideTarget@Redfish.AllowableValues"); ok && !slices.Contains(allowed, target) {
		return fmt.Errorf("redfish: set boot override: target %s not in %v: %w", target, allowed, bmc.ErrUnsupported)
	}
	enabled := string(schemas.OnceBootSourceOverrideEnabled)
	if o.Persistent {
		enabled = string(schemas.ContinuousBootSourceOverrideEnabled)
	}
	if allowed, ok := strList(boot, "BootSourceOverrideEnabled@Redfish.AllowableValues"); ok && !slices.Contains(allowed, enabled) && !o.Persistent && slices.Contains(allowed, string(schemas.ContinuousBootSourceOverrideEnabled)) {
		// Only Continuous offered: say so, send nothing; the caller may
		// ask for Continuous and set disk back after the boot.
		return &bmc.OnceError{Want: o, Got: bootFrom(sys), Outcome: bmc.OnceUnsupported}
	} else if ok && !slices.Contains(allowed, enabled) {
		return fmt.Errorf("redfish: set boot override: BootSourceOverrideEnabled %s not in %v: %w", enabled, allowed, bmc.ErrUnsupported)
	}
	curMode, hasMode := str(boot, "BootSourceOverrideMode")
	wantMode, err := overrideMode(boot, o.Mode, curMode, hasMode)
	if err != nil {
		return err
	}
	q := d.q()
	if q.BootModeReadOnly && wantMode != "" && wantMode != curMode {
		return fmt.Errorf("redfish: set boot override: mode %s wanted, %s set, and this BMC refuses BootSourceOverrideMode in a PATCH: %w", wantMode, curMode, bmc.ErrUnsupported)
	}
	patchPath := sp
	if so := link(obj(sys, "@Redfish.Settings"), "SettingsObject"); so != "" {
		patchPath = so
	}
	props := map[string]any{"BootSourceOverrideTarget": target, "BootSourceOverrideEnabled": enabled}
	switch {
	case wantMode != "" && wantMode != curMode:
		props["BootSourceOverrideMode"] = wantMode
	case q.SendBootModeAlways && hasMode && !q.BootModeReadOnly:
		if wantMode == "" {
			wantMode = curMode
		}
		props["BootSourceOverrideMode"] = wantMode
	}
	prev := [3]string{strv(boot, "BootSourceOverrideTarget"), strv(boot, "BootSourceOverrideEnabled"), strv(boot, "BootSourceOverrideMode")}
	d.cfg.Logger.Info("redfish set boot override", "target", target, "enabled", enabled, "mode", props["BootSourceOverrideMode"])
	perr := d.patch(ctx, "set boot override", patchPath, map[string]any{"Boot": props})
	// Read back: the System is the truth, whatever the PATCH answered.
	_, sys, err = d.sysState(ctx, "set boot override: read back", readFresh)
	if err != nil {
		return errors.Join(perr, err)
	}
	boot = obj(sys, "Boot")
	mism := readBackMismatch(boot, target, enabled, wantMode)
	if len(mism) > 0 && perr == nil && !o.Persistent {
		if oe := d.onceOutcome(o, sys, target, prev); oe != nil {
			return oe
		}
	}
	if len(mism) > 0 {
		if perr != nil {
			return perr // names the operation, the request and the status
		}
		return fmt.Errorf("redfish: set boot override: %s: %w", strings.Join(mism, "; "), bmc.ErrMismatch)
	}
	if perr != nil {
		d.cfg.Logger.Warn("redfish set boot override: BMC reported an error but applied the change", "err", perr)
	}
	return nil
}

// onceOutcome says what a BMC that was asked for a one-time override and
// read back something else did: stored Continuous instead (OnceCoerced),
// or kept its override, not Once or nothing changed since prev
// (OnceIgnored); nil for any other mismatch.
func (d *Driver) onceOutcome(o bmc.BootOverride, sys map[string]any, target string, prev [3]string) *bmc.OnceError {
	boot := obj(sys, "Boot")
	// Once asked, something else read back: say what the BMC did.
	got := bootFrom(sys)
	gotEnabled := strv(boot, "BootSourceOverrideEnabled")
	switch {
	case gotEnabled == string(schemas.ContinuousBootSourceOverrideEnabled) && strv(boot, "BootSourceOverrideTarget") == target:
		d.cfg.Logger.Warn("redfish set boot override: BMC stored Continuous for Once: a persistent override is now set", "target", target)
		return &bmc.OnceError{Want: o, Got: got, Outcome: bmc.OnceCoerced}
	case gotEnabled != string(schemas.OnceBootSourceOverrideEnabled) ||
		prev == [3]string{strv(boot, "BootSourceOverrideTarget"), gotEnabled, strv(boot, "BootSourceOverrideMode")}:
		// Not Once, or nothing changed at all: the PATCH was dropped.
		d.cfg.Logger.Warn("redfish set boot override: BMC accepted Once but kept its override", "read", gotEnabled+" "+strv(boot, "BootSourceOverrideTarget"))
		return &bmc.OnceError{Want: o, Got: got, Outcome: bmc.OnceIgnored}
	}
	return nil
}

// overrideMode is the BootSourceOverrideMode to ask for ("" for
// BootModeUnset: leave the BMC's), refused with ErrUnsupported when the
// BMC has no mode property or does not allow it.
func overrideMode(boot map[string]any, want bmc.BootMode, curMode string, hasMode bool) (string, error) {
	if want == bmc.BootModeUnset {
		return "", nil
	}
	m, ok := bootModes[want]
	if !ok {
		return "", fmt.Errorf("redfish: set boot override: unknown mode %q", want)
	}
	wantMode := m
	if wantMode != curMode {
		if !hasMode {
			return "", fmt.Errorf("redfish: set boot override: mode %s wanted but the BMC has no BootSourceOverrideMode: %w", wantMode, bmc.ErrUnsupported)
		}
		if allowed, ok := strList(boot, "BootSourceOverrideMode@Redfish.AllowableValues"); ok && !slices.Contains(allowed, wantMode) {
			return "", fmt.Errorf("redfish: set boot override: mode %s not in %v: %w", wantMode, allowed, bmc.ErrUnsupported)
		}
	}
	return wantMode, nil
}

// readBackMismatch lists the override properties that do not read back
// as asked.
func readBackMismatch(boot map[string]any, target, enabled, wantMode string) []string {
	var mism []string
	if got := strv(boot, "BootSourceOverrideTarget"); got != target {
		mism = append(mism, fmt.Sprintf("BootSourceOverrideTarget want %s, read %q", target, got))
	}
	if got := strv(boot, "BootSourceOverrideEnabled"); got != enabled {
		mism = append(mism, fmt.Sprintf("BootSourceOverrideEnabled want %s, read %q", enabled, got))
	}
	if wantMode != "" {
		if got := strv(boot, "BootSourceOverrideMode"); got != wantMode {
			mism = append(mism, fmt.Sprintf("BootSourceOverrideMode want %s, read %q", wantMode, got))
		}
	}
	return mism
}

// patch sends a PATCH with the ETag policy: If-Match up front when the
// vendor quirk says so; on 428/412 re-read, normalise the ETag (quotes,
// W/, -gzip) and retry once; never when Config.DisableETag.
func (d *Driver) patch(ctx context.Context, op, p string, body map[string]any) error {
	r, err := d.patchResp(ctx, op, p, body)
	if err != nil {
		return err
	}
	if err := d.followTask(ctx, op, r); err != nil {
		return err
	}
	return extendedError(d.cfg.Endpoint, op, r)
}

// patchResp sends a PATCH with the ETag policy of patch and returns the
// answer without following a task: a settings write that answers 202 with
// a Dell configuration job runs only at the next reset.
func (d *Driver) patchResp(ctx context.Context, op, p string, body map[string]any) (*response, error) {
	etag := ""
	if d.q().SendIfMatch && !d.cfg.DisableETag {
		e, err := d.etag(ctx, op, p, false)
		if err != nil {
			return nil, err
		}
		etag = e
	}
	r, err := d.conn.do(ctx, op, http.MethodPatch, p, body, reqOpts{ifMatch: etag})
	var se *statusError
	if err != nil && !d.cfg.DisableETag && errors.As(err, &se) && (se.Status == http.StatusPreconditionRequired || se.Status == http.StatusPreconditionFailed) {
		e, gerr := d.etag(ctx, op, p, true)
		if gerr != nil {
			return nil, errors.Join(err, gerr)
		}
		d.cfg.Logger.Debug("redfish patch: retrying with If-Match", "status", se.Status)
		r, err = d.conn.do(ctx, op, http.MethodPatch, p, body, reqOpts{ifMatch: e})
	}
	return r, err
}

// etag reads p and returns its ETag header, or its @odata.etag; normalised
// when norm (after the BMC refused the raw value).
func (d *Driver) etag(ctx context.Context, op, p string, norm bool) (string, error) {
	r, err := d.conn.do(ctx, op+": read etag", http.MethodGet, p, nil, reqOpts{})
	if err != nil {
		return "", err
	}
	e := r.header.Get("ETag")
	if norm || e == "" {
		if b := strv(r.body, "@odata.etag"); b != "" {
			e = b
		}
		e = normETag(e)
	}
	return e, nil
}

// extendedError returns a *bmc.BMCError when a 2xx answer carries an error
// in @Message.ExtendedInfo (Severity/MessageSeverity Critical or Warning
// with an error-looking MessageId). The caller's read-back decides; this is
// only used when the read back cannot.
func extendedError(bmcName, op string, r *response) error {
	if r == nil || r.body == nil {
		return nil
	}
	infos, _ := r.body["@Message.ExtendedInfo"].([]any)
	for _, i := range infos {
		m, _ := i.(map[string]any)
		sev := strv(m, "MessageSeverity")
		if sev == "" {
			sev = strv(m, "Severity")
		}
		if sev == "Critical" {
			return &bmc.BMCError{BMC: bmcName, Op: op, Request: r.request, Status: r.status, Code: strv(m, "MessageId"), Message: sanitize(strv(m, "Message"))}
		}
	}
	return nil
}

// BootOverride reads the System's Boot override. Device is "" when the
// override is Disabled or the target is None or not one of ours.
func (d *Driver) BootOverride(ctx context.Context) (_ bmc.BootOverride, err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	_, sys, err := d.sysState(ctx, "read boot override", readFresh)
	if err != nil {
		return bmc.BootOverride{}, err
	}
	return bootFrom(sys), nil
}

// bootFrom decodes ComputerSystem.Boot.
func bootFrom(sys map[string]any) bmc.BootOverride {
	boot := obj(sys, "Boot")
	var o bmc.BootOverride
	en := strv(boot, "BootSourceOverrideEnabled")
	if en == "Disabled" || en == "" {
		return o
	}
	o.Persistent = en == "Continuous"
	t := strv(boot, "BootSourceOverrideTarget")
	for dev, name := range bootTargets {
		if name == t {
			o.Device = dev
		}
	}
	for m, name := range bootModes {
		if name == strv(boot, "BootSourceOverrideMode") {
			o.Mode = m
		}
	}
	return o
}

// parseRef turns an absolute URL or a path into a path with query.
func parseRef(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", err
	}
	return u.RequestURI(), nil
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}
