package redfish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/machina-metal/machina/bmc"
)

var (
	_ bmc.BIOSConfigurer       = (*Driver)(nil)
	_ bmc.RAIDConfigurer       = (*Driver)(nil)
	_ bmc.FirmwareUpdater      = (*Driver)(nil)
	_ bmc.SecureBootConfigurer = (*Driver)(nil)
)

// biosPaths reads the System and returns its Bios path, or ErrUnsupported.
func (d *Driver) biosPath(ctx context.Context, op string) (string, error) {
	_, sys, err := d.system(ctx, op)
	if err != nil {
		return "", err
	}
	bp := link(sys, "Bios")
	if bp == "" {
		return "", fmt.Errorf("redfish: %s: the system has no Bios resource: %w", op, bmc.ErrUnsupported)
	}
	return bp, nil
}

// BIOS reads ComputerSystem.Bios, its settings object (the pending values)
// and the attribute registry the Bios names (AttributeRegistry, found in
// the Registries collection by name with any version: iDRAC's Bios names
// v1_0_3 and lists v1_0_0; Supermicro lists it under the Id
// BiosAttributeRegistry). A registry that cannot be read leaves
// BIOS.Registry nil.
func (d *Driver) BIOS(ctx context.Context) (_ *bmc.BIOS, err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	b, _, err := d.bios(ctx, "read bios")
	return b, err
}

func (d *Driver) bios(ctx context.Context, op string) (*bmc.BIOS, string, error) {
	bp, err := d.biosPath(ctx, op)
	if err != nil {
		return nil, "", err
	}
	body, err := d.get(ctx, op, bp)
	if err != nil {
		return nil, "", err
	}
	out := &bmc.BIOS{Attributes: normAttrs(obj(body, "Attributes"))}
	st := obj(body, "@Redfish.Settings")
	so := link(st, "SettingsObject")
	if ts, ok := strList(st, "SupportedApplyTimes"); ok {
		for _, t := range ts {
			out.SupportedApplyTimes = append(out.SupportedApplyTimes, bmc.ApplyTime(t))
		}
	}
	if so != "" {
		if sb, err := d.get(ctx, op, so); err == nil {
			for k, v := range normAttrs(obj(sb, "Attributes")) {
				if cur, has := out.Attributes[k]; !has || !bmc.SameValue(cur, v) {
					if out.Pending == nil {
						out.Pending = bmc.BIOSSettings{}
					}
					out.Pending[k] = v
				}
			}
		} else if !isNotFound(err) {
			return nil, "", err
		}
	}
	if name := strv(body, "AttributeRegistry"); name != "" {
		out.Registry = d.registry(ctx, op, name)
	}
	return out, so, nil
}

func normAttrs(m map[string]any) bmc.BIOSSettings {
	out := make(bmc.BIOSSettings, len(m))
	for k, v := range m {
		out[k] = bmc.NormalizeValue(v)
	}
	return out
}

func isNotFound(err error) bool {
	var be *bmc.BMCError
	return errors.As(err, &be) && be.Status == http.StatusNotFound
}

// registry finds and parses the attribute registry called name, caching
// it per name for the driver's life (iDRAC's is over a megabyte).
func (d *Driver) registry(ctx context.Context, op, name string) *bmc.BIOSRegistry {
	d.mu.Lock()
	r, ok := d.regs[name]
	root := d.root
	d.mu.Unlock()
	if ok {
		return r
	}
	rc := link(root, "Registries")
	if rc == "" {
		rc = "/redfish/v1/Registries"
	}
	coll, err := d.get(ctx, op, rc)
	if err != nil {
		d.cfg.Logger.Debug("redfish bios registry: no Registries", "err", err)
		return nil
	}
	want := regBase(name)
	for _, m := range members(coll) {
		if regBase(path.Base(strings.TrimRight(m, "/"))) != want {
			continue
		}
		f, err := d.get(ctx, op, m)
		if err != nil {
			continue
		}
		uri := ""
		for _, l := range anyList(f["Location"]) {
			lm, _ := l.(map[string]any)
			if u := strv(lm, "Uri"); u != "" && (uri == "" || strv(lm, "Language") == "en") {
				uri = u
			}
		}
		if uri == "" {
			continue
		}
		body, err := d.get(ctx, op, uri)
		if err != nil {
			d.cfg.Logger.Debug("redfish bios registry unreadable", "uri", uri, "err", err)
			continue
		}
		r = parseRegistry(body)
		break
	}
	d.mu.Lock()
	if d.regs == nil {
		d.regs = map[string]*bmc.BIOSRegistry{}
	}
	d.regs[name] = r
	d.mu.Unlock()
	return r
}

// regBase is a registry name without its version, lower case:
// "BiosAttributeRegistryA42.v1_2_60" gives "biosattributeregistrya42".
func regBase(s string) string {
	if i := strings.Index(s, "."); i >= 0 {
		s = s[:i]
	}
	return strings.ToLower(s)
}

func anyList(v any) []any { l, _ := v.([]any); return l }

// parseRegistry decodes AttributeRegistry RegistryEntries.Attributes.
func parseRegistry(body map[string]any) *bmc.BIOSRegistry {
	r := &bmc.BIOSRegistry{ID: strv(body, "Id")}
	i64 := func(m map[string]any, k string) *int64 {
		if f, ok := num(m, k); ok {
			n := int64(f)
			return &n
		}
		return nil
	}
	for _, a := range anyList(obj(body, "RegistryEntries")["Attributes"]) {
		m, _ := a.(map[string]any)
		name := strv(m, "AttributeName")
		if name == "" {
			continue
		}
		at := bmc.BIOSAttribute{Name: name, Type: bmc.AttributeType(strv(m, "Type")), DisplayName: strv(m, "DisplayName"),
			LowerBound: i64(m, "LowerBound"), UpperBound: i64(m, "UpperBound"), MinLength: i64(m, "MinLength"), MaxLength: i64(m, "MaxLength")}
		ro, _ := boolv(m, "ReadOnly")
		im, _ := boolv(m, "Immutable")
		at.ReadOnly = ro || im
		at.ResetRequired, _ = boolv(m, "ResetRequired")
		for _, v := range anyList(m["Value"]) {
			if vm, ok := v.(map[string]any); ok && strv(vm, "ValueName") != "" {
				at.AllowedValues = append(at.AllowedValues, strv(vm, "ValueName"))
			}
		}
		r.Attributes = append(r.Attributes, at)
	}
	r.Sort()
	return r
}

// chooseApplyTime picks the apply time per bmc.ApplyUnset, or refuses one
// the BMC does not list.
func chooseApplyTime(supported []bmc.ApplyTime, when bmc.ApplyTime) (bmc.ApplyTime, error) {
	if when == bmc.ApplyUnset {
		if len(supported) == 0 || slices.Contains(supported, bmc.ApplyOnReset) {
			return bmc.ApplyOnReset, nil
		}
		return supported[0], nil
	}
	if len(supported) == 0 && when != bmc.ApplyOnReset {
		return "", fmt.Errorf("apply time %s: the BMC lists no SupportedApplyTimes and applies settings at the next reset: %w", when, bmc.ErrUnsupported)
	}
	if len(supported) > 0 && !slices.Contains(supported, when) {
		return "", fmt.Errorf("apply time %s not among SupportedApplyTimes %v: %w", when, supported, bmc.ErrUnsupported)
	}
	return when, nil
}

// SetBIOS writes settings to the Bios settings object. Settings are
// checked against the registry first; only those that differ from what is
// pending (or current, when nothing is pending for them) are sent.
// @Redfish.SettingsApplyTime is sent when the BMC lists
// SupportedApplyTimes (iDRAC9 4.x+, XCC); otherwise the settings wait in
// the settings object for the next reset (iLO 5, Supermicro), except on a
// BMC whose quirk names a configuration-job collection (Dell iDRAC before
// 4.x), where a job is created with TargetSettingsURI.
func (d *Driver) SetBIOS(ctx context.Context, settings bmc.BIOSSettings, when bmc.ApplyTime) (_ *bmc.ApplyResult, err error) {
	const op = "set bios"
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	cur, so, err := d.bios(ctx, op)
	if err != nil {
		return nil, err
	}
	if so == "" {
		return nil, fmt.Errorf("redfish: %s: the Bios has no @Redfish.Settings object: %w", op, bmc.ErrUnsupported)
	}
	want, err := bmc.CheckSettings(cur.Registry, settings)
	if err != nil {
		return nil, fmt.Errorf("redfish: %s: %w", op, err)
	}
	at, err := chooseApplyTime(cur.SupportedApplyTimes, when)
	if err != nil {
		return nil, fmt.Errorf("redfish: %s: %w", op, err)
	}
	res := &bmc.ApplyResult{ApplyTime: at}
	send := map[string]any{}
	for k, v := range want {
		if p, pending := cur.Pending[k]; pending {
			if !bmc.SameValue(p, v) {
				send[k] = v
			}
		} else if !bmc.SameValue(cur.Attributes[k], v) {
			send[k] = v
		}
		if !bmc.SameValue(cur.Attributes[k], v) && at != bmc.ApplyImmediate {
			res.ResetRequired = true
		}
	}
	if len(send) == 0 {
		return res, nil
	}
	body := map[string]any{"Attributes": send}
	if len(cur.SupportedApplyTimes) > 0 {
		body["@Redfish.SettingsApplyTime"] = map[string]any{"ApplyTime": string(at)}
	}
	r, err := d.patchResp(ctx, op, so, body)
	if err != nil {
		return nil, attributeRefusal(err, cur.Registry)
	}
	if r.status == http.StatusAccepted {
		if t := taskRef(r); t != "" {
			res.Task = &bmc.Task{URI: t, ID: path.Base(t), State: bmc.TaskPending}
			if strings.Contains(t, "/Jobs/") {
				res.Quirks = append(res.Quirks, "idracConfigJob")
			}
		}
	}
	if jobs := d.q().BIOSConfigJobs; jobs != "" && len(cur.SupportedApplyTimes) == 0 && res.Task == nil {
		jr, err := d.conn.do(ctx, op+": configuration job", http.MethodPost, jobs, map[string]any{"TargetSettingsURI": so}, reqOpts{once: true})
		if err != nil {
			return nil, err
		}
		if t := taskRef(jr); t != "" {
			res.Task = &bmc.Task{URI: t, ID: path.Base(t), State: bmc.TaskPending}
		}
		res.Quirks = append(res.Quirks, "idracConfigJob")
	}
	if err := d.biosReadBack(ctx, op, send); err != nil {
		return nil, err
	}
	return res, nil
}

// biosReadBack checks that the settings object (or, for Immediate, the
// Bios) holds every value sent.
func (d *Driver) biosReadBack(ctx context.Context, op string, send map[string]any) error {
	back, _, err := d.bios(ctx, op+": read back")
	if err != nil {
		return err
	}
	var mism []string
	for _, k := range sortedKeys(send) {
		got, ok := back.Pending[k]
		if !ok {
			got = back.Attributes[k]
		}
		if !bmc.SameValue(got, send[k]) {
			mism = append(mism, fmt.Sprintf("%s: wanted %v, read back %v", k, send[k], got))
		}
	}
	if len(mism) > 0 {
		return fmt.Errorf("redfish: %s: %s: %w", op, strings.Join(mism, "; "), bmc.ErrMismatch)
	}
	return nil
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// refusals maps Base MessageIds (the part after the version) to the
// contract's refusal reasons.
var refusals = map[string]bmc.AttributeRefusal{
	"PropertyUnknown":          bmc.RefuseUnknown,
	"PropertyNotWritable":      bmc.RefuseReadOnly,
	"PropertyValueNotInList":   bmc.RefuseNotInList,
	"PropertyValueTypeError":   bmc.RefuseWrongType,
	"PropertyValueOutOfRange":  bmc.RefuseOutOfRange,
	"PropertyValueFormatError": bmc.RefuseWrongType,
}

// attributeRefusal turns a 400 naming an attribute into *bmc.AttributeError
// (joined when the BMC names several); other errors are returned as they are.
func attributeRefusal(err error, reg *bmc.BIOSRegistry) error {
	var se *statusError
	if !errors.As(err, &se) || se.Status != http.StatusBadRequest {
		return err
	}
	var out []error
	for _, ei := range se.infos {
		id := ei.MessageID
		reason, ok := refusals[id[strings.LastIndex(id, ".")+1:]]
		if !ok {
			continue
		}
		name, value := "", ""
		for _, rp := range ei.RelatedProperties {
			if i := strings.LastIndex(rp, "/Attributes/"); i >= 0 {
				name = rp[i+len("/Attributes/"):]
			}
		}
		switch {
		case (reason == bmc.RefuseUnknown || reason == bmc.RefuseReadOnly) && len(ei.MessageArgs) > 0:
			if name == "" {
				name = ei.MessageArgs[0]
			}
		case len(ei.MessageArgs) > 1:
			value = ei.MessageArgs[0]
			if name == "" {
				name = ei.MessageArgs[1]
			}
		}
		if name == "" {
			continue
		}
		ae := &bmc.AttributeError{Attribute: name, Reason: reason, Code: id}
		if value != "" {
			ae.Value = value
		}
		if a := reg.Lookup(name); a != nil {
			ae.Type = a.Type
			if a.Type == bmc.AttrPassword {
				ae.Value = "<redacted>"
			}
			if reason != bmc.RefuseReadOnly {
				ae.Allowed = a.Allowed()
			}
		}
		out = append(out, ae)
	}
	if len(out) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", errors.Join(out...), se.BMCError.Error())
}

// taskRef returns the task or job an answer names: its Location, else the
// body's @odata.id when the body is a Task.
func taskRef(r *response) string {
	if r == nil {
		return ""
	}
	t := r.header.Get("Location")
	if t == "" && strv(r.body, "TaskState") != "" {
		t = strv(r.body, "@odata.id")
	}
	if t == "" {
		return ""
	}
	if u, err := parseRef(t); err == nil {
		return u
	}
	return t
}

// dellJobStates maps DellJob JobState onto Task.TaskState.
var dellJobStates = map[string]bmc.TaskState{
	"New": bmc.TaskPending, "Scheduled": bmc.TaskPending, "Scheduling": bmc.TaskPending, "Waiting": bmc.TaskPending,
	"Downloading": bmc.TaskRunning, "Downloaded": bmc.TaskRunning, "Running": bmc.TaskRunning, "ReadyForExecution": bmc.TaskPending,
	"Completed": bmc.TaskCompleted, "CompletedWithErrors": bmc.TaskException, "Failed": bmc.TaskException,
	"PendingActivation": bmc.TaskPending, "Paused": bmc.TaskSuspended,
}

// Task reads a Task, a Task Monitor (202 while running) or a Dell Job.
func (d *Driver) Task(ctx context.Context, uri string) (_ *bmc.Task, err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	r, err := d.conn.do(ctx, "read task", http.MethodGet, uri, nil, reqOpts{})
	if err != nil {
		return nil, err
	}
	b := r.body
	t := &bmc.Task{URI: uri, ID: strv(b, "Id")}
	if js := strv(b, "JobState"); js != "" {
		st, ok := dellJobStates[js]
		if !ok {
			st = bmc.TaskRunning
		}
		t.State = st
		if m := strv(b, "Message"); m != "" {
			t.Messages = append(t.Messages, bmc.TaskMessage{MessageID: strv(b, "MessageId"), Message: sanitize(m)})
		}
	} else {
		t.State = bmc.TaskState(strv(b, "TaskState"))
		t.Status = strv(b, "TaskStatus")
		for _, m := range anyList(b["Messages"]) {
			mm, _ := m.(map[string]any)
			sev := strv(mm, "MessageSeverity")
			if sev == "" {
				sev = strv(mm, "Severity")
			}
			t.Messages = append(t.Messages, bmc.TaskMessage{MessageID: strv(mm, "MessageId"), Message: sanitize(strv(mm, "Message")), Severity: sev})
		}
	}
	if t.State == "" {
		if r.status == http.StatusAccepted {
			t.State = bmc.TaskRunning
		} else {
			return nil, fmt.Errorf("redfish: read task: GET %s: neither TaskState nor JobState", uri)
		}
	}
	if pc, ok := num(b, "PercentComplete"); ok {
		n := int(pc)
		t.PercentComplete = &n
	}
	return t, nil
}

// updateService reads the UpdateService or returns ErrUnsupported.
func (d *Driver) updateService(ctx context.Context, op string) (map[string]any, error) {
	if _, _, err := d.system(ctx, op); err != nil {
		return nil, err
	}
	d.mu.Lock()
	root := d.root
	d.mu.Unlock()
	us := link(root, "UpdateService")
	if us == "" {
		return nil, fmt.Errorf("redfish: %s: the service root has no UpdateService: %w", op, bmc.ErrUnsupported)
	}
	return d.get(ctx, op, us)
}

// FirmwareInventory lists UpdateService.FirmwareInventory, sorted by ID.
func (d *Driver) FirmwareInventory(ctx context.Context) (_ []bmc.FirmwareComponent, err error) {
	const op = "read firmware inventory"
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	us, err := d.updateService(ctx, op)
	if err != nil {
		return nil, err
	}
	inv := link(us, "FirmwareInventory")
	if inv == "" {
		return nil, fmt.Errorf("redfish: %s: UpdateService has no FirmwareInventory: %w", op, bmc.ErrUnsupported)
	}
	coll, err := d.get(ctx, op, inv)
	if err != nil {
		return nil, err
	}
	var out []bmc.FirmwareComponent
	for _, m := range members(coll) {
		c, err := d.get(ctx, op, m)
		if err != nil {
			return nil, err
		}
		up, _ := boolv(c, "Updateable")
		out = append(out, bmc.FirmwareComponent{ID: strv(c, "Id"), Name: strv(c, "Name"), Version: strv(c, "Version"), Updateable: up, URI: m})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// UpdateFirmware starts u through SimpleUpdate (ImageURI) or the
// MultipartHttpPushUri (Image) and returns the task the BMC made.
func (d *Driver) UpdateFirmware(ctx context.Context, u bmc.FirmwareUpdate) (_ *bmc.Task, err error) {
	const op = "update firmware"
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	if (u.ImageURI == "") == (u.Image == nil) {
		return nil, fmt.Errorf("redfish: %s: exactly one of ImageURI and Image must be set", op)
	}
	us, err := d.updateService(ctx, op)
	if err != nil {
		return nil, err
	}
	var r *response
	if u.ImageURI != "" {
		act := obj(obj(us, "Actions"), "#UpdateService.SimpleUpdate")
		target := strv(act, "target")
		if target == "" {
			return nil, fmt.Errorf("redfish: %s: UpdateService has no SimpleUpdate action: %w", op, bmc.ErrUnsupported)
		}
		tp := u.TransferProtocol
		if tp == "" {
			tp = "HTTP"
			if strings.HasPrefix(strings.ToLower(u.ImageURI), "https:") {
				tp = "HTTPS"
			}
		}
		if allowed, ok := strList(act, "TransferProtocol@Redfish.AllowableValues"); ok && !slices.Contains(allowed, tp) {
			return nil, fmt.Errorf("redfish: %s: TransferProtocol %s not among %v: %w", op, tp, allowed, bmc.ErrUnsupported)
		}
		body := map[string]any{"ImageURI": u.ImageURI, "TransferProtocol": tp}
		if len(u.Targets) > 0 {
			body["Targets"] = u.Targets
		}
		if u.ApplyTime != bmc.ApplyUnset {
			// Sent only where the action declares it (DSP0266
			// "Operation apply time"): iDRAC 9 lists Immediate, OnReset
			// and OnStartUpdateRequest; a BMC that lists none may refuse
			// or ignore the property.
			sup, _ := strList(obj(act, "@Redfish.OperationApplyTimeSupport"), "SupportedValues")
			if !slices.Contains(sup, string(u.ApplyTime)) {
				return nil, fmt.Errorf("redfish: %s: SimpleUpdate OperationApplyTime %s not among %v: %w", op, u.ApplyTime, sup, bmc.ErrUnsupported)
			}
			body["@Redfish.OperationApplyTime"] = string(u.ApplyTime)
		}
		r, err = d.conn.do(ctx, op, http.MethodPost, target, body, reqOpts{once: true})
		if err != nil {
			return nil, err
		}
	} else {
		push := strv(us, "MultipartHttpPushUri")
		if push == "" {
			return nil, fmt.Errorf("redfish: %s: UpdateService has no MultipartHttpPushUri: %w", op, bmc.ErrUnsupported)
		}
		r, err = d.multipartPush(ctx, op, push, u)
		if err != nil {
			return nil, err
		}
	}
	t := taskRef(r)
	if t == "" {
		// Done in the answer itself (200/204 with no task).
		return &bmc.Task{State: bmc.TaskCompleted}, nil
	}
	return &bmc.Task{URI: t, ID: path.Base(t), State: bmc.TaskNew}, nil
}

// multipartPush POSTs UpdateParameters and UpdateFile (DSP0266 multipart
// HTTP push). gofish sends an *os.File part as a file; any other reader is
// spooled to a temporary file first. Sent once: the image is consumed.
func (d *Driver) multipartPush(ctx context.Context, op, push string, u bmc.FirmwareUpdate) (*response, error) {
	f, ok := u.Image.(*os.File)
	if !ok || (u.ImageName != "" && path.Base(f.Name()) != u.ImageName) {
		dir, err := os.MkdirTemp("", "machina-fw-")
		if err != nil {
			return nil, fmt.Errorf("redfish: %s: spool image: %w", op, err)
		}
		defer os.RemoveAll(dir)
		name := u.ImageName
		if name == "" {
			name = "image.bin"
		}
		tf, err := os.Create(path.Join(dir, path.Base(name)))
		if err != nil {
			return nil, fmt.Errorf("redfish: %s: spool image: %w", op, err)
		}
		defer tf.Close()
		if _, err := io.Copy(tf, u.Image); err != nil {
			return nil, fmt.Errorf("redfish: %s: spool image: %w", op, err)
		}
		if _, err := tf.Seek(0, io.SeekStart); err != nil {
			return nil, fmt.Errorf("redfish: %s: spool image: %w", op, err)
		}
		f = tf
	}
	params := map[string]any{}
	if len(u.Targets) > 0 {
		params["Targets"] = u.Targets
	}
	if u.ApplyTime != bmc.ApplyUnset {
		params["@Redfish.OperationApplyTime"] = string(u.ApplyTime)
	}
	pj, _ := json.Marshal(params)
	api, err := d.conn.client(ctx)
	if err != nil {
		return nil, err
	}
	return d.conn.once(ctx, api, op, methodMultipart, push, map[string]io.Reader{"UpdateParameters": strings.NewReader(string(pj)), "UpdateFile": f}, reqOpts{once: true})
}

// SecureBoot reads ComputerSystem.SecureBoot.
func (d *Driver) SecureBoot(ctx context.Context) (_ *bmc.SecureBoot, err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	sb, _, err := d.secureBoot(ctx, "read secure boot")
	return sb, err
}

func (d *Driver) secureBoot(ctx context.Context, op string) (*bmc.SecureBoot, string, error) {
	_, sys, err := d.system(ctx, op)
	if err != nil {
		return nil, "", err
	}
	p := link(sys, "SecureBoot")
	if p == "" {
		return nil, "", fmt.Errorf("redfish: %s: the system has no SecureBoot resource: %w", op, bmc.ErrUnsupported)
	}
	b, err := d.get(ctx, op, p)
	if err != nil {
		return nil, "", err
	}
	en, _ := boolv(b, "SecureBootEnable")
	return &bmc.SecureBoot{Enable: en, CurrentBoot: strv(b, "SecureBootCurrentBoot"), Mode: bmc.SecureBootMode(strv(b, "SecureBootMode"))}, p, nil
}

// SetSecureBoot PATCHes SecureBootEnable and reads it back.
func (d *Driver) SetSecureBoot(ctx context.Context, enable bool) (_ *bmc.ApplyResult, err error) {
	const op = "set secure boot"
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	cur, p, err := d.secureBoot(ctx, op)
	if err != nil {
		return nil, err
	}
	want := "Disabled"
	if enable {
		want = "Enabled"
	}
	res := &bmc.ApplyResult{ApplyTime: bmc.ApplyOnReset}
	if cur.Enable != enable {
		if err := d.patch(ctx, op, p, map[string]any{"SecureBootEnable": enable}); err != nil {
			return nil, err
		}
		back, _, err := d.secureBoot(ctx, op+": read back")
		if err != nil {
			return nil, err
		}
		if back.Enable != enable {
			return nil, fmt.Errorf("redfish: %s: wanted SecureBootEnable %v, read back %v: %w", op, enable, back.Enable, bmc.ErrMismatch)
		}
		cur = back
	}
	res.ResetRequired = cur.CurrentBoot != "" && cur.CurrentBoot != want
	return res, nil
}

// Storage lists the System's Storage with drives and volumes.
func (d *Driver) Storage(ctx context.Context) (_ []bmc.StorageController, err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	out, _, err := d.storage(ctx, "read storage")
	return out, err
}

// storage returns the controllers and, per controller ID, its Volumes
// collection path and volume paths by Volume ID.
func (d *Driver) storage(ctx context.Context, op string) ([]bmc.StorageController, map[string]volPaths, error) {
	_, sys, err := d.system(ctx, op)
	if err != nil {
		return nil, nil, err
	}
	sp := link(sys, "Storage")
	if sp == "" {
		return nil, nil, fmt.Errorf("redfish: %s: the system has no Storage: %w", op, bmc.ErrUnsupported)
	}
	coll, err := d.get(ctx, op, sp)
	if isNotFound(err) {
		// Linked but not served: iLO 5 without a Redfish storage
		// controller links Storage and answers 404.
		return nil, nil, fmt.Errorf("redfish: %s: %w: %w", op, err, bmc.ErrUnsupported)
	}
	if err != nil {
		return nil, nil, err
	}
	paths := map[string]volPaths{}
	var out []bmc.StorageController
	for _, m := range members(coll) {
		c, vp, err := d.storageOne(ctx, op, m)
		if err != nil {
			return nil, nil, err
		}
		paths[c.ID] = vp
		out = append(out, c)
	}
	return out, paths, nil
}

// storageOne reads one Storage resource at m with its controllers,
// drives and volumes.
func (d *Driver) storageOne(ctx context.Context, op, m string) (bmc.StorageController, volPaths, error) {
	st, err := d.get(ctx, op, m)
	if err != nil {
		return bmc.StorageController{}, volPaths{}, err
	}
	c := bmc.StorageController{ID: strv(st, "Id"), Name: strv(st, "Name")}
	listed := false
	ctrls := anyList(st["StorageControllers"])
	if len(ctrls) == 0 {
		if cp := link(st, "Controllers"); cp != "" {
			if cc, err := d.get(ctx, op, cp); err == nil {
				for _, cm := range members(cc) {
					if cb, err := d.get(ctx, op, cm); err == nil {
						ctrls = append(ctrls, cb)
					}
				}
			}
		}
	}
	for _, sc := range ctrls {
		scm, _ := sc.(map[string]any)
		if c.Model == "" {
			c.Model = strv(scm, "Model")
		}
		if v, has := scm["SupportedRAIDTypes"]; has && v != nil {
			listed = true
			rt, _ := strList(scm, "SupportedRAIDTypes")
			c.RAIDTypes = append(c.RAIDTypes, rt...)
		}
	}
	for _, dl := range anyList(st["Drives"]) {
		dp := strv(dl.(map[string]any), "@odata.id")
		db, err := d.get(ctx, op, dp)
		if err != nil {
			return bmc.StorageController{}, volPaths{}, err
		}
		cb, _ := num(db, "CapacityBytes")
		c.Drives = append(c.Drives, bmc.Drive{ID: strv(db, "Id"), Name: strv(db, "Name"), Model: strv(db, "Model"), Serial: strv(db, "SerialNumber"),
			CapacityBytes: int64(cb), MediaType: strv(db, "MediaType"), Protocol: strv(db, "Protocol"), Health: strv(obj(db, "Status"), "Health")})
	}
	vp := volPaths{vols: map[string]string{}}
	if vc := link(st, "Volumes"); vc != "" {
		vp.coll = vc
		c.CanCreateVolumes = !listed || len(c.RAIDTypes) > 0
		vcb, err := d.get(ctx, op, vc)
		if err != nil {
			return bmc.StorageController{}, volPaths{}, err
		}
		for _, v := range members(vcb) {
			vb, err := d.get(ctx, op, v)
			if err != nil {
				return bmc.StorageController{}, volPaths{}, err
			}
			vol := bmc.Volume{ID: strv(vb, "Id"), Name: strv(vb, "Name"), RAIDType: raidTypeOf(vb), Health: strv(obj(vb, "Status"), "Health")}
			capb, _ := num(vb, "CapacityBytes")
			vol.CapacityBytes = int64(capb)
			for _, dl := range anyList(obj(vb, "Links")["Drives"]) {
				vol.Drives = append(vol.Drives, path.Base(strv(dl.(map[string]any), "@odata.id")))
			}
			vp.vols[vol.ID] = v
			c.Volumes = append(c.Volumes, vol)
		}
	}
	return c, vp, nil
}

type volPaths struct {
	coll string
	vols map[string]string
}

// raidTypeOf reads Volume.RAIDType, or maps the older VolumeType.
func raidTypeOf(v map[string]any) string {
	if rt := strv(v, "RAIDType"); rt != "" {
		return rt
	}
	switch strv(v, "VolumeType") {
	case "NonRedundant":
		return bmc.RAID0
	case "Mirrored":
		return bmc.RAID1
	case "StripedWithParity":
		return bmc.RAID5
	case "SpannedMirrors":
		return bmc.RAID10
	case "SpannedStripesWithParity":
		return bmc.RAID50
	}
	return ""
}

// CreateVolume POSTs a Volume after checking the request against what the
// controller reports.
func (d *Driver) CreateVolume(ctx context.Context, req bmc.VolumeRequest) (_ *bmc.ApplyResult, err error) {
	const op = "create volume"
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	ctrls, paths, err := d.storage(ctx, op)
	if err != nil {
		return nil, err
	}
	var c *bmc.StorageController
	for i := range ctrls {
		if ctrls[i].ID == req.Controller {
			c = &ctrls[i]
		}
	}
	if c == nil {
		return nil, fmt.Errorf("redfish: %s: controller: no storage %q", op, req.Controller)
	}
	if !c.CanCreateVolumes {
		return nil, fmt.Errorf("redfish: %s: storage %s cannot create volumes (no Volumes collection or no SupportedRAIDTypes): %w", op, c.ID, bmc.ErrUnsupported)
	}
	if len(c.RAIDTypes) > 0 && !slices.Contains(c.RAIDTypes, req.RAIDType) {
		return nil, fmt.Errorf("redfish: %s: raidType: %q not among %v of storage %s", op, req.RAIDType, c.RAIDTypes, c.ID)
	}
	if len(req.Drives) == 0 {
		return nil, fmt.Errorf("redfish: %s: drives: none given", op)
	}
	drives := []any{}
	for _, id := range req.Drives {
		found := ""
		for _, dr := range c.Drives {
			if dr.ID == id {
				found = id
			}
		}
		if found == "" {
			return nil, fmt.Errorf("redfish: %s: drives: no drive %q on storage %s", op, id, c.ID)
		}
	}
	// Drive URIs: the Storage's own links.
	st, err := d.get(ctx, op, strings.TrimSuffix(paths[c.ID].coll, "/Volumes"))
	if err == nil {
		for _, dl := range anyList(st["Drives"]) {
			dp := strv(dl.(map[string]any), "@odata.id")
			if slices.Contains(req.Drives, path.Base(dp)) {
				drives = append(drives, map[string]any{"@odata.id": dp})
			}
		}
	}
	body := map[string]any{"RAIDType": req.RAIDType, "Links": map[string]any{"Drives": drives}}
	if req.Name != "" {
		body["Name"] = req.Name
	}
	if req.CapacityBytes > 0 {
		body["CapacityBytes"] = req.CapacityBytes
	}
	if req.ApplyTime != bmc.ApplyUnset {
		body["@Redfish.OperationApplyTime"] = string(req.ApplyTime)
	}
	r, err := d.conn.do(ctx, op, http.MethodPost, paths[c.ID].coll, body, reqOpts{once: true})
	if err != nil {
		return nil, err
	}
	return d.opResult(ctx, r)
}

// opResult reads what a storage operation's answer says: done (201/204),
// a task to follow, or a job waiting for the next reset.
func (d *Driver) opResult(ctx context.Context, r *response) (*bmc.ApplyResult, error) {
	res := &bmc.ApplyResult{ApplyTime: bmc.ApplyImmediate}
	if r.status != http.StatusAccepted {
		return res, nil
	}
	t := taskRef(r)
	if t == "" {
		return res, nil
	}
	task, err := d.Task(ctx, t)
	if err != nil {
		return nil, err
	}
	res.Task = task
	if task.State == bmc.TaskPending {
		res.ApplyTime, res.ResetRequired = bmc.ApplyOnReset, true
	}
	if strings.Contains(t, "/Jobs/") {
		res.Quirks = append(res.Quirks, "idracConfigJob")
	}
	return res, nil
}

// DeleteVolume DELETEs the volume on the controller.
func (d *Driver) DeleteVolume(ctx context.Context, controller, volume string) (_ *bmc.ApplyResult, err error) {
	const op = "delete volume"
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	_, paths, err := d.storage(ctx, op)
	if err != nil {
		return nil, err
	}
	vp, ok := paths[controller]
	if !ok {
		return nil, fmt.Errorf("redfish: %s: controller: no storage %q", op, controller)
	}
	p, ok := vp.vols[volume]
	if !ok {
		return nil, fmt.Errorf("redfish: %s: volume: no volume %q on storage %s", op, volume, controller)
	}
	r, err := d.conn.do(ctx, op, http.MethodDelete, p, nil, reqOpts{once: true})
	if err != nil {
		return nil, err
	}
	return d.opResult(ctx, r)
}
