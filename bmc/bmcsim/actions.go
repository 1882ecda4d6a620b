package bmcsim

import (
	"context"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"
)

// allowable returns the values listed for param of the action whose
// resource is at resPath and whose key in Actions is name, from the inline
// `<param>@Redfish.AllowableValues` or the `@Redfish.ActionInfo` resource.
// ok is false when neither lists them. Caller holds s.mu.
func (s *Server) allowableLocked(resPath, name, param string) (vals []string, params []string, ok bool) {
	n := s.nodeLocked(resPath)
	if n == nil {
		return nil, nil, false
	}
	acts, _ := n.body["Actions"].(map[string]any)
	act, _ := acts[name].(map[string]any)
	if act == nil {
		return nil, nil, false
	}
	if v, has := act[param+"@Redfish.AllowableValues"].([]any); has {
		vals, ok = strs(v), true
	}
	if ai, _ := act["@Redfish.ActionInfo"].(string); ai != "" {
		if info := s.nodeLocked(ai); info != nil {
			ps, _ := info.body["Parameters"].([]any)
			for _, p := range ps {
				pm, _ := p.(map[string]any)
				pn, _ := pm["Name"].(string)
				params = append(params, pn)
				if pn == param && !ok {
					if v, has := pm["AllowableValues"].([]any); has {
						vals, ok = strs(v), true
					}
				}
			}
		}
	}
	return vals, params, ok
}

func strs(v []any) []string {
	var out []string
	for _, e := range v {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// parentOfAction maps ".../X/Actions/Y.Z" to ".../X".
func parentOfAction(p string) string {
	i := strings.LastIndex(p, "/actions/")
	if i < 0 {
		return p
	}
	return p[:i]
}

var standardResetTypes = []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn", "PushPowerButton", "PowerCycle"}

func (s *Server) reset(w http.ResponseWriter, r *http.Request, p string, body map[string]any) int {
	sys := parentOfAction(p)
	s.mu.Lock()
	n := s.nodeLocked(sys)
	allowed, _, ok := s.allowableLocked(sys, "#ComputerSystem.Reset", "ResetType")
	s.mu.Unlock()
	if n == nil || !isSystem(n.body) {
		return writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "The resource at the URI "+r.URL.Path+" was not found.")
	}
	if !ok {
		allowed = standardResetTypes
	}
	rt, isStr := body["ResetType"].(string)
	if !isStr {
		return writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterMissing", "The action ComputerSystem.Reset requires the parameter ResetType to be present in the request body.", "ComputerSystem.Reset", "ResetType")
	}
	if !slices.Contains(allowed, rt) || slices.Contains(s.quirks.RefuseResetTypes, rt) || (s.quirks.NoPowerCycle && rt == "PowerCycle") {
		return writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterValueNotInList", "The value '"+rt+"' for the parameter ResetType is not in the list of acceptable values.", rt, "ResetType", "ComputerSystem.Reset")
	}
	if err := s.power.Reset(r.Context(), rt); err != nil {
		return writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", "The request failed due to an internal service error: "+err.Error())
	}
	s.noteReset(sys, rt)
	switch rt {
	case "On", "ForceOn", "ForceRestart", "GracefulRestart", "PowerCycle", "PushPowerButton":
		s.mu.Lock()
		s.onHostResetLocked()
		s.mu.Unlock()
	}
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

func (s *Server) insertMedia(ctx context.Context, w http.ResponseWriter, p string, body map[string]any) int {
	slot := parentOfAction(p)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodeLocked(slot)
	if n == nil {
		return writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "The resource at the URI "+p+" was not found.")
	}
	acts, _ := n.body["Actions"].(map[string]any)
	if _, has := acts["#VirtualMedia.InsertMedia"]; !has {
		return writeError(w, http.StatusMethodNotAllowed, "Base.1.8.ActionNotSupported", "The action VirtualMedia.InsertMedia is not supported by the resource.", "VirtualMedia.InsertMedia")
	}
	_, params, _ := s.allowableLocked(slot, "#VirtualMedia.InsertMedia", "Image")
	for k, v := range body {
		if slices.Contains(s.quirks.RejectInsertParams, k) || (params != nil && !slices.Contains(params, k)) {
			return writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterNotSupported", "The parameter "+k+" for the action VirtualMedia.InsertMedia is not supported on the target resource.", k, "VirtualMedia.InsertMedia")
		}
		if k == "WriteProtected" && v == false && s.quirks.RejectWriteProtectedFalse {
			return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList", "The value false for the property WriteProtected is not in the list of acceptable values.", "false", "WriteProtected")
		}
	}
	for _, req := range append([]string{"Image"}, s.quirks.RequireInsertParams...) {
		if _, has := body[req]; !has {
			return writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterMissing", "The action VirtualMedia.InsertMedia requires the parameter "+req+" to be present in the request body.", "VirtualMedia.InsertMedia", req)
		}
	}
	img, _ := body["Image"].(string)
	if img == "" {
		return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueFormatError", "The value for the parameter Image is of a different format than the parameter can accept.", "", "Image")
	}
	if n.body["Inserted"] == true {
		return writeError(w, http.StatusBadRequest, "Base.1.8.ResourceInUse", "The change to the requested resource failed because the resource is in use or in transition.")
	}
	if code := s.mediaHookLocked(ctx, w, img); code != 0 {
		return code
	}
	s.mutateLocked(slot, func(b map[string]any) {
		b["Image"], b["ImageName"], b["Inserted"], b["ConnectedVia"] = img, path.Base(img), true, "URI"
		if wp, ok := body["WriteProtected"].(bool); ok {
			b["WriteProtected"] = wp
		} else {
			b["WriteProtected"] = true
		}
	})
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

func (s *Server) ejectMedia(ctx context.Context, w http.ResponseWriter, p string) int {
	slot := parentOfAction(p)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodeLocked(slot)
	if n == nil {
		return writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "The resource at the URI "+p+" was not found.")
	}
	acts, _ := n.body["Actions"].(map[string]any)
	if _, has := acts["#VirtualMedia.EjectMedia"]; !has {
		return writeError(w, http.StatusMethodNotAllowed, "Base.1.8.ActionNotSupported", "The action VirtualMedia.EjectMedia is not supported by the resource.", "VirtualMedia.EjectMedia")
	}
	if code := s.mediaHookLocked(ctx, w, ""); code != 0 {
		return code
	}
	s.ejectLocked(slot)
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

func (s *Server) ejectLocked(slot string) {
	s.mutateLocked(slot, func(b map[string]any) {
		b["Inserted"], b["ConnectedVia"] = false, "NotConnected"
		if !s.quirks.KeepImageAfterEject {
			b["Image"], b["ImageName"] = nil, nil
		}
	})
}

// patch handles PATCH of a System's Boot override, of a System's settings
// object (applied to the System at once), and of a VirtualMedia slot's
// Image/Inserted/WriteProtected (for slots without actions).
func (s *Server) patch(w http.ResponseWriter, r *http.Request, p string, body map[string]any) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodeLocked(p)
	if bp := s.biosForSettingsLocked(p); bp != "" && (n == nil || !isSystem(n.body)) {
		if n != nil && s.quirks.RequireIfMatch && r.Header.Get("If-Match") == "" && stringOf(n.body["@odata.etag"]) != "" {
			return writeError(w, http.StatusPreconditionRequired, "Base.1.8.PreconditionRequired", "A precondition header or annotation is required to change the resource.")
		}
		return s.patchBiosSettingsLocked(w, bp, p, body)
	}
	if n == nil {
		return writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "The resource at the URI "+r.URL.Path+" was not found.")
	}
	if strings.Contains(stringOf(n.body["@odata.type"]), "#SecureBoot.") {
		if s.quirks.RequireIfMatch && r.Header.Get("If-Match") == "" && stringOf(n.body["@odata.etag"]) != "" {
			return writeError(w, http.StatusPreconditionRequired, "Base.1.8.PreconditionRequired", "A precondition header or annotation is required to change the resource.")
		}
		return s.patchSecureBootLocked(w, p, body)
	}
	if tag, has := n.body["@odata.etag"].(string); has && tag != "" {
		im := r.Header.Get("If-Match")
		switch {
		case im == "" && s.quirks.RequireIfMatch:
			return writeError(w, http.StatusPreconditionRequired, "Base.1.8.PreconditionRequired", "A precondition header or annotation is required to change the resource.")
		case im != "" && im != "*" && strings.TrimPrefix(im, "W/") != strings.TrimPrefix(tag, "W/"):
			return writeError(w, http.StatusPreconditionFailed, "Base.1.8.PreconditionFailed", "The ETag supplied did not match the ETag required to change this resource.")
		}
	}
	target := p
	// A settings object (System's @Redfish.Settings.SettingsObject) carries
	// the System's properties; the emulator applies them to the System.
	if !isSystem(n.body) || strings.HasSuffix(p, "/pending") || strings.HasSuffix(p, "/settings") {
		if sys := s.systemForSettingsLocked(p); sys != "" {
			target = sys
		}
	}
	tn := s.nodeLocked(target)
	switch {
	case isSystem(tn.body):
		return s.patchBootLocked(r.Context(), w, target, p, body)
	case strings.Contains(strings.ToLower(stringOf(tn.body["@odata.type"])), "virtualmedia."):
		return s.patchMediaLocked(r.Context(), w, target, body)
	}
	return writeError(w, http.StatusMethodNotAllowed, "Base.1.8.OperationNotAllowed", "PATCH is not modelled for this resource.")
}

func stringOf(v any) string { s, _ := v.(string); return s }

// systemForSettingsLocked returns the System whose settings object is at p.
func (s *Server) systemForSettingsLocked(p string) string {
	for _, id := range memberIDs(s.nodeLocked("/redfish/v1/Systems").body) {
		sys := s.nodeLocked(id)
		if sys == nil {
			continue
		}
		st, _ := sys.body["@Redfish.Settings"].(map[string]any)
		if normPath(odataID(st["SettingsObject"])) == p {
			return id
		}
	}
	return ""
}

func (s *Server) patchBootLocked(ctx context.Context, w http.ResponseWriter, sysPath, patchedPath string, body map[string]any) int {
	cur := s.nodeLocked(sysPath)
	boot, _ := cur.body["Boot"].(map[string]any)
	req, _ := body["Boot"].(map[string]any)
	for k := range body {
		if k != "Boot" {
			return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyNotWritable", "The property "+k+" is a read only property and cannot be assigned a value.", k)
		}
	}
	if boot == nil || req == nil {
		return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyUnknown", "The property Boot is not in the list of valid properties for the resource.", "Boot")
	}
	if _, has := req["BootSourceOverrideMode"]; has && s.quirks.RejectBootModeInPatch {
		return writeError(w, http.StatusBadRequest, "iLO.2.15.UnsupportedOperation", "This operation is not supported by the current configuration.", "BootSourceOverrideMode")
	}
	for k, v := range req {
		if _, known := boot[k]; !known || !slices.Contains([]string{"BootSourceOverrideTarget", "BootSourceOverrideEnabled", "BootSourceOverrideMode"}, k) {
			return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyNotWritable", "The property "+k+" is a read only property and cannot be assigned a value.", k)
		}
		sv, ok := v.(string)
		if !ok {
			return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueTypeError", "The value for the property "+k+" is of a different type than the property can accept.", "", k)
		}
		allowed := strs(anySlice(boot[k+"@Redfish.AllowableValues"]))
		if allowed == nil {
			allowed = map[string][]string{
				"BootSourceOverrideEnabled": {"Once", "Continuous", "Disabled"},
				"BootSourceOverrideMode":    {"UEFI", "Legacy"},
				"BootSourceOverrideTarget":  {"None", "Pxe", "Hdd", "Cd", "BiosSetup", "Usb", "Floppy", "Diags", "Utilities", "UefiTarget"},
			}[k]
		}
		if !slices.Contains(allowed, sv) {
			return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList", "The value "+sv+" for the property "+k+" is not in the list of acceptable values.", sv, k)
		}
	}
	if s.quirks.IgnoreOnce && req["BootSourceOverrideEnabled"] == "Once" {
		w.WriteHeader(http.StatusNoContent)
		return http.StatusNoContent
	}
	s.mutateLocked(sysPath, func(b map[string]any) {
		bb := b["Boot"].(map[string]any)
		for k, v := range req {
			bb[k] = v
		}
		if s.quirks.StoreContinuousForOnce && req["BootSourceOverrideEnabled"] == "Once" {
			bb["BootSourceOverrideEnabled"] = "Continuous"
		}
		if _, has := req["BootSourceOverrideMode"]; !has && s.quirks.BootModeWhenOmitted != "" {
			bb["BootSourceOverrideMode"] = s.quirks.BootModeWhenOmitted
		}
	})
	if patchedPath != sysPath {
		s.mutateLocked(patchedPath, func(b map[string]any) {
			bb, _ := b["Boot"].(map[string]any)
			if bb == nil {
				bb = map[string]any{}
				b["Boot"] = bb
			}
			for k, v := range req {
				bb[k] = v
			}
		})
	}
	if bb, ok := s.power.(BootBackend); ok {
		b, _ := s.nodeLocked(sysPath).body["Boot"].(map[string]any)
		if err := bb.SetBootOverride(ctx, stringOf(b["BootSourceOverrideTarget"]), stringOf(b["BootSourceOverrideEnabled"])); err != nil {
			return writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", "The request failed due to an internal service error: "+err.Error())
		}
	}
	if s.quirks.BootPatchAnswers400 {
		return writeError(w, http.StatusBadRequest, "Base.1.8.GeneralError", "A general error has occurred.")
	}
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

func anySlice(v any) []any { s, _ := v.([]any); return s }

func (s *Server) patchMediaLocked(ctx context.Context, w http.ResponseWriter, slot string, body map[string]any) int {
	for k := range body {
		if !slices.Contains([]string{"Image", "Inserted", "WriteProtected"}, k) {
			return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyNotWritable", "The property "+k+" is a read only property and cannot be assigned a value.", k)
		}
	}
	img, hasImg := body["Image"]
	if hasImg && (img == nil || img == "") || body["Inserted"] == false {
		if code := s.mediaHookLocked(ctx, w, ""); code != 0 {
			return code
		}
		s.ejectLocked(slot)
		w.WriteHeader(http.StatusNoContent)
		return http.StatusNoContent
	}
	si, ok := img.(string)
	if !ok {
		return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueTypeError", "The value for the property Image is of a different type than the property can accept.", "", "Image")
	}
	if code := s.mediaHookLocked(ctx, w, si); code != 0 {
		return code
	}
	s.mutateLocked(slot, func(b map[string]any) {
		b["Image"], b["ImageName"], b["Inserted"], b["ConnectedVia"] = si, path.Base(si), true, "URI"
		if wp, ok := body["WriteProtected"].(bool); ok {
			b["WriteProtected"] = wp
		}
	})
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// mediaHookLocked forwards an accepted media change to the backend when it
// is a [MediaBackend]: image "" ejects. It returns 0 on success (or without
// such a backend), else the status it wrote.
func (s *Server) mediaHookLocked(ctx context.Context, w http.ResponseWriter, image string) int {
	mb, ok := s.power.(MediaBackend)
	if !ok {
		return 0
	}
	var err error
	if image == "" {
		err = mb.EjectMedia(ctx)
	} else {
		err = mb.InsertMedia(ctx, image)
	}
	if err != nil {
		return writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", "The request failed due to an internal service error: "+err.Error())
	}
	return 0
}

// noteReset updates ComputerSystem.LastResetTime and BootProgress
// (LastState, LastStateTime) after a reset that starts the host, where the
// tree has them, as bmcweb and iDRAC 9 do; with Quirks.NoLastResetTime the
// properties stay hidden and frozen.
func (s *Server) noteReset(sys, rt string) {
	switch rt {
	case "On", "ForceOn", "ForceRestart", "GracefulRestart", "PowerCycle", "PushPowerButton":
	default:
		return
	}
	if s.quirks.NoLastResetTime {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resets++
	// One millisecond more per reset: two resets within one clock tick
	// still read as different times, as a BMC's own stamps do.
	now := s.now().UTC().Add(time.Duration(s.resets) * time.Millisecond).Format("2006-01-02T15:04:05.000Z07:00")
	s.mutateLocked(sys, func(b map[string]any) {
		if _, ok := b["LastResetTime"]; ok {
			b["LastResetTime"] = now
		}
		if bp, ok := b["BootProgress"].(map[string]any); ok {
			bp["LastState"] = "SystemHardwareInitializationComplete"
			bp["LastStateTime"] = now
		}
	})
}
