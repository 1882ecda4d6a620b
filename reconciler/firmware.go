package reconciler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// ReadFirmware reads what the plan checks a profile's firmware block
// against, through the optional capabilities of drv (bmc.BIOSConfigurer,
// bmc.RAIDConfigurer, bmc.FirmwareUpdater, bmc.SecureBootConfigurer): the
// BIOS attributes, pending settings and AttributeRegistry; the storage
// controllers with their drives and volumes; the firmware inventory; and
// Secure Boot. An area the driver lacks, or the BMC answers with
// bmc.ErrUnsupported (no Bios, Storage, UpdateService or SecureBoot
// resource), is recorded in Unsupported with the reason; an IPMI BMC has
// all four there. Any other error ends the read (wrapped, naming the
// area): a half read is never stored, so a passing check never rests on
// a missing area. at is the read's time (UTC).
func ReadFirmware(ctx context.Context, drv bmc.Driver, at time.Time) (*state.Firmware, error) {
	fw := &state.Firmware{ReadAt: at.UTC()}
	missing := func(area string, err error) error {
		if err == nil || errors.Is(err, bmc.ErrUnsupported) {
			why := "the BMC's protocol has no such interface"
			if err != nil {
				why = err.Error()
			}
			if fw.Unsupported == nil {
				fw.Unsupported = map[string]string{}
			}
			fw.Unsupported[area] = why
			return nil
		}
		return fmt.Errorf("read firmware %s: %w", area, err)
	}
	if bc, ok := drv.(bmc.BIOSConfigurer); !ok {
		_ = missing(state.FirmwareAreaBIOS, nil)
	} else if b, err := bc.BIOS(ctx); err != nil {
		if err := missing(state.FirmwareAreaBIOS, err); err != nil {
			return nil, err
		}
	} else if b != nil {
		fw.BIOS = biosState(b)
	}
	if rc, ok := drv.(bmc.RAIDConfigurer); !ok {
		_ = missing(state.FirmwareAreaRAID, nil)
	} else if cs, err := rc.Storage(ctx); err != nil {
		if err := missing(state.FirmwareAreaRAID, err); err != nil {
			return nil, err
		}
	} else {
		fw.Storage = storageState(cs)
	}
	if fu, ok := drv.(bmc.FirmwareUpdater); !ok {
		_ = missing(state.FirmwareAreaVersions, nil)
	} else if comps, err := fu.FirmwareInventory(ctx); err != nil {
		if err := missing(state.FirmwareAreaVersions, err); err != nil {
			return nil, err
		}
	} else {
		for _, c := range comps {
			fw.Components = append(fw.Components, state.FirmwareComponent{ID: c.ID, Name: c.Name, Version: c.Version, Updateable: c.Updateable})
		}
	}
	if sc, ok := drv.(bmc.SecureBootConfigurer); !ok {
		_ = missing(state.FirmwareAreaSecureBoot, nil)
	} else if sb, err := sc.SecureBoot(ctx); err != nil {
		if err := missing(state.FirmwareAreaSecureBoot, err); err != nil {
			return nil, err
		}
	} else if sb != nil {
		fw.SecureBoot = &state.SecureBootState{Enable: sb.Enable, CurrentBoot: sb.CurrentBoot}
	}
	return fw, nil
}

// biosState is the store's compact copy of a BIOS read: the registry
// keeps only what a check needs.
func biosState(b *bmc.BIOS) *state.FirmwareBIOS {
	out := &state.FirmwareBIOS{Attributes: state.NewBIOSValues(b.Attributes), Pending: map[string]any(b.Pending)}
	for _, t := range b.SupportedApplyTimes {
		out.ApplyTimes = append(out.ApplyTimes, string(t))
	}
	if b.Registry == nil {
		return out
	}
	out.RegistryID = b.Registry.ID
	out.Registry = make([]state.BIOSAttribute, 0, len(b.Registry.Attributes))
	for _, a := range b.Registry.Attributes {
		sa := state.BIOSAttribute{Name: a.Name, Type: string(a.Type), Values: a.AllowedValues, ReadOnly: a.ReadOnly, ResetRequired: a.ResetRequired}
		switch a.Type {
		case bmc.AttrInteger:
			sa.Min, sa.Max = a.LowerBound, a.UpperBound
		case bmc.AttrString, bmc.AttrPassword:
			sa.Min, sa.Max = a.MinLength, a.MaxLength
		}
		out.Registry = append(out.Registry, sa)
	}
	// The plan looks attributes up by binary search.
	slices.SortFunc(out.Registry, func(a, b state.BIOSAttribute) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func storageState(cs []bmc.StorageController) []state.StorageController {
	out := make([]state.StorageController, 0, len(cs))
	for _, c := range cs {
		sc := state.StorageController{ID: c.ID, RAIDTypes: c.RAIDTypes, CanCreateVolumes: c.CanCreateVolumes}
		for _, d := range c.Drives {
			sc.Drives = append(sc.Drives, state.StorageDrive{ID: d.ID, CapacityBytes: d.CapacityBytes, MediaType: d.MediaType})
		}
		for _, v := range c.Volumes {
			sc.Volumes = append(sc.Volumes, state.Volume{ID: v.ID, Name: v.Name, RAIDType: v.RAIDType, CapacityBytes: v.CapacityBytes, Drives: v.Drives})
		}
		out = append(out, sc)
	}
	return out
}

// ErrFirmwareRefused: the profile's firmware block is refused on the
// server by the read the step itself made (the plan saw an older read),
// or the BMC lacks a capability the change needs. Nothing was sent.
var ErrFirmwareRefused = errors.New("firmware block refused")

// ErrFirmwareMismatch: after the changes, their reset and the BMC's
// tasks, the read-back differs from the profile; the error names the
// value read and the value wanted.
var ErrFirmwareMismatch = errors.New("firmware read back differs")

// applyFirmware is ActFirmware: the profile's firmware block onto an
// allocated server before its image is written (Ironic's clean steps
// apply_configuration, create_configuration and update; Metal3's
// HostFirmwareSettings, RAID and HostFirmwareComponents in preparing).
// Act, then verify: it reads the firmware (and stores it), checks the
// block against that read (a refusal sends nothing), writes the BIOS
// settings with the apply time the BMC chooses (OnReset when it lists
// it), creates the volumes (recorded as Machina's, deleted on release),
// starts each update with SimpleUpdate and follows its task to the end,
// sets Secure Boot, resets the machine once when any change needs it
// (at most once per journal entry, Machine.Restart), follows the tasks
// the BMC made for the reset (Dell configuration jobs), then reads back:
// anything still different fails the step with both values. The action
// is disruptive: a failure stalls the server with its reason until the
// profile changes, never retried in a loop. Idempotent: a resumed step
// reads first and sends only what still differs.
func (c *Controller) applyFirmware(ctx context.Context, x *stepCtx) error {
	if x.desired == nil || x.ws == nil {
		return fmt.Errorf("%s is not in the desired inventory", x.step.Server)
	}
	prof := x.desired.Profile(x.step.Profile)
	if prof == nil || prof.Firmware == nil {
		return fmt.Errorf("profile %q has no firmware block", x.step.Profile)
	}
	chk, err := c.readCheck(ctx, x, prof)
	if err != nil {
		return err
	}
	if len(chk.Refusals) > 0 {
		return fmt.Errorf("%s (%s): %w", chk.Refusals[0].Message, chk.Refusals[0].Reason, ErrFirmwareRefused)
	}
	// Updates first, as Ironic orders its clean steps: a BIOS update may
	// reset the settings, and the BMC restarts after many updates (so
	// it is waited for before anything else is sent).
	var pend pendingApply
	defer pend.release()
	for _, ch := range chk.Changes {
		if ch.Kind == plan.FirmwareUpdate {
			if err := c.updateFirmware(ctx, x, x.drv, ch, &pend); err != nil {
				return err
			}
		}
	}
	if err := c.sendChanges(ctx, x, prof, chk.Changes, &pend); err != nil {
		return err
	}
	if pend.reset {
		if err := x.m.Restart(ctx, bmc.PowerActionReset); err != nil {
			return fmt.Errorf("reset to apply: %w", err)
		}
	}
	if tf, ok := x.drv.(bmc.TaskFollower); ok {
		for _, pt := range pend.tasks {
			if _, err := bmc.WaitTask(ctx, tf, pt.t.URI, c.cfg.FirmwareTaskPoll, nil); err != nil {
				return fmt.Errorf("%s, after the reset: %w", pt.what, redactOffer(err, pt.uri))
			}
		}
	}
	if err := c.verifyFirmware(ctx, x, prof); err != nil {
		return err
	}
	x.log.Info("firmware: applied and read back", "changes", len(chk.Changes), "reset", pend.reset)
	return nil
}

// pendingApply collects what the writes left to do: a reset, the tasks
// to follow after it (Dell configuration jobs, updates scheduled
// OnReset), and the firmware offers to end with the step.
type pendingApply struct {
	reset    bool
	tasks    []pendingTask
	releases []func()
}

// pendingTask is a task to follow after the reset and what it does, as
// its failure names it.
type pendingTask struct {
	what string
	t    *bmc.Task
	uri  string // an offer URI its messages may echo, redacted from errors
}

func (p *pendingApply) note(r *bmc.ApplyResult) {
	if r == nil {
		return
	}
	p.reset = p.reset || r.ResetRequired
	if r.Task != nil && !r.Task.State.Done() {
		p.tasks = append(p.tasks, pendingTask{what: "configuration job " + r.Task.URI, t: r.Task})
	}
}

// release ends the step's firmware offers.
func (p *pendingApply) release() {
	for _, r := range p.releases {
		r()
	}
}

// sendChanges creates the volumes (recorded as Machina's), sets Secure
// Boot and writes the BIOS settings, in one PATCH, with the apply time
// the BMC chooses.
func (c *Controller) sendChanges(ctx context.Context, x *stepCtx, prof *inventory.Profile, changes []plan.FirmwareChange, pend *pendingApply) error {
	settings := bmc.BIOSSettings{}
	var created []string
	for _, ch := range changes {
		switch ch.Kind {
		case plan.FirmwareBIOSSet:
			settings[ch.Item] = prof.Firmware.Settings[ch.Item]
		case plan.FirmwareRAIDCreate:
			rc, ok := x.drv.(bmc.RAIDConfigurer)
			if !ok {
				return fmt.Errorf("create volume %s: the driver has no RAID interface: %w", ch.Item, ErrFirmwareRefused)
			}
			r, err := rc.CreateVolume(ctx, bmc.VolumeRequest{Controller: ch.Controller, Name: ch.Item, RAIDType: ch.Level, Drives: ch.Drives, CapacityBytes: ch.SizeBytes})
			if err != nil {
				return fmt.Errorf("create volume %s on %s: %w", ch.Item, ch.Controller, err)
			}
			created = append(created, ch.Controller+"/"+ch.Item)
			pend.note(r)
		case plan.FirmwareSecureBootSet:
			sc, ok := x.drv.(bmc.SecureBootConfigurer)
			if !ok {
				return fmt.Errorf("set Secure Boot: the driver has no Secure Boot interface: %w", ErrFirmwareRefused)
			}
			r, err := sc.SetSecureBoot(ctx, *prof.Firmware.SecureBoot)
			if err != nil {
				return fmt.Errorf("set Secure Boot %v: %w", *prof.Firmware.SecureBoot, err)
			}
			pend.note(r)
		}
	}
	if len(created) > 0 {
		if err := c.recordVolumes(x.step.Server, created); err != nil {
			return err
		}
	}
	if len(settings) == 0 {
		return nil
	}
	bc, ok := x.drv.(bmc.BIOSConfigurer)
	if !ok {
		return fmt.Errorf("set BIOS: the driver has no BIOS interface: %w", ErrFirmwareRefused)
	}
	r, err := bc.SetBIOS(ctx, settings, bmc.ApplyUnset)
	if err != nil {
		return fmt.Errorf("set BIOS %s: %w", strings.Join(sortedNames(settings), ", "), err)
	}
	x.log.Info("firmware: BIOS settings written", "settings", len(settings), "applyTime", string(r.ApplyTime), "reset", r.ResetRequired)
	pend.note(r)
	return nil
}

// verifyFirmware reads back and fails with ErrFirmwareMismatch naming
// each value read and wanted when anything still differs.
func (c *Controller) verifyFirmware(ctx context.Context, x *stepCtx, prof *inventory.Profile) error {
	after, err := c.readCheck(ctx, x, prof)
	if err != nil {
		return err
	}
	if len(after.Refusals) == 0 && len(after.Changes) == 0 {
		return nil
	}
	var diffs []string
	for _, ch := range after.Changes {
		diffs = append(diffs, fmt.Sprintf("%s %s read back %s, wanted %s", ch.Kind, ch.Item, orUnset(ch.From), ch.To))
	}
	for _, r := range after.Refusals {
		diffs = append(diffs, r.Message)
	}
	return fmt.Errorf("%s: %w", strings.Join(diffs, "; "), ErrFirmwareMismatch)
}

// FirmwareImages offers the files of the firmware catalog (images.yaml
// firmware) to BMCs; the controller implements it over its image store
// and its /firmware/ handler. Implementations MUST be safe for concurrent
// use.
type FirmwareImages interface {
	// Offer checks the stored file of catalog entry name against
	// checksum ("sha256:HEX", "" checks it against the store's record
	// only) by hashing it again, and returns a URL from which a BMC can
	// GET it (UpdateService.SimpleUpdate ImageURI) until release is
	// called or the offer's lifetime ends. An error means nothing was
	// offered.
	Offer(ctx context.Context, name, checksum string) (uri string, release func(), err error)
	// Open checks the file as Offer does and opens it for a multipart
	// push (UpdateService.MultipartHttpPushUri), with the file name
	// the catalog's URL gives it. The caller closes it.
	Open(ctx context.Context, name, checksum string) (f io.ReadCloser, fileName string, err error)
	// Ready is nil when the file of catalog entry name is imported and
	// verified, else why not (still downloading, the import's failure):
	// a firmware step naming it waits, as a deploy waits for its image.
	Ready(name string) error
}

// updateFirmware applies one firmware-update change. The catalog file is
// verified and offered (FirmwareImages; the offer ends with the step).
// Where SimpleUpdate lists OperationApplyTime OnReset the update is
// scheduled for the step's reset and its task followed after it (in
// pend). Otherwise the BMC is told to fetch it with SimpleUpdate (or,
// when it lists no SimpleUpdate or not the URL's TransferProtocol, the
// file is pushed to its MultipartHttpPushUri), the task is followed to
// its end (the BMC restarting in between is waited through,
// bmc.WaitTask), the BMC is waited for until it answers again, and its
// FirmwareInventory read back: a version still differing asks for the
// step's reset. Either way the step's read-back after the reset fails
// with both versions if the component still differs
// (ErrFirmwareMismatch).
func (c *Controller) updateFirmware(ctx context.Context, x *stepCtx, drv bmc.Driver, ch plan.FirmwareChange, pend *pendingApply) error {
	fu, ok := drv.(bmc.FirmwareUpdater)
	if !ok {
		return fmt.Errorf("update %s: the driver has no update interface: %w", ch.Item, ErrFirmwareRefused)
	}
	if ch.Image == "" || c.cfg.FirmwareImages == nil {
		return fmt.Errorf("update %s: no firmware catalog image to offer the BMC: %w", ch.Item, ErrFirmwareRefused)
	}
	what := fmt.Sprintf("update %s to %s", ch.Item, ch.To)
	uri, release, err := c.cfg.FirmwareImages.Offer(ctx, ch.Image, ch.Checksum)
	if err != nil {
		return fmt.Errorf("update %s: offer image %s: %w", ch.Item, ch.Image, err)
	}
	pend.releases = append(pend.releases, release)
	// OnReset where SimpleUpdate lists it (iDRAC 9): the BMC fetches the
	// file now and installs it at the step's one reset, so a host
	// firmware package never waits for a reboot nobody sends, and never
	// reboots the host on its own. Each ErrUnsupported below was
	// refused before anything was sent.
	t, err := fu.UpdateFirmware(ctx, bmc.FirmwareUpdate{ImageURI: uri, ApplyTime: bmc.ApplyOnReset})
	if err == nil {
		x.log.Info("firmware: update scheduled for the reset", "component", ch.Item, "version", ch.To, "image", ch.Image, "task", t.URI)
		pend.reset = true
		pend.tasks = append(pend.tasks, pendingTask{what: what, t: t, uri: uri})
		return nil
	}
	if errors.Is(err, bmc.ErrUnsupported) {
		t, err = fu.UpdateFirmware(ctx, bmc.FirmwareUpdate{ImageURI: uri})
	}
	if errors.Is(err, bmc.ErrUnsupported) {
		// No SimpleUpdate, or not the URL's TransferProtocol: stock
		// bmcweb lists only the multipart push.
		f, name, oerr := c.cfg.FirmwareImages.Open(ctx, ch.Image, ch.Checksum)
		if oerr != nil {
			return fmt.Errorf("update %s: open image %s: %w", ch.Item, ch.Image, oerr)
		}
		t, err = fu.UpdateFirmware(ctx, bmc.FirmwareUpdate{Image: f, ImageName: name})
		f.Close()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, redactOffer(err, uri))
	}
	x.log.Info("firmware: update started", "component", ch.Item, "version", ch.To, "image", ch.Image, "task", t.URI)
	if _, err := bmc.WaitTask(ctx, fu, t.URI, c.cfg.FirmwareTaskPoll, nil); err != nil {
		return fmt.Errorf("%s: %w", what, redactOffer(err, uri))
	}
	// The BMC restarts after many updates (iDRAC, iLO and XCC after
	// their own, bmcweb after any activation): wait until it answers.
	for {
		comps, err := fu.FirmwareInventory(ctx)
		if err == nil {
			got := "(not listed)"
			for _, fc := range comps {
				if fc.ID == ch.Item || strings.EqualFold(fc.Name, ch.Item) {
					got = fc.Version
					break
				}
			}
			if got != ch.To {
				// A host firmware package (BIOS, a NIC's) is installed
				// or activated at the next host reset by many BMCs
				// (iDRAC: "Job completed, server reboot pending"): the
				// read-back after the step's reset decides.
				x.log.Info("firmware: update needs the reset, the inventory still reads the old version", "component", ch.Item, "reads", got, "wanted", ch.To)
				pend.reset = true
			}
			return nil
		}
		if !bmc.IsTransient(err) || ctx.Err() != nil {
			return fmt.Errorf("after update %s: %w", ch.Item, err)
		}
		if err := sleepCtx(ctx, c.cfg.FirmwareTaskPoll); err != nil {
			return fmt.Errorf("after update %s: wait for the BMC: %w", ch.Item, err)
		}
	}
}

// redactOffer hides an offer URI that a BMC's task message echoes (DMTF
// Update.1.0.TransferFailed names the image; iDRAC's job messages do
// too): the error goes to status and Git, and the URI is a capability.
// errors.Is and errors.As still see err.
func redactOffer(err error, uri string) error {
	if err == nil || uri == "" || !strings.Contains(err.Error(), uri) {
		return err
	}
	return &redactedError{err: err, uri: uri}
}

type redactedError struct {
	err error
	uri string
}

func (e *redactedError) Error() string {
	return strings.ReplaceAll(e.err.Error(), e.uri, "<offered file "+path.Base(e.uri)+">")
}

func (e *redactedError) Unwrap() error { return e.err }

// firmwareDigest is a short digest of profile's firmware block and the
// catalog entries its versions name: what a stalled firmware step's key
// holds, so that a change to either retries it.
func firmwareDigest(desired *inventory.Inventory, profile string) string {
	p := desired.Profile(profile)
	if p == nil || p.Firmware == nil {
		return "none"
	}
	var imgs []*inventory.FirmwareImage
	for _, v := range p.Firmware.Versions {
		imgs = append(imgs, desired.FirmwareImage(v.Image))
	}
	b, _ := json.Marshal(struct {
		F *inventory.Firmware
		I []*inventory.FirmwareImage
	}{p.Firmware, imgs}) // plain data: cannot fail
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:6])
}

// sleepCtx waits d or until ctx ends (its error then).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// readCheck reads the server's firmware, stores it (keeping the volumes
// Machina created) and checks the profile's block against it.
//
// A transient error (the BMC restarting after a reset or an update) is
// read again every FirmwareTaskPoll until ctx ends.
func (c *Controller) readCheck(ctx context.Context, x *stepCtx, prof *inventory.Profile) (plan.FirmwareCheck, error) {
	var fw *state.Firmware
	for {
		var err error
		fw, err = ReadFirmware(ctx, x.drv, c.cfg.Now())
		if err == nil {
			break
		}
		if !bmc.IsTransient(err) || ctx.Err() != nil {
			return plan.FirmwareCheck{}, err // ReadFirmware names the area
		}
		if err := sleepCtx(ctx, c.cfg.FirmwareTaskPoll); err != nil {
			return plan.FirmwareCheck{}, fmt.Errorf("read: %w", err)
		}
	}
	s, err := c.cfg.Store.UpdateServer(x.step.Server, func(s *state.Server) error {
		if s.Firmware != nil {
			fw.CreatedVolumes = s.Firmware.CreatedVolumes
		}
		s.Firmware = fw
		return nil
	})
	if err != nil {
		return plan.FirmwareCheck{}, fmt.Errorf("record read: %w", err)
	}
	return plan.CheckFirmware(x.desired, prof.Firmware, x.ws, &s), nil
}

// recordVolumes adds "controller/name" entries to the volumes Machina
// created on the server (deleted on release, never others).
func (c *Controller) recordVolumes(server string, vols []string) error {
	_, err := c.cfg.Store.UpdateServer(server, func(s *state.Server) error {
		if s.Firmware == nil {
			s.Firmware = &state.Firmware{}
		}
		for _, v := range vols {
			if !slices.Contains(s.Firmware.CreatedVolumes, v) {
				s.Firmware.CreatedVolumes = append(s.Firmware.CreatedVolumes, v)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record created volumes: %w", err)
	}
	return nil
}

func sortedNames(m bmc.BIOSSettings) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func orUnset(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// deleteCreatedVolumes deletes, on release, the RAID volumes Machina
// created on the server (Firmware.CreatedVolumes, "controller/name") and
// only those: it reads the controllers, DELETEs each such volume still
// listed, reads them again and stores that read with the list emptied. A
// server without created volumes, or whose driver has no RAID interface,
// is left alone. Dell iDRAC deletes by a configuration job at the next
// reset (the release wipe's boot).
func (c *Controller) deleteCreatedVolumes(ctx context.Context, x *stepCtx) error {
	if x.obs.Firmware == nil || len(x.obs.Firmware.CreatedVolumes) == 0 {
		return nil
	}
	rc, ok := x.drv.(bmc.RAIDConfigurer)
	if !ok {
		return nil
	}
	ctrls, err := rc.Storage(ctx)
	if err != nil {
		return fmt.Errorf("release: read storage: %w", err)
	}
	for _, cv := range x.obs.Firmware.CreatedVolumes {
		ctrl, name, _ := strings.Cut(cv, "/")
		for _, sc := range ctrls {
			if sc.ID != ctrl {
				continue
			}
			for _, v := range sc.Volumes {
				if v.Name != name {
					continue
				}
				if _, err := rc.DeleteVolume(ctx, ctrl, v.ID); err != nil {
					return fmt.Errorf("release: delete volume %s (%s) on %s: %w", name, v.ID, ctrl, err)
				}
				x.log.Info("release: deleted the volume Machina created", "controller", ctrl, "volume", name)
			}
		}
	}
	ctrls, err = rc.Storage(ctx)
	if err != nil {
		return fmt.Errorf("release: read storage: %w", err)
	}
	_, err = c.cfg.Store.UpdateServer(x.step.Server, func(s *state.Server) error {
		if s.Firmware != nil {
			s.Firmware.Storage, s.Firmware.CreatedVolumes = storageState(ctrls), nil
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("release: record storage: %w", err)
	}
	return nil
}
