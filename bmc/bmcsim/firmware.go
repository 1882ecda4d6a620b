package bmcsim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Firmware configures how the emulator models BIOS settings, firmware
// updates, RAID volumes and Secure Boot. The zero value is the default:
// short updates for tests. These behaviours only answer requests the
// emulator used to refuse (PATCH of a Bios settings object or SecureBoot,
// POST to UpdateService or a Volumes collection, DELETE of a Volume), so
// existing users see no change.
//
// What models which BMC:
//
//   - Pending BIOS settings: a PATCH of the Bios @Redfish.Settings
//     SettingsObject (Bios/Settings on iDRAC and the DMTF mockup,
//     bios/settings on iLO, Bios/Pending on XCC, Bios/SD on Supermicro) is
//     kept there and merged into Bios.Attributes at the next reset that
//     starts the host, as every tree's Settings object shows (HPE iLO 5
//     keeps pending settings in bios/settings until the next reset; XCC
//     lists only OnReset in SupportedApplyTimes).
//   - Dell iDRAC: pending BIOS settings apply only through a configuration
//     job. A PATCH carrying @Redfish.SettingsApplyTime (iDRAC9 4.x and
//     later) answers 202 with a Location naming the job
//     /redfish/v1/Managers/iDRAC.Embedded.1/Jobs/JID_...; older firmware
//     needs a POST to that Jobs collection with TargetSettingsURI. The job
//     is Scheduled until the reset, then Completed; settings without a job
//     stay pending across resets. The tree carries no Jobs (Oem
//     subresources were cut), so the job body follows Dell's published
//     DellJob schema (JobState, PercentComplete, Message, MessageId).
//   - Registry refusals: 400 with a Base MessageId per attribute
//     (PropertyUnknown, PropertyValueTypeError, PropertyValueNotInList,
//     PropertyValueOutOfRange, PropertyNotWritable) and MessageArgs
//     [value, name], as iDRAC, iLO and bmcweb answer (sushy's error.json
//     sample shows the shape). No fixture tree carries the attribute
//     registry body itself (only the MessageRegistryFile entries under
//     Registries), so the emulator derives one from the Bios attributes of
//     the tree (see biosRegistry for its rules) and serves it at the
//     Location the tree's registry file names.
//   - Firmware updates: UpdateService.SimpleUpdate (iDRAC, iLO, XCC,
//     Supermicro, DMTF list it) and the MultipartHttpPushUri (iDRAC,
//     XCC, Supermicro, bmcweb list it) answer 202 with a Task whose
//     PercentComplete grows per poll; when it completes, the BMC restarts
//     (iDRAC, iLO and XCC restart their management controller after a BMC
//     update; bmcweb restarts after any image activation): the next
//     request is dropped, sessions are gone, and the following ones answer
//     503 for a while. No tree shows the update itself (mockups hold no
//     202s); the emulator takes the new version from the image's file name
//     ("BIOS_1.9.0.bin" updates the first updateable component whose Id or
//     Name contains "BIOS" to 1.9.0) and fails the task when no component matches, as a BMC
//     refuses a package not meant for it.
//   - SimpleUpdate with @Redfish.OperationApplyTime OnReset, on a tree
//     whose SimpleUpdate lists it in OperationApplyTimeSupport (iDRAC 9:
//     Immediate, OnReset, OnStartUpdateRequest), downloads at once and
//     keeps its task Pending until a reset that starts the host, then
//     runs it (iDRAC 4.22 and later hold a host firmware package as a
//     scheduled job until the server reboots); an apply time not listed
//     is refused (ActionParameterNotSupported). The emulator takes
//     OnStartUpdateRequest as not modelled and refuses it too.
//   - A failed update: the task ends in Exception with the Update
//     registry's message (ApplyFailed, or TransferFailed when the image
//     could not be fetched); on the Dell tree it ends Completed with
//     TaskStatus Critical, as iDRAC reports a failed job's task.
//   - A Bios that lists no SupportedApplyTimes refuses a PATCH carrying
//     @Redfish.SettingsApplyTime with PropertyUnknown, as Supermicro's
//     BMC does; one that lists them refuses an apply time not listed
//     with PropertyValueNotInList.
//   - Volumes: POST to a Storage Volumes collection checks RAIDType against
//     the controller's SupportedRAIDTypes and the drives against Drives
//     (XCC's M.2 controller lists RAID1; iDRAC's CPU.1 lists none and
//     accepts the standard types). On iDRAC the volume is made by a
//     configuration job at the next reset; elsewhere at once (201, the
//     DMTF behaviour; no tree shows which of the two XCC and Supermicro
//     do). DELETE of a Volume removes it.
//   - Secure Boot: PATCH SecureBootEnable changes what is configured;
//     SecureBootCurrentBoot follows at the next reset (iDRAC, iLO, XCC,
//     Supermicro and the DMTF mockup carry the resource).
type Firmware struct {
	// UpdatePolls is how many task polls report Running before an update
	// completes; zero means 3.
	UpdatePolls int
	// RestartRequests is how long the BMC restarts after an update, in
	// requests: the first is dropped, the others answer 503; zero means 3,
	// negative means no restart.
	RestartRequests int
	// FetchImages makes SimpleUpdate download its http or https
	// ImageURI while the task runs, as the BMCs whose trees list
	// SimpleUpdate do (iDRAC, iLO, XCC and Supermicro fetch the package
	// from the URI themselves; the DMTF Update registry's TransferFailed
	// names a failed fetch): an answer other than 200 or 206, or a failed
	// connection, ends the task in Exception with Update.1.0.TransferFailed
	// and changes no component. Each fetch is recorded (ImageFetches).
	// False (the default) reads only the file name, for tests whose
	// ImageURI serves nothing.
	FetchImages bool
}

// ImageFetch is one download of an update image the emulator made
// (Firmware.FetchImages): the URI, the HTTP status (0 when the
// connection failed), the bytes read and their SHA-256 in hex, and the
// error.
type ImageFetch struct {
	URI    string
	Status int
	Bytes  int64
	SHA256 string
	Err    string
}

// ImageFetches returns the downloads SimpleUpdate made, oldest first.
func (s *Server) ImageFetches() []ImageFetch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.fw().fetches)
}

// fetchImage downloads uri as a BMC does for SimpleUpdate: bounded in
// time and size, hashed as it streams.
func fetchImage(ctx context.Context, uri string) ImageFetch {
	f := ImageFetch{URI: uri}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, uri, nil)
	if err != nil {
		f.Err = err.Error()
		return f
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.Err = err.Error()
		return f
	}
	defer resp.Body.Close()
	f.Status = resp.StatusCode
	h := sha256.New()
	f.Bytes, err = io.Copy(h, io.LimitReader(resp.Body, 8<<30))
	f.SHA256 = hex.EncodeToString(h.Sum(nil))
	if err != nil {
		f.Err = err.Error()
	} else if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
		f.Err = resp.Status
	}
	return f
}

// fwState is one Server's firmware state. Guarded by Server.mu.
type fwState struct {
	pending    map[string]map[string]any // by Bios path: settings written, not applied
	jobs       map[string]*simJob        // Dell jobs by Id
	updates    map[string]*fwUpdate      // by task Id
	restart    int                       // requests left in the BMC restart
	restarting bool                      // the restart has dropped its first request
	fetches    []ImageFetch              // SimpleUpdate downloads (Firmware.FetchImages)
	jobSeq     int
}

// simJob is a Dell configuration job.
type simJob struct {
	id, target string // target: the settings object or volume request it applies
	state      string // Scheduled, Completed
	apply      func() // run at the reset
}

type fwUpdate struct {
	id         string
	polls      int
	got        int
	component  string // path of the component to update, "" when none matched
	version    string
	image      string
	done, fail bool
	transfer   string // why the image's download failed; "" when it did not
	scheduled  bool   // OperationApplyTime OnReset: waits for a host reset
}

func (s *Server) fw() *fwState {
	if s.fwst == nil {
		s.fwst = &fwState{pending: map[string]map[string]any{}, jobs: map[string]*simJob{}, updates: map[string]*fwUpdate{}}
	}
	return s.fwst
}

func (s *Server) isDell() bool {
	return strings.HasPrefix(strings.ToLower(s.cfg.Tree.Manufacturer), "dell")
}

// restartingLocked reports what a request meets while the BMC restarts
// after an update: 0 when it is up, -1 for a dropped connection, 503.
func (s *Server) restartingLocked() int {
	f := s.fwst
	if f == nil || f.restart <= 0 {
		return 0
	}
	f.restart--
	if !f.restarting {
		f.restarting = true
		clear(s.sessions) // a restarted BMC has forgotten its sessions
		return -1
	}
	if f.restart == 0 {
		f.restarting = false
	}
	return http.StatusServiceUnavailable
}

// biosForSettingsLocked returns the Bios resource path whose settings object is p, or
// "" when p is not one.
func (s *Server) biosForSettingsLocked(p string) string {
	for _, sys := range memberIDs(s.nodeLocked("/redfish/v1/Systems").body) {
		sn := s.nodeLocked(sys)
		if sn == nil {
			continue
		}
		bp := odataID(sn.body["Bios"])
		bn := s.nodeLocked(bp)
		if bn == nil {
			continue
		}
		st, _ := bn.body["@Redfish.Settings"].(map[string]any)
		if normPath(odataID(st["SettingsObject"])) == p {
			return normPath(bp)
		}
	}
	return ""
}

// regAttr is one attribute of the derived registry.
type regAttr struct {
	Name, Type     string
	Values         []string
	Lower, Upper   int64
	MaxLen         int64
	ReadOnly       bool
	ResetRequired  bool
	hasBounds, len bool
}

// vendorEnums are attributes whose Enumeration values the fixture trees
// do not list (no registry body survives in them) but the vendors'
// published registries do.
var vendorEnums = map[string][]string{
	"BootMode":        {"Bios", "Uefi"},                                                                                                                                                                                                                                                                                                                  // Dell iDRAC, DMTF mockup
	"hpe:BootMode":    {"Uefi", "LegacyBios"},                                                                                                                                                                                                                                                                                                            // HPE iLO 5
	"WorkloadProfile": {"GeneralPowerEfficientCompute", "GeneralPeakFrequencyCompute", "GeneralThroughputCompute", "Virtualization-PowerEfficient", "Virtualization-MaxPerformance", "LowLatency", "MissionCritical", "TransactionalApplicationProcessing", "HighPerformanceCompute", "DecisionSupport", "GraphicProcessing", "I/OThroughput", "Custom"}, // HPE iLO 5
	"SysProfile":      {"PerfPerWattOptimizedOs", "PerfPerWattOptimizedDapc", "PerfOptimized", "Custom", "PerfWorkStationOptimized"},                                                                                                                                                                                                                     // Dell
	"PowerProfile":    {"MaxPerf", "PowerSaving", "Balanced"},                                                                                                                                                                                                                                                                                            // DMTF mockup
}

// biosRegistry derives the attribute registry of the Bios at bp from its
// attributes (no fixture tree carries a registry body). Rules: a boolean
// is Boolean; a number is Integer bounded 0..65535 (or 0..twice the value
// when larger); "Enabled"/"Disabled", "Enable"/"Disable" and "On"/"Off"
// values are Enumerations of that pair; names in vendorEnums are
// Enumerations of the vendor's values; a null whose name holds
// "Password" is Password; any other string is a String of at most 255
// characters. Names holding "Version" and Dell's System* identity
// attributes (SystemServiceTag, SystemModelName, SystemManufacturer) are
// read-only, as the vendors' registries mark them. Every attribute is
// ResetRequired (BIOS settings apply at POST).
func (s *Server) biosRegistryLocked(bp string) map[string]*regAttr {
	bn := s.cfg.Tree.lookup(bp)
	if bn == nil {
		return nil
	}
	attrs, _ := bn.body["Attributes"].(map[string]any)
	hpe := strings.HasPrefix(strings.ToLower(s.cfg.Tree.Manufacturer), "hp")
	reg := make(map[string]*regAttr, len(attrs))
	for k, v := range attrs {
		a := &regAttr{Name: k, ResetRequired: true}
		switch x := v.(type) {
		case bool:
			a.Type = "Boolean"
		case float64:
			a.Type, a.hasBounds, a.Upper = "Integer", true, 65535
			if int64(x) > a.Upper {
				a.Upper = 2 * int64(x)
			}
		case nil:
			a.Type, a.len, a.MaxLen = "String", true, 255
			if strings.Contains(strings.ToLower(k), "password") {
				a.Type = "Password"
			}
		case string:
			a.Type, a.len, a.MaxLen = "String", true, 255
			ev := vendorEnums[k]
			if hpe && vendorEnums["hpe:"+k] != nil {
				ev = vendorEnums["hpe:"+k]
			}
			switch {
			case ev != nil:
				a.Type, a.Values, a.len = "Enumeration", ev, false
			case x == "Enabled" || x == "Disabled":
				a.Type, a.Values, a.len = "Enumeration", []string{"Enabled", "Disabled"}, false
			case x == "Enable" || x == "Disable":
				a.Type, a.Values, a.len = "Enumeration", []string{"Enable", "Disable"}, false
			case x == "On" || x == "Off":
				a.Type, a.Values, a.len = "Enumeration", []string{"On", "Off"}, false
			}
		}
		if strings.Contains(k, "Version") || k == "SystemServiceTag" || k == "SystemModelName" || k == "SystemManufacturer" {
			a.ReadOnly = true
		}
		reg[k] = a
	}
	return reg
}

// registryBody renders reg as a Redfish AttributeRegistry.
func registryBody(id string, reg map[string]*regAttr) map[string]any {
	names := make([]string, 0, len(reg))
	for k := range reg {
		names = append(names, k)
	}
	sort.Strings(names)
	list := make([]any, 0, len(names))
	for _, k := range names {
		a := reg[k]
		m := map[string]any{"AttributeName": a.Name, "Type": a.Type, "ReadOnly": a.ReadOnly, "ResetRequired": a.ResetRequired, "DisplayName": a.Name}
		if a.Values != nil {
			vs := make([]any, len(a.Values))
			for i, v := range a.Values {
				vs[i] = map[string]any{"ValueName": v, "ValueDisplayName": v}
			}
			m["Value"] = vs
		}
		if a.hasBounds {
			m["LowerBound"], m["UpperBound"] = a.Lower, a.Upper
		}
		if a.len {
			m["MinLength"], m["MaxLength"] = 0, a.MaxLen
		}
		list = append(list, m)
	}
	return map[string]any{
		"@odata.type": "#AttributeRegistry.v1_3_6.AttributeRegistry", "Id": id, "Name": "BIOS Attribute Registry",
		"Language": "en", "OwningEntity": "bmcsim", "RegistryVersion": "1.0.0",
		"RegistryEntries": map[string]any{"Attributes": list},
	}
}

// registryAtLocked maps the URI a registry file's Location names to
// the Bios it describes and the registry Id, when p is one.
func (s *Server) registryAtLocked(p string) (bios, id string) {
	for _, sys := range memberIDs(s.nodeLocked("/redfish/v1/Systems").body) {
		sn := s.nodeLocked(sys)
		if sn == nil {
			continue
		}
		bp := odataID(sn.body["Bios"])
		bn := s.nodeLocked(bp)
		if bn == nil {
			continue
		}
		name, _ := bn.body["AttributeRegistry"].(string)
		rc := s.nodeLocked("/redfish/v1/Registries")
		if rc == nil || name == "" {
			continue
		}
		for _, m := range memberIDs(rc.body) {
			f := s.nodeLocked(m)
			if f == nil || !sameRegistry(stringOf(f.body["Id"]), stringOf(f.body["Registry"]), name) {
				continue
			}
			locs, _ := f.body["Location"].([]any)
			for _, l := range locs {
				lm, _ := l.(map[string]any)
				if normPath(stringOf(lm["Uri"])) == p {
					return normPath(bp), name
				}
			}
		}
	}
	return "", ""
}

// sameRegistry reports whether a registry file (Id, Registry) is the one a
// Bios names, ignoring the version: iDRAC's Bios names
// BiosAttributeRegistry.v1_0_3 and lists BiosAttributeRegistry.v1_0_0;
// Supermicro names BiosAttributeRegistry.v1_0_0 and lists Id
// BiosAttributeRegistry, Registry BiosAttributeRegistry.1.0.0.
func sameRegistry(id, registry, name string) bool {
	base := func(s string) string {
		if i := strings.Index(s, "."); i >= 0 {
			return strings.ToLower(s[:i])
		}
		return strings.ToLower(s)
	}
	b := base(name)
	return b != "" && (base(id) == b || base(registry) == b)
}

// serveFirmwareGet answers GETs of what the emulator makes up: the
// registry body, settings objects with their pending values, Dell jobs,
// update tasks. ok is false for other paths.
func (s *Server) serveFirmwareGet(w http.ResponseWriter, p string) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodeLocked(p) == nil {
		// Registry bodies are not in any tree: only a missing path can be one.
		if bp, id := s.registryAtLocked(p); bp != "" {
			return writeJSON(w, http.StatusOK, registryBody(id, s.biosRegistryLocked(bp))), true
		}
	}
	if bp := s.biosForSettingsLocked(p); bp != "" {
		var body map[string]any
		n := s.nodeLocked(p)
		pend := s.fw().pending[bp]
		if n != nil {
			if len(pend) == 0 {
				return 0, false // as the tree has it
			}
			body = deepCopy(n.body).(map[string]any)
			w.Header().Set("ETag", s.etagHeader(n.etag))
		} else {
			body = map[string]any{"@odata.id": p, "@odata.type": "#Bios.v1_2_0.Bios", "Id": "Settings", "Name": "BIOS Configuration Pending Settings"}
		}
		attrs, _ := body["Attributes"].(map[string]any)
		if attrs == nil {
			attrs = map[string]any{}
		}
		for k, v := range pend {
			attrs[k] = v
		}
		body["Attributes"] = attrs
		return writeJSON(w, http.StatusOK, body), true
	}
	if strings.HasPrefix(p, "/redfish/v1/managers/idrac.embedded.1/jobs/") && s.isDell() {
		id := path.Base(p)
		for jid, j := range s.fw().jobs {
			if strings.EqualFold(jid, id) {
				return writeJSON(w, http.StatusOK, jobBody(j)), true
			}
		}
		return writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "The resource at the URI "+p+" was not found."), true
	}
	if strings.HasPrefix(p, "/redfish/v1/taskservice/tasks/fw") {
		u, ok := s.fw().updates[path.Base(p)]
		if !ok {
			return writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "No such task."), true
		}
		return writeJSON(w, http.StatusOK, s.pollUpdateLocked(u)), true
	}
	return 0, false
}

func jobBody(j *simJob) map[string]any {
	pc := 0
	msg, mid := "Task successfully scheduled.", "JCP001"
	if j.state == "Completed" {
		pc, msg, mid = 100, "Job completed successfully.", "PR19"
	}
	return map[string]any{
		"@odata.id":   "/redfish/v1/Managers/iDRAC.Embedded.1/Jobs/" + j.id,
		"@odata.type": "#DellJob.v1_5_0.DellJob", "Id": j.id, "Name": "Configure: BIOS",
		"JobType": "BIOSConfiguration", "JobState": j.state, "PercentComplete": pc,
		"Message": msg, "MessageId": mid, "TargetSettingsURI": j.target,
	}
}

// newJobLocked makes a Scheduled Dell job running apply at the next reset.
func (s *Server) newJobLocked(target string, apply func()) *simJob {
	f := s.fw()
	f.jobSeq++
	j := &simJob{id: fmt.Sprintf("JID_%012d", 100000000000+f.jobSeq), target: target, state: "Scheduled", apply: apply}
	f.jobs[j.id] = j
	return j
}

// attrRefusal is one attribute the registry refuses, as a Base message.
type attrRefusal struct{ id, msg, name, value string }

func checkAttr(reg map[string]*regAttr, k string, v any) *attrRefusal {
	sv := fmt.Sprint(v)
	if s, ok := v.(string); ok {
		sv = s
	}
	a, ok := reg[k]
	if !ok {
		return &attrRefusal{"PropertyUnknown", "The property " + k + " is not in the list of valid properties for the resource.", k, sv}
	}
	if a.ReadOnly {
		return &attrRefusal{"PropertyNotWritable", "The property " + k + " is a read only property and cannot be assigned a value.", k, sv}
	}
	typeErr := &attrRefusal{"PropertyValueTypeError", "The value " + sv + " for the property " + k + " is of a different type than the property can accept.", k, sv}
	switch a.Type {
	case "Boolean":
		if _, ok := v.(bool); !ok {
			return typeErr
		}
	case "Integer":
		n, ok := v.(float64)
		if !ok || n != float64(int64(n)) {
			return typeErr
		}
		if int64(n) < a.Lower || int64(n) > a.Upper {
			return &attrRefusal{"PropertyValueOutOfRange", "The value " + sv + " for the property " + k + " is not in the supported range of acceptable values.", k, sv}
		}
	case "Enumeration":
		s, ok := v.(string)
		if !ok {
			return typeErr
		}
		if !slices.Contains(a.Values, s) {
			return &attrRefusal{"PropertyValueNotInList", "The value " + s + " for the property " + k + " is not in the list of acceptable values.", k, s}
		}
	case "String", "Password":
		s, ok := v.(string)
		if !ok {
			return typeErr
		}
		if int64(len([]rune(s))) > a.MaxLen {
			return &attrRefusal{"PropertyValueOutOfRange", "The value for the property " + k + " is not in the supported range of acceptable values.", k, sv}
		}
	}
	return nil
}

// patchBiosSettingsLocked handles PATCH of a Bios settings object.
func (s *Server) patchBiosSettingsLocked(w http.ResponseWriter, bp, p string, body map[string]any) int {
	for k := range body {
		if k != "Attributes" && k != "@Redfish.SettingsApplyTime" {
			return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyUnknown", "The property "+k+" is not in the list of valid properties for the resource.", k)
		}
	}
	attrs, ok := body["Attributes"].(map[string]any)
	if !ok {
		return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyMissing", "The property Attributes is a required property and must be included in the request.", "Attributes")
	}
	bn := s.nodeLocked(bp)
	st, _ := bn.body["@Redfish.Settings"].(map[string]any)
	supported := strs(anySlice(st["SupportedApplyTimes"]))
	applyTime := ""
	if at, has := body["@Redfish.SettingsApplyTime"]; has {
		if len(supported) == 0 {
			// A Bios that lists no SupportedApplyTimes refuses the
			// property itself (Supermicro answers PropertyUnknown).
			return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyUnknown", "The property @Redfish.SettingsApplyTime is not in the list of valid properties for the resource.", "@Redfish.SettingsApplyTime")
		}
		m, _ := at.(map[string]any)
		applyTime, _ = m["ApplyTime"].(string)
		if !slices.Contains(supported, applyTime) {
			return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList", "The value "+applyTime+" for the property ApplyTime is not in the list of acceptable values.", applyTime, "ApplyTime")
		}
	}
	reg := s.biosRegistryLocked(bp)
	var infos []any
	keys := make([]string, 0, len(attrs))
	for k := range attrs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if r := checkAttr(reg, k, attrs[k]); r != nil {
			args := []string{r.value, r.name}
			if r.id == "PropertyUnknown" || r.id == "PropertyNotWritable" {
				args = []string{r.name}
			}
			infos = append(infos, map[string]any{"@odata.type": "#Message.v1_1_1.Message", "MessageId": "Base.1.8." + r.id, "Message": r.msg,
				"MessageArgs": args, "RelatedProperties": []any{"#/Attributes/" + k}, "Severity": "Warning", "Resolution": "Correct the value and resubmit the request."})
		}
	}
	if len(infos) > 0 {
		first := infos[0].(map[string]any)
		return writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{
			"code": first["MessageId"], "message": first["Message"], "@Message.ExtendedInfo": infos}})
	}
	f := s.fw()
	if f.pending[bp] == nil {
		f.pending[bp] = map[string]any{}
	}
	for k, v := range attrs {
		f.pending[bp][k] = v
	}
	if applyTime == "Immediate" {
		s.applyBiosLocked(bp)
	}
	if s.isDell() && applyTime != "" && applyTime != "Immediate" {
		// iDRAC9 4.x+: the apply time makes a configuration job.
		j := s.newJobLocked(p, func() { s.applyBiosLocked(bp) })
		w.Header().Set("Location", "/redfish/v1/Managers/iDRAC.Embedded.1/Jobs/"+j.id)
		return writeJSON(w, http.StatusAccepted, map[string]any{"@Message.ExtendedInfo": []any{map[string]any{"MessageId": "IDRAC.2.8.SYS011", "Message": "Pending configuration values are successfully applied to server and a job is created. Job ID: " + j.id}}})
	}
	return writeJSON(w, http.StatusOK, map[string]any{"@Message.ExtendedInfo": []any{map[string]any{"MessageId": "Base.1.8.Success", "Message": "Successfully Completed Request"}}})
}

// applyBiosLocked merges the pending settings into Bios.Attributes.
func (s *Server) applyBiosLocked(bp string) {
	f := s.fw()
	pend := f.pending[bp]
	if len(pend) == 0 {
		return
	}
	s.mutateLocked(bp, func(b map[string]any) {
		a, _ := b["Attributes"].(map[string]any)
		if a == nil {
			a = map[string]any{}
			b["Attributes"] = a
		}
		for k, v := range pend {
			a[k] = v
		}
	})
	// The settings object, where the tree has one with attributes (iLO's
	// bios/settings and XCC's Bios/Pending copy every attribute), reads
	// the applied values afterwards, as on the BMCs.
	bn := s.nodeLocked(bp)
	st, _ := bn.body["@Redfish.Settings"].(map[string]any)
	if so := odataID(st["SettingsObject"]); so != "" && s.nodeLocked(so) != nil {
		s.mutateLocked(so, func(b map[string]any) {
			if a, ok := b["Attributes"].(map[string]any); ok {
				for k, v := range pend {
					a[k] = v
				}
			}
		})
	}
	delete(f.pending, bp)
}

// postJobLocked handles POST to iDRAC's Jobs collection with
// TargetSettingsURI (older iDRAC firmware and RACADM's flow).
func (s *Server) postJobLocked(w http.ResponseWriter, body map[string]any) int {
	target, _ := body["TargetSettingsURI"].(string)
	bp := s.biosForSettingsLocked(normPath(target))
	if bp == "" {
		return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList", "The value "+target+" for the property TargetSettingsURI is not in the list of acceptable values.", target, "TargetSettingsURI")
	}
	for _, j := range s.fw().jobs {
		if j.state == "Scheduled" && normPath(j.target) == normPath(target) {
			return writeError(w, http.StatusBadRequest, "IDRAC.2.8.SYS011", "Pending configuration values are already committed, unable to perform another set operation.")
		}
	}
	j := s.newJobLocked(target, func() { s.applyBiosLocked(bp) })
	w.Header().Set("Location", "/redfish/v1/Managers/iDRAC.Embedded.1/Jobs/"+j.id)
	w.WriteHeader(http.StatusOK)
	return http.StatusOK
}

// onHostResetLocked applies what waits for a reset: pending BIOS settings
// (on iDRAC only through a Scheduled job), Dell jobs, Secure Boot.
func (s *Server) onHostResetLocked() {
	if s.fwst == nil {
		s.secureBootResetLocked()
		return
	}
	f := s.fwst
	for _, u := range f.updates {
		u.scheduled = false // an update scheduled OnReset runs now
	}
	ids := make([]string, 0, len(f.jobs))
	for id := range f.jobs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if j := f.jobs[id]; j.state == "Scheduled" {
			j.apply()
			j.state = "Completed"
		}
	}
	if !s.isDell() {
		bps := make([]string, 0, len(f.pending))
		for bp := range f.pending {
			bps = append(bps, bp)
		}
		for _, bp := range bps {
			s.applyBiosLocked(bp)
		}
	}
	s.secureBootResetLocked()
}

// secureBootResetLocked sets SecureBootCurrentBoot to what
// SecureBootEnable configures, on every System's SecureBoot.
func (s *Server) secureBootResetLocked() {
	for _, sys := range memberIDs(s.nodeLocked("/redfish/v1/Systems").body) {
		sn := s.nodeLocked(sys)
		if sn == nil {
			continue
		}
		sb := odataID(sn.body["SecureBoot"])
		n := s.nodeLocked(sb)
		if n == nil {
			continue
		}
		en, _ := n.body["SecureBootEnable"].(bool)
		want := "Disabled"
		if en {
			want = "Enabled"
		}
		if cur, has := n.body["SecureBootCurrentBoot"]; has && cur != want {
			s.mutateLocked(sb, func(b map[string]any) { b["SecureBootCurrentBoot"] = want })
		}
	}
}

// patchSecureBootLocked handles PATCH of a SecureBoot resource.
func (s *Server) patchSecureBootLocked(w http.ResponseWriter, p string, body map[string]any) int {
	for k, v := range body {
		if k != "SecureBootEnable" {
			return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyNotWritable", "The property "+k+" is a read only property and cannot be assigned a value.", k)
		}
		if _, ok := v.(bool); !ok {
			return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueTypeError", "The value "+fmt.Sprint(v)+" for the property SecureBootEnable is of a different type than the property can accept.", fmt.Sprint(v), "SecureBootEnable")
		}
	}
	s.mutateLocked(p, func(b map[string]any) { b["SecureBootEnable"] = body["SecureBootEnable"] })
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// imageVersion takes "BIOS_1.9.0.bin" apart into "BIOS" and "1.9.0".
var imageVersion = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9]*)[-_]v?(\d[0-9A-Za-z.\-]*?)(\.(bin|exe|hpb|fwpkg|uxz|zip|signed|img|tar|d9|pldm))?$`)

// startUpdateLocked makes an update task for the image and answers 202;
// transfer is why the image's download failed ("" when it did not), and
// such a task ends in Exception.
func (s *Server) startUpdateLocked(w http.ResponseWriter, image string, targets []string, transfer string) int {
	f := s.fw()
	s.seq++
	u := &fwUpdate{id: fmt.Sprintf("fw%d", s.seq), polls: s.cfg.Firmware.UpdatePolls, image: image, transfer: transfer}
	if u.polls <= 0 {
		u.polls = 3
	}
	if m := imageVersion.FindStringSubmatch(path.Base(image)); m != nil {
		u.version = m[2]
		inv := s.nodeLocked("/redfish/v1/UpdateService/FirmwareInventory")
		if inv != nil {
			for _, c := range memberIDs(inv.body) {
				if len(targets) > 0 && !slices.ContainsFunc(targets, func(t string) bool { return normPath(t) == normPath(c) }) {
					continue
				}
				cn := s.nodeLocked(c)
				if cn != nil && (strings.Contains(strings.ToLower(stringOf(cn.body["Id"])), strings.ToLower(m[1])) || strings.Contains(strings.ToLower(stringOf(cn.body["Name"])), strings.ToLower(m[1]))) && cn.body["Updateable"] != false {
					u.component = c
					break
				}
			}
		}
	}
	f.updates[u.id] = u
	loc := "/redfish/v1/TaskService/Tasks/" + u.id
	w.Header().Set("Location", loc)
	return writeJSON(w, http.StatusAccepted, s.updateBody(u, "Running", 0))
}

func (s *Server) updateBody(u *fwUpdate, state string, pc int) map[string]any {
	status := "OK"
	var msgs []any
	switch state {
	case "Completed":
		msgs = []any{map[string]any{"MessageId": "Update.1.0.UpdateSuccessful", "Message": "The target " + u.component + " was successfully updated to " + u.version + ".", "Severity": "OK"}}
	case "Exception":
		status = "Critical"
		msgs = []any{map[string]any{"MessageId": "Update.1.0.ApplyFailed", "Message": "The installation of image " + u.image + " failed: no component matches the package.", "Severity": "Critical"}}
		if u.transfer != "" {
			msgs = []any{map[string]any{"MessageId": "Update.1.0.TransferFailed", "Message": "Transfer of image '" + u.image + "' to '" + u.id + "' failed: " + u.transfer + ".", "Severity": "Critical"}}
		}
	default:
		msgs = []any{map[string]any{"MessageId": "TaskEvent.1.0.TaskProgressChanged", "Message": "The task " + u.id + " has changed to progress " + strconv.Itoa(pc) + " percent complete.", "Severity": "OK"}}
	}
	if state == "Exception" && s.isDell() {
		// iDRAC ends a failed update job's task Completed with
		// TaskStatus Critical, not Exception.
		state = "Completed"
	}
	return map[string]any{
		"@odata.id": "/redfish/v1/TaskService/Tasks/" + u.id, "@odata.type": "#Task.v1_4_3.Task",
		"Id": u.id, "Name": "Firmware update " + u.id, "TaskState": state, "TaskStatus": status,
		"PercentComplete": pc, "Messages": msgs,
	}
}

// pollUpdateLocked advances the update one poll and renders it. When it
// completes, the component gets its new version and the BMC restarts.
func (s *Server) pollUpdateLocked(u *fwUpdate) map[string]any {
	if u.done {
		if u.fail {
			return s.updateBody(u, "Exception", 100)
		}
		return s.updateBody(u, "Completed", 100)
	}
	if u.scheduled {
		return s.updateBody(u, "Pending", 0)
	}
	u.got++
	if u.got <= u.polls {
		return s.updateBody(u, "Running", u.got*100/(u.polls+1))
	}
	u.done = true
	if u.component == "" || u.transfer != "" {
		u.fail = true
		return s.updateBody(u, "Exception", 100)
	}
	s.mutateLocked(u.component, func(b map[string]any) { b["Version"] = u.version })
	if r := s.cfg.Firmware.RestartRequests; r >= 0 {
		if r == 0 {
			r = 3
		}
		s.fw().restart = r
	}
	return s.updateBody(u, "Completed", 100)
}

// simpleUpdate handles UpdateService.SimpleUpdate. With
// Firmware.FetchImages the image is downloaded after the request is
// checked and before the task is made (outside the lock).
func (s *Server) simpleUpdate(ctx context.Context, w http.ResponseWriter, body map[string]any) int {
	s.mu.Lock()
	if code := s.checkSimpleUpdateLocked(w, body); code != 0 {
		s.mu.Unlock()
		return code
	}
	fetch := s.cfg.Firmware.FetchImages
	s.mu.Unlock()
	img, _ := body["ImageURI"].(string)
	var got *ImageFetch
	if fetch && (strings.HasPrefix(img, "http://") || strings.HasPrefix(img, "https://")) {
		f := fetchImage(ctx, img)
		got = &f
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if got != nil {
		s.fw().fetches = append(s.fw().fetches, *got)
	}
	transfer := ""
	if got != nil {
		transfer = got.Err
	}
	code := s.startUpdateLocked(w, img, strs(anySlice(body["Targets"])), transfer)
	if at, _ := body["@Redfish.OperationApplyTime"].(string); at == "OnReset" {
		s.fw().updates[fmt.Sprintf("fw%d", s.seq)].scheduled = true
	}
	return code
}

// checkSimpleUpdateLocked refuses a SimpleUpdate the UpdateService does
// not take (no action, no ImageURI, a TransferProtocol not listed) and
// returns the status written, or 0.
func (s *Server) checkSimpleUpdateLocked(w http.ResponseWriter, body map[string]any) int {
	us := s.nodeLocked("/redfish/v1/UpdateService")
	act, _ := obj(us.body, "Actions")["#UpdateService.SimpleUpdate"].(map[string]any)
	if act == nil {
		return writeError(w, http.StatusMethodNotAllowed, "Base.1.8.ActionNotSupported", "The action UpdateService.SimpleUpdate is not supported by the resource.", "UpdateService.SimpleUpdate")
	}
	img, _ := body["ImageURI"].(string)
	if img == "" {
		return writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterMissing", "The action UpdateService.SimpleUpdate requires the parameter ImageURI to be present in the request body.", "UpdateService.SimpleUpdate", "ImageURI")
	}
	if tp, has := body["TransferProtocol"].(string); has {
		if allowed := strs(anySlice(act["TransferProtocol@Redfish.AllowableValues"])); allowed != nil && !slices.Contains(allowed, tp) {
			return writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterValueNotInList", "The value '"+tp+"' for the parameter TransferProtocol is not in the list of acceptable values.", tp, "TransferProtocol", "UpdateService.SimpleUpdate")
		}
	}
	if at, has := body["@Redfish.OperationApplyTime"]; has {
		sup, _ := act["@Redfish.OperationApplyTimeSupport"].(map[string]any)
		v, _ := at.(string)
		if allowed := strs(anySlice(sup["SupportedValues"])); !slices.Contains(allowed, v) || (v != "OnReset" && v != "Immediate") {
			return writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterNotSupported", "The parameter @Redfish.OperationApplyTime for the action UpdateService.SimpleUpdate is not supported on the target resource.", "@Redfish.OperationApplyTime", "UpdateService.SimpleUpdate")
		}
	}
	return 0
}

// multipartUpdate handles a POST to UpdateService.MultipartHttpPushUri
// (DSP0266 "Multipart HTTP push updates": an UpdateParameters JSON part
// and an UpdateFile part).
func (s *Server) multipartUpdate(w http.ResponseWriter, r *http.Request, raw []byte) int {
	_, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || params["boundary"] == "" {
		return writeError(w, http.StatusBadRequest, "Base.1.8.UnrecognizedRequestBody", "The service detected a malformed request body that it was unable to interpret.")
	}
	mr := multipart.NewReader(bytes.NewReader(raw), params["boundary"])
	var file string
	var targets []string
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return writeError(w, http.StatusBadRequest, "Base.1.8.UnrecognizedRequestBody", "The service detected a malformed request body that it was unable to interpret.")
		}
		switch part.FormName() {
		case "UpdateFile":
			file = part.FileName()
		case "UpdateParameters":
			b, _ := io.ReadAll(io.LimitReader(part, 1<<16))
			var m map[string]any
			if err := json.Unmarshal(b, &m); err == nil {
				targets = strs(anySlice(m["Targets"]))
			}
		}
	}
	if file == "" {
		return writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterMissing", "The action requires the parameter UpdateFile to be present in the request body.", "MultipartHttpPushUri", "UpdateFile")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startUpdateLocked(w, file, targets, "")
}

// isMultipartPush reports whether p is the tree's MultipartHttpPushUri.
func (s *Server) isMultipartPush(p string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	us := s.nodeLocked("/redfish/v1/UpdateService")
	if us == nil {
		return false
	}
	u, _ := us.body["MultipartHttpPushUri"].(string)
	return u != "" && normPath(u) == p
}

// raidMin is the least number of drives per RAID type (SNIA DDF levels).
var raidMin = map[string]int{"RAID0": 1, "RAID1": 2, "RAID5": 3, "RAID6": 4, "RAID10": 4, "RAID50": 6, "RAID60": 8}

// createVolumeLocked handles POST to a Storage's Volumes collection.
func (s *Server) createVolumeLocked(w http.ResponseWriter, p string, body map[string]any) int {
	stPath := strings.TrimSuffix(p, "/volumes")
	st := s.nodeLocked(stPath)
	coll := s.nodeLocked(p)
	if st == nil || coll == nil {
		return writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "The resource at the URI "+p+" was not found.")
	}
	rt, _ := body["RAIDType"].(string)
	var supported []string
	listed := false
	for _, c := range anySlice(st.body["StorageControllers"]) {
		if cm, ok := c.(map[string]any); ok {
			if v, has := cm["SupportedRAIDTypes"]; has && v != nil {
				listed = true
				supported = append(supported, strs(anySlice(v))...)
			}
		}
	}
	if !listed {
		supported = []string{"RAID0", "RAID1", "RAID5", "RAID6", "RAID10"}
	}
	if !slices.Contains(supported, rt) {
		return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList", "The value "+rt+" for the property RAIDType is not in the list of acceptable values.", rt, "RAIDType")
	}
	drives, code := s.volumeDrivesLocked(w, st, coll, body)
	if code != 0 {
		return code
	}
	if n := raidMin[rt]; len(drives) < n || ((rt == "RAID1" || rt == "RAID10") && len(drives)%2 != 0) {
		return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueIncorrect", fmt.Sprintf("%s needs at least %d drives (even for mirrors); %d given.", rt, n, len(drives)), "Links/Drives")
	}
	s.seq++
	vid := fmt.Sprintf("Volume%d", s.seq)
	if s.isDell() {
		vid = fmt.Sprintf("Disk.Virtual.%d:%s", s.seq, path.Base(st.path))
	}
	vpath := coll.path + "/" + vid
	name, _ := body["Name"].(string)
	if name == "" {
		name = vid
	}
	vb := map[string]any{"@odata.id": vpath, "@odata.type": "#Volume.v1_9_0.Volume", "Id": vid, "Name": name, "RAIDType": rt,
		"Links": map[string]any{"Drives": drives}, "Status": map[string]any{"State": "Enabled", "Health": "OK"}}
	if c, ok := body["CapacityBytes"].(float64); ok {
		vb["CapacityBytes"] = c
	}
	create := func() {
		raw, _ := json.Marshal(vb)
		s.over[normPath(vpath)] = newNode(vpath, raw, vb)
		s.mutateLocked(coll.path, func(b map[string]any) {
			ms := append(anySlice(b["Members"]), map[string]any{"@odata.id": vpath})
			b["Members"], b["Members@odata.count"] = ms, len(ms)
		})
	}
	if s.isDell() {
		// PERC and S150 volumes are made by a configuration job at the next reset.
		j := s.newJobLocked(coll.path, create)
		w.Header().Set("Location", "/redfish/v1/Managers/iDRAC.Embedded.1/Jobs/"+j.id)
		w.WriteHeader(http.StatusAccepted)
		return http.StatusAccepted
	}
	create()
	w.Header().Set("Location", vpath)
	return writeJSON(w, http.StatusCreated, vb)
}

// volumeDrivesLocked checks the drives a volume request names: on the
// Storage, and in no volume yet. It answers the refusal (code != 0).
func (s *Server) volumeDrivesLocked(w http.ResponseWriter, st, coll *node, body map[string]any) ([]any, int) {
	var known []string
	for _, d := range anySlice(st.body["Drives"]) {
		known = append(known, normPath(odataID(d)))
	}
	used := map[string]bool{}
	for _, v := range memberIDs(coll.body) {
		if vn := s.nodeLocked(v); vn != nil {
			for _, d := range anySlice(obj(vn.body, "Links")["Drives"]) {
				used[normPath(odataID(d))] = true
			}
		}
	}
	var drives []any
	for _, d := range anySlice(obj(body, "Links")["Drives"]) {
		id := odataID(d)
		if !slices.Contains(known, normPath(id)) {
			return nil, writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList", "The value "+id+" for the property Links/Drives is not in the list of acceptable values.", id, "Links/Drives")
		}
		if used[normPath(id)] {
			return nil, writeError(w, http.StatusBadRequest, "Base.1.8.ResourceInUse", "The change to the requested resource failed because the resource is in use or in transition.", id)
		}
		drives = append(drives, map[string]any{"@odata.id": id})
	}
	return drives, 0
}

// deleteVolumeLocked handles DELETE of a Volume.
func (s *Server) deleteVolumeLocked(w http.ResponseWriter, p string) int {
	n := s.nodeLocked(p)
	if n == nil {
		return writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "The resource at the URI "+p+" was not found.")
	}
	coll := path.Dir(p)
	s.over[p] = nil
	s.mutateLocked(coll, func(b map[string]any) {
		var ms []any
		for _, m := range anySlice(b["Members"]) {
			if normPath(odataID(m)) != p {
				ms = append(ms, m)
			}
		}
		if ms == nil {
			ms = []any{}
		}
		b["Members"], b["Members@odata.count"] = ms, len(ms)
	})
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

func isVolume(b map[string]any) bool {
	return strings.Contains(stringOf(b["@odata.type"]), "#Volume.")
}
