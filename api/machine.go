package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/state"
)

// DeployPlanner fills the deploy plan of a server that is deploying: image
// URL (absolute, as the machine reaches it), raw SHA-256 and size, root
// device hint and NoCloud seed. Tokens are added by the endpoint. It
// returns an error when the plan cannot be made (image not imported yet).
type DeployPlanner interface {
	DeployPlan(ctx context.Context, srv state.Server) (v1.Plan, error)
}

// WipePlanner names the disk a release wipe clears: the server's root
// device hint (the disk its deploy wrote). The zero hint means every
// eligible disk. An error answers 503 and the ramdisk retries.
type WipePlanner interface {
	WipeHint(ctx context.Context, srv state.Server) (v1.RootDeviceHint, error)
}

// MachineConfig configures the machine-facing endpoints of api/v1/agent.go.
type MachineConfig struct {
	// Store holds servers and tokens. Required.
	Store *state.Store
	// Planner makes deploy plans. Required for deploys; nil answers 503.
	Planner DeployPlanner
	// Wiper names the disk of a release wipe; nil wipes every eligible disk.
	Wiper WipePlanner
	// Installer backs the installer path (autoinstall, kickstart); nil
	// answers its routes 503.
	Installer InstallerSource
	// PerIP limits requests per client IP; zero means a burst of 30
	// refilled one per 100 ms.
	PerIP boot.Limit
	// ImageTokenTTL bounds the reusable image token; zero means 2 hours
	// (a two-pass write of a large image under emulation takes a while).
	ImageTokenTTL time.Duration
	// Logger: nil discards.
	Logger *slog.Logger
}

// Machine serves the machine-facing endpoints the ramdisk agent uses:
// report, payload, plan and done, and the release wipe's wipe and wiped
// (paths in api/v1). Each is gated by a
// token from the store, bound to the server (and its boot MAC) and to a
// purpose, single-use except the payload check and the image token. Bodies
// are size-limited and strictly decoded; a refused request is answered 4xx
// with an event and changes nothing.
type Machine struct {
	cfg MachineConfig
	log *slog.Logger
	lim *boot.Limiter
}

// NewMachine checks cfg and returns the endpoints; mount them with Mount.
func NewMachine(cfg MachineConfig) (*Machine, error) {
	if cfg.Store == nil {
		return nil, errors.New("api: MachineConfig.Store is required")
	}
	if cfg.PerIP.Burst == 0 {
		cfg.PerIP = boot.Limit{Burst: 30, Every: 100 * time.Millisecond}
	}
	if cfg.ImageTokenTTL <= 0 {
		cfg.ImageTokenTTL = 2 * time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Machine{cfg: cfg, log: cfg.Logger, lim: boot.NewLimiter(cfg.PerIP)}, nil
}

// Mount registers the endpoints on srv as public routes (they check their
// own tokens).
func (m *Machine) Mount(srv *Server) error {
	for pattern, h := range map[string]http.HandlerFunc{
		"POST " + v1.PathAgentReport: m.report,
		"GET " + v1.PathAgentPayload: m.payload,
		"GET " + v1.PathAgentPlan:    m.plan,
		"POST " + v1.PathAgentDone:   m.done,
		"GET " + v1.PathAgentWipe:    m.wipePlan,
		"POST " + v1.PathAgentWiped:  m.wiped,
	} {
		if err := srv.HandlePublic(pattern, m.limited(h)); err != nil {
			return err
		}
	}
	return m.mountInstaller(srv)
}

func (m *Machine) limited(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ip, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			ip = r.RemoteAddr
		}
		if ok, wait := m.lim.Allow(ip); !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())+1))
			writeError(w, http.StatusTooManyRequests, v1.Error{Message: "rate limited", Code: "rate_limited"})
			return
		}
		h(w, r)
	}
}

func bearer(r *http.Request) string {
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return strings.TrimSpace(tok)
}

// refuse answers a token refusal; the store already wrote its event.
func (m *Machine) refuse(w http.ResponseWriter, r *http.Request, err error) {
	// The route pattern, not the path: installer URLs carry their token
	// in the path, and tokens never reach a log.
	m.log.Warn("machine request refused", "route", r.Pattern, "remote", r.RemoteAddr, "err", err)
	writeError(w, http.StatusForbidden, v1.Error{Message: "token refused", Code: "token_refused"})
}

func (m *Machine) bad(w http.ResponseWriter, r *http.Request, server string, code int, what string) {
	_, _ = m.cfg.Store.AppendEvent(state.Event{Server: server, Kind: "machine.refused", Actor: state.ActorController,
		Message: fmt.Sprintf("%s refused: %s", r.Pattern, what)})
	writeError(w, code, v1.Error{Message: what, Code: "bad_request"})
}

// decodeStrict reads at most limit bytes of JSON into v: unknown fields,
// trailing data and oversize bodies are refused.
func decodeStrict(r *http.Request, limit int64, v any) (int, error) {
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return http.StatusBadRequest, errors.New("read body")
	}
	if int64(len(b)) > limit {
		return http.StatusRequestEntityTooLarge, fmt.Errorf("body over %d bytes", limit)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return http.StatusBadRequest, errors.New("malformed JSON")
	}
	// dec.More is false before a stray '}' or ']': only io.EOF from the
	// next token proves there is nothing after the value.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return http.StatusBadRequest, errors.New("trailing data")
	}
	return 0, nil
}

// report takes the commissioning report: the body is checked before the
// token is consumed, so a malformed report can be sent again; then the
// server moves commissioning → ready (tests passed) or failed, with its
// hardware facts, in one transaction.
func (m *Machine) report(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r)
	t, err := m.cfg.Store.CheckToken(tok, state.TokenClaim{Purpose: state.PurposeReport})
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	var rep v1.AgentReport
	if code, err := decodeStrict(r, v1.MaxReportBytes, &rep); err != nil {
		m.bad(w, r, t.Server, code, "report: "+err.Error())
		return
	}
	if _, err := m.cfg.Store.ConsumeToken(tok, state.TokenClaim{Purpose: state.PurposeReport, Server: t.Server}); err != nil {
		m.refuse(w, r, err)
		return
	}
	ack := v1.ReportAck{Lifecycle: string(state.LifecycleReady)}
	if !rep.Passed() {
		ack.Lifecycle = string(state.LifecycleFailed)
		ack.Reason = "no commissioning test ran"
		for _, tr := range rep.Tests {
			if !tr.Passed {
				ack.Reason = tr.Name + " test failed: " + tr.Reason
				break
			}
		}
	}
	hw := hardwareFrom(rep.Facts)
	_, err = m.cfg.Store.Apply(state.Move{Server: t.Server, From: state.LifecycleCommissioning, To: state.Lifecycle(ack.Lifecycle),
		Reason: "commissioning report: " + orPassed(ack.Reason), Update: func(s *state.Server) error {
			s.Hardware = hw
			s.LastError = ack.Reason
			// NeedsWipe stays: commissioning reads the disks but does not
			// wipe them, so a released server still gets its wipe.
			return nil
		}})
	if err != nil {
		var te *state.TransitionError
		if errors.As(err, &te) {
			writeError(w, http.StatusConflict, v1.Error{Message: "server is not commissioning", Code: "conflict", Lifecycle: string(te.Current)})
			return
		}
		m.log.Error("store report", "server", t.Server, "err", err)
		writeError(w, http.StatusInternalServerError, v1.Error{Message: "internal error", Code: "internal"})
		return
	}
	_, _ = m.cfg.Store.SetPower(t.Server, state.PowerOff, state.PowerSourceCommand) // the agent powers off after its report
	m.log.Info("commissioning report", "machine", t.Server, "lifecycle", ack.Lifecycle, "reason", ack.Reason)
	writeJSON(w, http.StatusOK, ack)
}

func orPassed(reason string) string {
	if reason == "" {
		return "all tests passed"
	}
	return reason
}

// hardwareFrom summarises the agent's facts for the store.
func hardwareFrom(f v1.Facts) *state.Hardware {
	hw := &state.Hardware{Cores: f.CPU.Cores, MemoryBytes: f.Memory.TotalBytes, Vendor: f.DMI.SystemVendor, Product: f.DMI.SystemProduct,
		Serial: f.DMI.SystemSerial, ObservedAt: time.Now().UTC(), CPUVendor: f.CPU.Vendor, Arch: f.CPU.Arch}
	for _, d := range f.Memory.DIMMs {
		hw.InstalledMemoryBytes += d.SizeBytes
	}
	for _, g := range f.GPUs {
		hw.GPUs = append(hw.GPUs, state.GPU{PCIAddress: g.PCIAddress, Vendor: g.Vendor, DeviceID: g.DeviceID})
	}
	for _, d := range f.Disks {
		hw.Disks = append(hw.Disks, state.Disk{Name: d.Name, SizeBytes: d.SizeBytes, Model: d.Model, Serial: d.Serial, Rotational: d.Rotational, Transport: d.Transport})
	}
	for _, n := range f.NICs {
		hw.NICs = append(hw.NICs, state.NIC{Name: n.Name, MAC: n.MAC, SpeedMbps: n.SpeedMbps, Link: n.Link})
	}
	return hw
}

// payload serves pseudo-random bytes for the network throughput test to
// the holder of a valid (not consumed) commissioning token.
func (m *Machine) payload(w http.ResponseWriter, r *http.Request) {
	if _, err := m.cfg.Store.CheckToken(bearer(r), state.TokenClaim{Purpose: state.PurposeReport}); err != nil {
		m.refuse(w, r, err)
		return
	}
	n, err := strconv.ParseInt(r.URL.Query().Get("bytes"), 10, 64)
	if err != nil || n < 0 || n > v1.MaxPayloadBytes {
		writeError(w, http.StatusBadRequest, v1.Error{Message: fmt.Sprintf("bytes must be 0 to %d", v1.MaxPayloadBytes), Code: "bad_request"})
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	buf := make([]byte, 64<<10)
	_, _ = rand.Read(buf)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		n -= k
	}
}

// plan answers the deploy plan, consuming the deploy token and minting a
// reusable image token and a single-use done token bound to the server.
func (m *Machine) plan(w http.ResponseWriter, r *http.Request) {
	t, err := m.cfg.Store.ConsumeToken(bearer(r), state.TokenClaim{Purpose: state.PurposePlan})
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	srv, err := m.cfg.Store.Server(t.Server)
	if err != nil || srv.Lifecycle != state.LifecycleDeploying {
		writeError(w, http.StatusConflict, v1.Error{Message: "server is not deploying", Code: "conflict", Lifecycle: string(srv.Lifecycle)})
		return
	}
	if m.cfg.Planner == nil {
		writeError(w, http.StatusServiceUnavailable, v1.Error{Message: "no deploy planner configured", Code: "unavailable"})
		return
	}
	p, err := m.cfg.Planner.DeployPlan(r.Context(), srv)
	if err != nil {
		m.log.Error("deploy plan", "machine", srv.Name, "err", err)
		_, _ = m.cfg.Store.AppendEvent(state.Event{Server: srv.Name, Kind: "deploy.plan_failed", Message: err.Error()})
		writeError(w, http.StatusServiceUnavailable, v1.Error{Message: "deploy plan unavailable: " + err.Error(), Code: "unavailable"})
		return
	}
	if p.ImageToken, _, err = m.cfg.Store.IssueToken(state.TokenSpec{Purpose: state.PurposeImage, Server: srv.Name, MAC: srv.BootMAC, TTL: m.cfg.ImageTokenTTL, Reusable: true}); err == nil {
		p.DoneToken, _, err = m.cfg.Store.IssueToken(state.TokenSpec{Purpose: state.PurposeDone, Server: srv.Name, MAC: srv.BootMAC, TTL: m.cfg.ImageTokenTTL})
	}
	if err != nil {
		m.log.Error("issue deploy tokens", "machine", srv.Name, "err", err)
		writeError(w, http.StatusInternalServerError, v1.Error{Message: "internal error", Code: "internal"})
		return
	}
	m.log.Info("deploy plan served", "machine", srv.Name, "image", p.ImageURL)
	writeJSON(w, http.StatusOK, p)
}

// done takes the deploy outcome: deploying → deployed (the executor then
// sets the boot override to disk) or failed with the ramdisk's reason.
func (m *Machine) done(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r)
	t, err := m.cfg.Store.CheckToken(tok, state.TokenClaim{Purpose: state.PurposeDone})
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	var res v1.DeployResult
	if code, err := decodeStrict(r, v1.MaxDoneBytes, &res); err != nil {
		m.bad(w, r, t.Server, code, "done: "+err.Error())
		return
	}
	if _, err := m.cfg.Store.ConsumeToken(tok, state.TokenClaim{Purpose: state.PurposeDone, Server: t.Server}); err != nil {
		m.refuse(w, r, err)
		return
	}
	reason := fmt.Sprintf("image written to %s (%d bytes, sha256 %s)", res.DiskName, res.BytesWritten, res.SHA256)
	if !res.OK {
		reason = "deploy failed: " + res.Reason
	}
	m.deployOutcome(w, t.Server, res.OK, reason)
}

// deployOutcome moves server deploying → deployed (ok: FinishDeploy set, so
// the executor sets the boot override to disk and reads it back) or →
// failed with reason, and answers 204; 409 when the server is no longer
// deploying. The image deploy's done and the installer's callback share it.
func (m *Machine) deployOutcome(w http.ResponseWriter, server string, ok bool, reason string) {
	to := state.LifecycleDeployed
	if !ok {
		to = state.LifecycleFailed
	}
	_, err := m.cfg.Store.Apply(state.Move{Server: server, From: state.LifecycleDeploying, To: to, Reason: reason, Update: func(s *state.Server) error {
		if ok {
			s.FinishDeploy, s.NeedsWipe, s.LastError = true, false, ""
		} else {
			s.LastError, s.Allocation = reason, nil
		}
		return nil
	}})
	if err != nil {
		var te *state.TransitionError
		if errors.As(err, &te) {
			writeError(w, http.StatusConflict, v1.Error{Message: "server is not deploying", Code: "conflict", Lifecycle: string(te.Current)})
			return
		}
		writeError(w, http.StatusInternalServerError, v1.Error{Message: "internal error", Code: "internal"})
		return
	}
	m.log.Info("deploy outcome", "machine", server, "lifecycle", to, "reason", reason)
	w.WriteHeader(http.StatusNoContent)
}

// errNotWiping refuses a wipe request for a server that is not a released
// server waiting for its wipe.
var errNotWiping = errors.New("server is not waiting for a release wipe")

// wipePlan answers the release wipe plan to the ramdisk booted in wipe
// mode, consuming the wipe token and minting the single-use wiped token.
func (m *Machine) wipePlan(w http.ResponseWriter, r *http.Request) {
	t, err := m.cfg.Store.ConsumeToken(bearer(r), state.TokenClaim{Purpose: state.PurposeWipe})
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	srv, err := m.cfg.Store.Server(t.Server)
	if err != nil || srv.Lifecycle != state.LifecycleReady || !srv.NeedsWipe {
		writeError(w, http.StatusConflict, v1.Error{Message: errNotWiping.Error(), Code: "conflict", Lifecycle: string(srv.Lifecycle)})
		return
	}
	var plan v1.WipePlan
	if m.cfg.Wiper != nil {
		if plan.RootDevice, err = m.cfg.Wiper.WipeHint(r.Context(), srv); err != nil {
			m.log.Error("wipe plan", "machine", srv.Name, "err", err)
			writeError(w, http.StatusServiceUnavailable, v1.Error{Message: "wipe plan unavailable: " + err.Error(), Code: "unavailable"})
			return
		}
	}
	plan.DoneToken, _, err = m.cfg.Store.IssueToken(state.TokenSpec{Purpose: state.PurposeWiped, Server: srv.Name, MAC: srv.BootMAC, TTL: m.cfg.ImageTokenTTL})
	if err != nil {
		m.log.Error("issue wiped token", "machine", srv.Name, "err", err)
		writeError(w, http.StatusInternalServerError, v1.Error{Message: "internal error", Code: "internal"})
		return
	}
	m.log.Info("wipe plan served", "machine", srv.Name)
	writeJSON(w, http.StatusOK, plan)
}

// wiped takes the release wipe's outcome. A good wipe clears NeedsWipe (the
// server may be allocated again) and records the power off the agent does
// next; a failed one is counted (WipeFailures, WipeFailedAt, LastError) and
// the plan retries it after a doubling delay.
func (m *Machine) wiped(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r)
	t, err := m.cfg.Store.CheckToken(tok, state.TokenClaim{Purpose: state.PurposeWiped})
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	var res v1.WipeResult
	if code, err := decodeStrict(r, v1.MaxDoneBytes, &res); err != nil {
		m.bad(w, r, t.Server, code, "wiped: "+err.Error())
		return
	}
	if _, err := m.cfg.Store.ConsumeToken(tok, state.TokenClaim{Purpose: state.PurposeWiped, Server: t.Server}); err != nil {
		m.refuse(w, r, err)
		return
	}
	reason := fmt.Sprintf("release wipe done: partition tables and signatures cleared on %s", strings.Join(res.Disks, ", "))
	if !res.OK {
		reason = "release wipe failed: " + res.Reason
	}
	now := time.Now().UTC()
	_, err = m.cfg.Store.UpdateServer(t.Server, func(s *state.Server) error {
		if s.Lifecycle != state.LifecycleReady || !s.NeedsWipe {
			return errNotWiping
		}
		s.WipeStartedAt = time.Time{}
		if res.OK {
			s.NeedsWipe, s.WipeFailures, s.WipeFailedAt, s.LastError = false, 0, time.Time{}, ""
		} else {
			s.WipeFailures++
			s.WipeFailedAt, s.LastError = now, reason
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, errNotWiping) {
			writeError(w, http.StatusConflict, v1.Error{Message: errNotWiping.Error(), Code: "conflict"})
			return
		}
		writeError(w, http.StatusInternalServerError, v1.Error{Message: "internal error", Code: "internal"})
		return
	}
	kind := state.EventKind("wipe.done")
	if !res.OK {
		kind = "wipe.failed"
	}
	_, _ = m.cfg.Store.AppendEvent(state.Event{Server: t.Server, Kind: kind, Actor: state.ActorController, Message: reason})
	_, _ = m.cfg.Store.SetPower(t.Server, state.PowerOff, state.PowerSourceCommand) // the agent powers off after the wipe
	m.log.Info("wipe outcome", "machine", t.Server, "ok", res.OK, "reason", reason)
	w.WriteHeader(http.StatusNoContent)
}
