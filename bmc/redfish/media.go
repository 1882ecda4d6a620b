package redfish

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/machina-metal/machina/bmc"
)

// slot is one VirtualMedia resource.
type slot struct {
	path string
	body map[string]any
}

// inserted reports whether the slot holds a medium: Inserted true and
// ConnectedVia not NotConnected (some BMCs keep Image after an eject).
func (s slot) inserted() bool {
	if cv := strv(s.body, "ConnectedVia"); cv == "NotConnected" {
		return false
	}
	if in, ok := boolv(s.body, "Inserted"); ok {
		return in
	}
	return strv(s.body, "Image") != ""
}

func (s slot) action(name string) (target string, info string) {
	a := obj(obj(s.body, "Actions"), "#VirtualMedia."+name)
	return strv(a, "target"), strv(a, "@Redfish.ActionInfo")
}

// cdSlot finds the virtual CD: VirtualMedia collections under the System
// first (newer iDRAC), then under each Manager; the first slot whose
// MediaTypes include CD (or DVD) wins. ErrUnsupported when there is none.
func (d *Driver) cdSlot(ctx context.Context, op string) (slot, error) {
	_, sys, err := d.system(ctx, op)
	if err != nil {
		return slot{}, err
	}
	var colls []string
	if l := link(sys, "VirtualMedia"); l != "" {
		colls = append(colls, l)
	}
	d.mu.Lock()
	root := d.root
	d.mu.Unlock()
	if mc := link(root, "Managers"); mc != "" {
		mcoll, err := d.get(ctx, op, mc)
		if err != nil {
			return slot{}, err
		}
		for _, m := range members(mcoll) {
			mgr, err := d.get(ctx, op, m)
			if err != nil {
				return slot{}, err
			}
			if l := link(mgr, "VirtualMedia"); l != "" && !slices.Contains(colls, l) {
				colls = append(colls, l)
			}
		}
	}
	for _, c := range colls {
		coll, err := d.get(ctx, op, c)
		if err != nil {
			var be *bmc.BMCError
			if errors.As(err, &be) && be.Status == http.StatusNotFound {
				continue
			}
			return slot{}, err
		}
		for _, m := range members(coll) {
			b, err := d.get(ctx, op, m)
			if err != nil {
				return slot{}, err
			}
			types, _ := strList(b, "MediaTypes")
			if slices.Contains(types, "CD") || slices.Contains(types, "DVD") {
				return slot{path: m, body: b}, nil
			}
		}
	}
	return slot{}, fmt.Errorf("redfish: %s: no virtual CD slot: %w", op, bmc.ErrUnsupported)
}

// InsertMedia mounts imageURL (http, https, nfs or cifs) as a virtual CD.
// Anything inserted is ejected first. InsertMedia starts with a minimal body
// ({"Image"}) and adds Inserted, WriteProtected or TransferProtocolType only
// when the BMC answers that one is missing and the action's parameters (if
// listed) name it. Slots without the action take a PATCH of Image. The slot
// is read back: Image must equal imageURL and the slot must be inserted.
func (d *Driver) InsertMedia(ctx context.Context, imageURL string) (err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	u, err := url.Parse(imageURL)
	if err != nil || u.Host == "" || !slices.Contains([]string{"http", "https", "nfs", "cifs", "smb"}, strings.ToLower(u.Scheme)) {
		return fmt.Errorf("redfish: insert media: image URL must be http(s), nfs or cifs with a host")
	}
	s, err := d.cdSlot(ctx, "insert media")
	if err != nil {
		return err
	}
	if s.inserted() {
		if strv(s.body, "Image") == imageURL {
			d.cfg.Logger.Debug("redfish insert media: already inserted")
			return nil
		}
		if err := d.eject(ctx, s); err != nil {
			return fmt.Errorf("redfish: insert media: eject first: %w", err)
		}
	}
	d.cfg.Logger.Info("redfish insert media", "slot", s.path)
	target, info := s.action("InsertMedia")
	var perr error
	if target == "" {
		perr = d.patch(ctx, "insert media", s.path, map[string]any{"Image": imageURL, "Inserted": true})
	} else {
		perr = d.insertAction(ctx, target, info, imageURL, strings.ToUpper(u.Scheme))
	}
	b, err := d.get(ctx, "insert media: read back", s.path)
	if err != nil {
		return errors.Join(perr, err)
	}
	got := slot{path: s.path, body: b}
	if strv(b, "Image") != imageURL || !got.inserted() {
		if perr != nil {
			return perr // names the operation, the request and the status
		}
		return fmt.Errorf("redfish: insert media: want Image %s inserted, read Image %q Inserted %v ConnectedVia %q: %w",
			sanitize(imageURL), sanitize(strv(b, "Image")), b["Inserted"], strv(b, "ConnectedVia"), bmc.ErrMismatch)
	}
	if perr != nil {
		d.cfg.Logger.Warn("redfish insert media: BMC reported an error but the medium is inserted", "err", perr)
	}
	return nil
}

// insertAction POSTs VirtualMedia.InsertMedia, adding a parameter each time
// the BMC answers ActionParameterMissing for it (at most three).
func (d *Driver) insertAction(ctx context.Context, target, info, imageURL, scheme string) error {
	var params []string
	if info != "" {
		ai, err := d.get(ctx, "insert media: read action info", info)
		if err != nil {
			return err
		}
		ps, _ := ai["Parameters"].([]any)
		for _, p := range ps {
			pm, _ := p.(map[string]any)
			params = append(params, strv(pm, "Name"))
		}
	}
	defaults := map[string]any{"Inserted": true, "WriteProtected": true, "TransferProtocolType": scheme, "TransferMethod": "Stream"}
	body := map[string]any{"Image": imageURL}
	for range 4 {
		r, err := d.conn.do(ctx, "insert media", http.MethodPost, target, body, reqOpts{})
		if err == nil {
			if err := d.followTask(ctx, "insert media", r); err != nil {
				return err
			}
			return extendedError(d.cfg.Endpoint, "insert media", r)
		}
		var se *statusError
		if !errors.As(err, &se) || se.Status != http.StatusBadRequest {
			return err
		}
		added := false
		for _, a := range se.args {
			v, known := defaults[a]
			if !known || (params != nil && !slices.Contains(params, a)) {
				continue
			}
			if _, has := body[a]; !has && slices.ContainsFunc(se.ids, func(id string) bool {
				return containsFold(id, "ParameterMissing") || containsFold(id, "PropertyMissing")
			}) {
				body[a] = v
				added = true
			}
		}
		if !added {
			return err
		}
		d.cfg.Logger.Debug("redfish insert media: BMC asked for more parameters", "params", len(body))
	}
	return fmt.Errorf("redfish: insert media: BMC keeps asking for parameters")
}

// EjectMedia unmounts the virtual CD; nil when nothing is inserted. Uses
// VirtualMedia.EjectMedia, or a PATCH of Image null and Inserted false where
// the slot has no action. Read back: the slot must be empty.
func (d *Driver) EjectMedia(ctx context.Context) (err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	s, err := d.cdSlot(ctx, "eject media")
	if err != nil {
		return err
	}
	if !s.inserted() {
		return nil
	}
	return d.eject(ctx, s)
}

func (d *Driver) eject(ctx context.Context, s slot) error {
	d.cfg.Logger.Info("redfish eject media", "slot", s.path)
	var perr error
	if target, _ := s.action("EjectMedia"); target != "" {
		r, err := d.conn.do(ctx, "eject media", http.MethodPost, target, map[string]any{}, reqOpts{})
		if err == nil {
			err = d.followTask(ctx, "eject media", r)
		}
		perr = err
	} else {
		perr = d.patch(ctx, "eject media", s.path, map[string]any{"Image": nil, "Inserted": false})
	}
	b, err := d.get(ctx, "eject media: read back", s.path)
	if err != nil {
		return errors.Join(perr, err)
	}
	if (slot{path: s.path, body: b}).inserted() {
		if perr != nil {
			return fmt.Errorf("redfish: eject media: %w", perr)
		}
		return fmt.Errorf("redfish: eject media: want empty, read Inserted %v ConnectedVia %q: %w", b["Inserted"], strv(b, "ConnectedVia"), bmc.ErrMismatch)
	}
	return nil
}
