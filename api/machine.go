package api

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/machina-metal/machina/internal/httpstatus"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/attestation"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/macaddr"
	"github.com/machina-metal/machina/schema"
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
	// PerToken limits requests per bearer token (keyed by a hash of it,
	// never the value), after PerIP: a token's holder cannot spend more
	// than this however many source addresses it sends from; zero means
	// PerIP's limit.
	PerToken boot.Limit
	// ImageTokenTTL bounds the reusable image token; zero means 2 hours
	// (a two-pass write of a large image under emulation takes a while).
	ImageTokenTTL time.Duration
	// Leases, when set (Machina serves DHCP), binds the machine requests
	// to the address leased to the server's boot MAC: a report, plan,
	// done or wiped from another source address is refused (403, with an
	// event). A MAC without a live lease is not checked. The
	// controller keeps the leases in the state file, so the check holds
	// across a restart.
	Leases LeaseLookup
	// ProgressEvery is how often the ramdisk reports a long deploy step's
	// progress (v1.Plan.ProgressEvery, PathAgentProgress); zero means 20
	// seconds. Keep it well below the plan's SilentAfter: only a report
	// whose bytes advanced counts as hearing from the machine. A server's
	// reports closer together than half of it are answered 429 and
	// dropped, so a machine cannot write its record faster than that.
	ProgressEvery time.Duration
	// SilentAfter is the plan's silent-machine window (the reconciler's
	// plan.Options.SilentAfter), told to the agent in v1.Plan.SilentAfter
	// so it ends its image and piece retries within it and reports why;
	// zero means 5 minutes, the plan's default.
	SilentAfter time.Duration
	// Attest verifies TPM attestations (api/attest.go); nil means one with
	// attestation.Config's defaults (no vendor CAs).
	Attest *attestation.Verifier
	// AttestPolicy gives each server's attestation rule; nil means
	// optional for every server, with no EK pinned.
	AttestPolicy AttestPolicy
	// Pieces counts the image bytes agents report fetching from the
	// controller and from wave peers, and bad pieces (pieces.go); nil
	// counts nothing (bad-piece events are written either way).
	Pieces *PieceMetrics
	// Logger: nil discards.
	Logger *slog.Logger
}

// LeaseLookup returns the address leased to a MAC; *dhcp.MemLeases
// implements it.
type LeaseLookup interface {
	LeasedIP(mac string) (netip.Addr, bool)
}

// eventMachineRefused is the event kind of a refused machine request that
// carried a known token (wrong address, bad body); the store paces them
// (state.Store.RecordRefusal): one event at once, then one summary per
// interval, whatever the request rate.
const eventMachineRefused state.EventKind = "machine.refused"

// wrongAddress refuses (403, with a paced event) a request for server from an
// address other than the one leased to its boot MAC.
func (m *Machine) wrongAddress(w http.ResponseWriter, r *http.Request, server string) bool {
	if m.cfg.Leases == nil || server == "" {
		return false
	}
	srv, err := m.cfg.Store.Server(server)
	if err != nil || srv.BootMAC == "" {
		return false
	}
	leased, ok := m.cfg.Leases.LeasedIP(srv.BootMAC)
	if !ok {
		return false
	}
	from, err := netip.ParseAddr(remoteIP(r))
	if err == nil && from.Unmap() == leased.Unmap() {
		return false
	}
	m.cfg.Store.RecordRefusal(server, eventMachineRefused, state.RefusalWrongAddress,
		fmt.Sprintf("%s refused: request from %s, but %s is leased to %s", r.Pattern, remoteIP(r), leased, srv.BootMAC))
	writeError(w, http.StatusForbidden, v1.Error{Message: "request not from the address leased to this machine", Code: "token_refused"})
	return true
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
	// tokLim is PerToken's limiter, keyed by perTokenKey.
	tokLim *boot.Limiter
	// progressMu guards progressAt: when each server's last progress
	// report was taken (one entry per server that holds a valid image
	// token, so bounded by the fleet).
	progressMu sync.Mutex
	progressAt map[string]time.Time
	att        attestState
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
	if cfg.PerToken.Burst == 0 {
		cfg.PerToken = cfg.PerIP
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 20 * time.Second
	}
	if cfg.SilentAfter <= 0 {
		cfg.SilentAfter = 5 * time.Minute
	}
	if cfg.Attest == nil {
		cfg.Attest = attestation.New(attestation.Config{})
	}
	return &Machine{cfg: cfg, log: cfg.Logger, lim: boot.NewLimiter(cfg.PerIP), tokLim: boot.NewLimiter(cfg.PerToken),
		progressAt: map[string]time.Time{}, att: attestState{v: cfg.Attest, ref: map[string]int64{}}}, nil
}

// Mount registers the endpoints on srv as public routes (they check their
// own tokens).
func (m *Machine) Mount(srv *Server) error {
	for pattern, h := range map[string]http.HandlerFunc{
		"POST " + v1.PathAgentReport:      m.report,
		"GET " + v1.PathAgentPayload:      m.payload,
		"GET " + v1.PathAgentPlan:         m.plan,
		"POST " + v1.PathAgentDone:        m.done,
		"GET " + v1.PathAgentWipe:         m.wipePlan,
		"POST " + v1.PathAgentWiped:       m.wiped,
		"POST " + v1.PathAgentProgress:    m.progress,
		"POST " + v1.PathAgentAttest:      m.attestBegin,
		"POST " + v1.PathAgentAttestQuote: m.attestQuote,
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
		ok, wait := m.lim.Allow(ip)
		if ok {
			// Per token after per address: the address limit bounds how
			// fast made-up tokens can create limiter entries.
			if tok := bearer(r); tok != "" {
				ok, wait = m.tokLim.Allow(perTokenKey(tok))
			}
		}
		if !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())+1))
			writeError(w, http.StatusTooManyRequests, v1.Error{Message: "rate limited", Code: "rate_limited"})
			return
		}
		h(w, r)
	}
}

// perTokenKey is the per-token limiter's key for a bearer value: the first 16
// bytes of its SHA-256, so limiter memory never holds a token.
func perTokenKey(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return string(h[:16])
}

func bearer(r *http.Request) string {
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return strings.TrimSpace(tok)
}

// refuse answers a token refusal; the store already wrote its event.
//
// A token check that failed because the store did not answer (etcd cut
// off or too slow, this controller no longer the leader) is no refusal:
// it answers 503 with Retry-After, so the machine retries and reaches the
// leader at the VIP, instead of giving up on a valid token.
func (m *Machine) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if storeUnavailable(err) {
		m.log.Warn("machine request: store unavailable", "route", r.Pattern, "err", err)
		unavailable(w)
		return
	}
	// The route pattern, not the path: installer URLs carry their token
	// in the path, and tokens never reach a log.
	// Debug, not Warn: a refused token is an event (a known token) or a
	// count (an unknown one), never a log line per request at the default
	// level, so a flood does not rotate the logs away.
	m.log.Debug("machine request refused", "route", r.Pattern, "remote", r.RemoteAddr, "err", err)
	writeError(w, http.StatusForbidden, v1.Error{Message: "token refused", Code: "token_refused"})
}

func (m *Machine) bad(w http.ResponseWriter, r *http.Request, server string, code int, what string) {
	m.cfg.Store.RecordRefusal(server, eventMachineRefused, state.RefusalBadRequest, fmt.Sprintf("%s refused: %s", r.Pattern, what))
	writeError(w, code, v1.Error{Message: what, Code: "bad_request"})
}

// readStrict reads at most limit bytes of JSON into v and returns them:
// unknown fields, trailing data, a JSON null (anything but an object) and
// oversize bodies are refused.
func readStrict(r *http.Request, limit int64, v any) ([]byte, int, error) {
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, http.StatusBadRequest, errors.New("read body")
	}
	if int64(len(b)) > limit {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("body over %d bytes", limit)
	}
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
		// null (which decodes into a struct as "no change"), a bare value
		// or an empty body: the machine endpoints take objects only.
		return nil, http.StatusBadRequest, errors.New("body is not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return nil, http.StatusBadRequest, errors.New("malformed JSON")
	}
	// dec.More is false before a stray '}' or ']': only io.EOF from the
	// next token proves there is nothing after the value.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, http.StatusBadRequest, errors.New("trailing data")
	}
	return b, 0, nil
}

// remoteIP is the request's source address without the port.
func remoteIP(r *http.Request) string {
	ip, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return ip
}

// fingerprint identifies a machine request for a token's retry: the
// source address, the route and the body (which carries the boot MAC).
func fingerprint(r *http.Request, body []byte) [32]byte {
	return state.RequestFingerprint([]byte(remoteIP(r)), []byte(r.Pattern), body)
}

// use runs effect as the single use of the request's token (state.UseToken)
// and writes the answer: the recorded one on a retry of the same request.
// A refused token answers 403; an effect's *answerError its status; any
// other error 500. Nothing is consumed unless the answer is 2xx.
func (m *Machine) use(w http.ResponseWriter, r *http.Request, token string, purpose state.Purpose, body []byte, rerun bool, effect func(tx *state.Tx, t state.Token) (state.Answer, error)) {
	var server string // the token's server, for a refused effect's event
	if effect != nil {
		inner := effect
		effect = func(tx *state.Tx, t state.Token) (state.Answer, error) {
			server = t.Server
			return inner(tx, t)
		}
	}
	tok, ans, replayed, err := m.cfg.Store.UseToken(token, state.TokenUse{Claim: state.TokenClaim{Purpose: purpose},
		Request: fingerprint(r, body), Effect: effect, Rerun: rerun})
	var ae *answerError
	switch {
	case errors.As(err, &ae):
		if ae.event != "" {
			m.cfg.Store.RecordRefusal(server, eventMachineRefused, state.RefusalBadRequest, ae.event)
		}
		writeError(w, ae.status, ae.body)
		return
	case isTokenRefusal(err):
		m.refuse(w, r, err)
		return
	case storeUnavailable(err):
		// HA: this controller lost leadership mid-request, or its store
		// (etcd) did not answer in time; the machine's retry reaches the
		// new leader at the provisioning VIP.
		m.log.Warn("machine request refused: not the leader", "route", r.Pattern)
		unavailable(w)
		return
	case err != nil:
		m.log.Error("machine request", "route", r.Pattern, "err", err)
		writeError(w, http.StatusInternalServerError, v1.Error{Message: "internal error", Code: "internal"})
		return
	}
	if replayed {
		m.log.Info("machine request retried: same answer", "route", r.Pattern, "machine", tok.Server)
	}
	fault(faultAfterUse)
	if ans.Status == http.StatusNoContent || len(ans.Body) == 0 {
		w.WriteHeader(ans.Status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ans.Status)
	_, _ = w.Write(ans.Body)
}

// readFailed answers 503 with Retry-After (and reports true) when err is a
// failed read of the state store rather than a missing record: a
// controller that lost its store (etcd unreachable, a deposed leader
// still draining) must never give a machine a definitive refusal such as
// 409 "server is not deploying", which makes the agent stop (seen in
// lab/sim TestHATwoControllersFailover: the deposed leader's failed etcd
// read answered a deploying machine's plan GET with 409, and the server
// stayed deploying with its machine powered off). ErrNotFound and nil
// report false.
func (m *Machine) readFailed(w http.ResponseWriter, r *http.Request, err error) bool {
	if err == nil || errors.Is(err, state.ErrNotFound) {
		return false
	}
	m.log.Warn("machine request: state store read failed", "route", r.Pattern, "err", err)
	unavailable(w)
	return true
}

// unavailable is the API's answer to a store that could not decide (this
// controller is not the leader, or its store did not answer): 503 with
// Retry-After, which the agent and machinactl retry (under HA the retry
// reaches the new leader through the VIP or the admin API's forwarding).
func unavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "2")
	writeError(w, http.StatusServiceUnavailable, v1.Error{Message: "not the leader, or the state store did not answer; retry", Code: v1.CodeUnavailable})
}

// storeUnavailable reports whether err says the store could not decide
// (rather than refused): this controller is no longer the leader, an etcd
// request timed out, a commit's outcome is unknown, or the store closed.
func storeUnavailable(err error) bool {
	for _, e := range []error{state.ErrNotLeader, context.DeadlineExceeded, state.ErrCommitUncertain, state.ErrClosed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func isTokenRefusal(err error) bool {
	for _, e := range []error{state.ErrTokenUnknown, state.ErrTokenExpired, state.ErrTokenUsed, state.ErrTokenMismatch} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// answerError is an effect's refusal: it rolls the token's use back and
// answers status with body (event, when set, is recorded after).
type answerError struct {
	status int
	body   v1.Error
	event  string
}

func (e *answerError) Error() string { return e.body.Message }

// conflictFrom turns a refused lifecycle move into a 409 answer.
func conflictFrom(err error, what string) error {
	var te *state.TransitionError
	if errors.As(err, &te) {
		return &answerError{status: http.StatusConflict, body: v1.Error{Message: what, Code: "conflict", Lifecycle: string(te.Current)}}
	}
	return err
}

func jsonAnswer(status int, v any) (state.Answer, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return state.Answer{}, err
	}
	return state.Answer{Status: status, Body: b}, nil
}

// heard records what the machine just did on s (inside the effect's
// transaction).
func heard(s *state.Server, what string) {
	s.LastHeard, s.LastHeardAt = what, time.Now().UTC()
}

// report takes the commissioning report: the body is decoded and checked
// (well formed, every commissioning test present, facts within bounds)
// before the token is used, so a malformed report consumes nothing; then,
// in the transaction that uses the token, the server moves commissioning
// → ready (tests passed) or failed with its hardware facts, and the answer
// is recorded: a retry of the same report gets the same answer.
func (m *Machine) report(w http.ResponseWriter, r *http.Request) {
	t, err := m.cfg.Store.PeekToken(bearer(r), state.TokenClaim{Purpose: state.PurposeReport})
	if err != nil {
		m.use(w, r, bearer(r), state.PurposeReport, nil, false, nil) // refused and counted (paced event)
		return
	}
	if m.wrongAddress(w, r, t.Server) || m.attestGate(w, t) {
		return
	}
	var rep v1.AgentReport
	body, code, err := readStrict(r, v1.MaxReportBytes, &rep)
	if err == nil {
		// The schema in the repository (schema/agent-report.schema.json)
		// is the gate; checkReport says the same rules in Go with the
		// message an operator reads.
		err = checkReportSchema(body)
		if cerr := checkReport(rep); cerr != nil {
			err = cerr
		}
		code = http.StatusBadRequest
	}
	if err != nil {
		m.bad(w, r, t.Server, code, "report: "+err.Error())
		return
	}
	ack := v1.ReportAck{Lifecycle: string(state.LifecycleReady)}
	if !rep.Passed() {
		ack.Lifecycle = string(state.LifecycleFailed)
		for _, tr := range rep.Tests {
			if !tr.Passed {
				ack.Reason = tr.Name + " test failed: " + tr.Reason
				break
			}
		}
	}
	hw := hardwareFrom(rep.Facts)
	m.use(w, r, bearer(r), state.PurposeReport, body, false, func(tx *state.Tx, t state.Token) (state.Answer, error) {
		_, err := tx.Apply(state.Move{Server: t.Server, From: state.LifecycleCommissioning, To: state.Lifecycle(ack.Lifecycle),
			Reason: "commissioning report: " + orPassed(ack.Reason), Update: func(s *state.Server) error {
				s.Hardware = hw
				s.LastError = ack.Reason
				heard(s, "commissioning report")
				// NeedsWipe stays: commissioning reads the disks but does not
				// wipe them, so a released server still gets its wipe.
				return nil
			}})
		if err != nil {
			return state.Answer{}, conflictFrom(err, "server is not commissioning")
		}
		// The agent powers off after its report; the plan confirms it
		// through the BMC (state.PowerSourceAgent).
		if _, err := tx.SetPower(t.Server, state.PowerOff, state.PowerSourceAgent); err != nil {
			return state.Answer{}, err
		}
		m.log.Info("commissioning report", "machine", t.Server, "lifecycle", ack.Lifecycle, "reason", ack.Reason)
		return jsonAnswer(http.StatusOK, ack)
	})
}

// Bounds of a commissioning report's facts: beyond them a report is not
// from a machine (ErrInvalid-style 400, the token unused).
const (
	maxReportCores  = 4096
	maxReportMemory = 64 << 40 // 64 TiB
	maxReportDisks  = 256
	maxReportDisk   = 1 << 50 // 1 PiB per disk
	maxReportNICs   = 256
)

// checkReportSchema checks a report body against the commissioning report
// schema (schema.AgentReport, schema/agent-report.schema.json): the four
// tests each once, the facts within their bounds, a passed disk test only
// with a disk that is not virtual. The error names the first violations.
func checkReportSchema(body []byte) error {
	v, err := schema.Default()
	if err != nil {
		return err
	}
	vs, err := v.ValidateJSON(schema.AgentReport, body)
	if err != nil {
		return errors.New("malformed JSON")
	}
	if len(vs) == 0 {
		return nil
	}
	var msgs []string
	for i, viol := range vs {
		if i == 3 {
			msgs = append(msgs, fmt.Sprintf("and %d more", len(vs)-3))
			break
		}
		msgs = append(msgs, cmp.Or(viol.Pointer, "/")+": "+viol.Detail)
	}
	return fmt.Errorf("not a commissioning report (%s): %s", schema.AgentReport.FileName(), strings.Join(msgs, "; "))
}

// checkReport refuses a report that is not well formed: a boot MAC that
// is not one, a test missing, unknown or repeated, facts out of bounds, or
// a disk test that passed on a machine with no disk.
func checkReport(rep v1.AgentReport) error {
	if _, err := macaddr.Normalize(rep.BootMAC); err != nil {
		return fmt.Errorf("bootMAC %q is not a MAC address", rep.BootMAC)
	}
	seen := map[string]bool{}
	diskPassed := false
	for _, tr := range rep.Tests {
		switch tr.Name {
		case v1.TestCPU, v1.TestMemory, v1.TestDisk, v1.TestNetwork:
		default:
			return fmt.Errorf("tests: unknown test %q (want %s, %s, %s, %s)", tr.Name, v1.TestCPU, v1.TestMemory, v1.TestDisk, v1.TestNetwork)
		}
		if seen[tr.Name] {
			return fmt.Errorf("tests: %s reported twice", tr.Name)
		}
		seen[tr.Name] = true
		if tr.Name == v1.TestDisk && tr.Passed {
			diskPassed = true
		}
	}
	for _, name := range []string{v1.TestCPU, v1.TestMemory, v1.TestDisk, v1.TestNetwork} {
		if !seen[name] {
			return fmt.Errorf("tests: %s test missing (a report carries all four: cpu, memory, disk, network)", name)
		}
	}
	f := rep.Facts
	if f.CPU.Cores < 1 || f.CPU.Cores > maxReportCores {
		return fmt.Errorf("facts.cpu.cores %d: must be 1 to %d", f.CPU.Cores, maxReportCores)
	}
	if f.Memory.TotalBytes < 1 || f.Memory.TotalBytes > maxReportMemory {
		return fmt.Errorf("facts.memory.totalBytes %d: must be 1 to %d", f.Memory.TotalBytes, int64(maxReportMemory))
	}
	if len(f.Disks) > maxReportDisks || len(f.NICs) > maxReportNICs {
		return fmt.Errorf("facts: %d disks and %d NICs: at most %d of each", len(f.Disks), len(f.NICs), maxReportDisks)
	}
	for i, n := range f.NICs {
		if err := n.LLDP.Validate(); err != nil {
			return fmt.Errorf("facts.nics[%d].lldp: %w", i, err)
		}
	}
	real := 0
	for i, d := range f.Disks {
		if d.SizeBytes < 0 || d.SizeBytes > maxReportDisk {
			return fmt.Errorf("facts.disks[%d].sizeBytes %d: must be 0 to %d", i, d.SizeBytes, int64(maxReportDisk))
		}
		if !d.Virtual {
			real++
		}
	}
	if diskPassed && real == 0 {
		return errors.New("tests: disk test passed but facts list no disk")
	}
	return nil
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
		Serial: f.DMI.SystemSerial, ObservedAt: time.Now().UTC(), CPUVendor: f.CPU.Vendor, Arch: f.CPU.Arch, SMBIOSArch: f.CPU.SMBIOSArch}
	for _, d := range f.Memory.DIMMs {
		hw.InstalledMemoryBytes += d.SizeBytes
	}
	for _, g := range f.GPUs {
		hw.GPUs = append(hw.GPUs, state.GPU{PCIAddress: g.PCIAddress, Vendor: g.Vendor, DeviceID: g.DeviceID})
	}
	for _, d := range f.Disks {
		hw.Disks = append(hw.Disks, state.Disk{Name: d.Name, SizeBytes: d.SizeBytes, Model: d.Model, Serial: d.Serial, Rotational: d.Rotational, Transport: d.Transport, WWN: d.WWN, ByPath: d.ByPath})
	}
	for _, n := range f.NICs {
		hw.NICs = append(hw.NICs, state.NIC{Name: n.Name, MAC: n.MAC, SpeedMbps: n.SpeedMbps, Link: n.Link, Driver: n.Driver, PCIAddress: n.PCIAddress, LLDP: lldpToState(n.LLDP)})
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

// plan answers the deploy plan. The plan is made first (an image not
// imported yet answers 503 and consumes nothing, so the agent's retry
// works); then one transaction uses the plan token, mints the reusable
// image token and the single-use done token (revoking any earlier ones)
// and records the deploy's image digest and size on the server, against
// which done is checked. A retry of the same request (same source) gets
// the same plan with fresh tokens: tokens are never stored.
func (m *Machine) plan(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r)
	t, err := m.cfg.Store.PeekToken(tok, state.TokenClaim{Purpose: state.PurposePlan})
	if err != nil {
		m.use(w, r, tok, state.PurposePlan, nil, true, nil) // refused, with its event
		return
	}
	if m.wrongAddress(w, r, t.Server) || m.attestGate(w, t) {
		return
	}
	srv, err := m.cfg.Store.Server(t.Server)
	if m.readFailed(w, r, err) {
		return
	}
	if err != nil || srv.Lifecycle != state.LifecycleDeploying {
		writeError(w, http.StatusConflict, v1.Error{Message: "server is not deploying", Code: "conflict", Lifecycle: string(srv.Lifecycle)})
		return
	}
	if m.cfg.Planner == nil {
		writeError(w, http.StatusServiceUnavailable, v1.Error{Message: "no deploy planner configured", Code: "unavailable"})
		return
	}
	// The deploy is named by its plan token: the host's enrolment token
	// (in the seed) is bound to it.
	srv.Deploy = &state.DeployRecord{ID: t.ID}
	p, err := m.cfg.Planner.DeployPlan(withPeerAddr(r), srv)
	if err != nil {
		m.log.Error("deploy plan", "machine", srv.Name, "err", err)
		_, _ = m.cfg.Store.AppendEvent(state.Event{Server: srv.Name, Kind: "deploy.plan_failed", Message: err.Error()})
		writeError(w, http.StatusServiceUnavailable, v1.Error{Message: "deploy plan unavailable: " + err.Error(), Code: "unavailable"})
		return
	}
	// The agent reads the written range back and sends its digest; done
	// is checked against it.
	p.ReadBack = true
	p.ProgressEvery = m.cfg.ProgressEvery
	p.SilentAfter = m.cfg.SilentAfter
	m.use(w, r, tok, state.PurposePlan, nil, true, func(tx *state.Tx, t state.Token) (state.Answer, error) {
		cur, err := tx.Server(t.Server)
		if err != nil {
			return state.Answer{}, err
		}
		if cur.Lifecycle != state.LifecycleDeploying {
			return state.Answer{}, &answerError{status: http.StatusConflict, body: v1.Error{Message: "server is not deploying", Code: "conflict", Lifecycle: string(cur.Lifecycle)}}
		}
		out := p
		if out.ImageToken, _, err = tx.IssueToken(state.TokenSpec{Purpose: state.PurposeImage, Server: cur.Name, MAC: cur.BootMAC, TTL: m.cfg.ImageTokenTTL, Reusable: true}); err != nil {
			return state.Answer{}, err
		}
		if out.DoneToken, _, err = tx.IssueToken(state.TokenSpec{Purpose: state.PurposeDone, Server: cur.Name, MAC: cur.BootMAC, TTL: m.cfg.ImageTokenTTL}); err != nil {
			return state.Answer{}, err
		}
		if _, err := tx.UpdateServer(cur.Name, func(s *state.Server) error {
			if s.Deploy == nil || s.Deploy.ID != t.ID {
				s.Deploy = &state.DeployRecord{ID: t.ID, PlannedAt: time.Now().UTC()}
			}
			s.Deploy.ImageSHA256, s.Deploy.ImageSizeBytes, s.Deploy.ReadBack = p.ImageSHA256, p.ImageSizeBytes, p.ReadBack
			s.Deploy.Verified, s.Deploy.VerifiedAt = false, time.Time{}
			heard(s, "deploy plan fetched")
			return nil
		}); err != nil {
			return state.Answer{}, err
		}
		fault(faultPlanBeforeCommit)
		m.log.Info("deploy plan served", "machine", cur.Name, "image", p.ImageURL)
		return jsonAnswer(http.StatusOK, out)
	})
}

// checkDone compares a good done with the deploy the controller planned:
// the image digest and size, and the read-back digest when the plan asked
// for one. The reason names both values of the first that differs.
func checkDone(d *state.DeployRecord, res v1.DeployResult) error {
	switch {
	case d == nil:
		return errors.New("no deploy plan was served for this deploy")
	case !strings.EqualFold(res.SHA256, d.ImageSHA256):
		return fmt.Errorf("image sha256 %q does not match the plan's %s", res.SHA256, d.ImageSHA256)
	case res.BytesWritten != d.ImageSizeBytes:
		return fmt.Errorf("%d bytes written, the plan's image has %d", res.BytesWritten, d.ImageSizeBytes)
	case d.ReadBack && !strings.EqualFold(res.ReadBackSHA256, d.ImageSHA256):
		return fmt.Errorf("read-back sha256 %q does not match the plan's %s", res.ReadBackSHA256, d.ImageSHA256)
	}
	return nil
}

// done takes the deploy outcome: deploying → deployed (the executor then
// sets the boot override to disk) when what the agent wrote matches the
// plan (checkDone), else → failed naming both values; in the
// transaction that uses the done token, with the answer recorded.
func (m *Machine) done(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r)
	t, err := m.cfg.Store.PeekToken(tok, state.TokenClaim{Purpose: state.PurposeDone})
	if err != nil {
		m.use(w, r, tok, state.PurposeDone, nil, false, nil)
		return
	}
	if m.wrongAddress(w, r, t.Server) || m.attestGate(w, t) {
		return
	}
	var res v1.DeployResult
	body, code, err := readStrict(r, v1.MaxDoneBytes, &res)
	if err != nil {
		m.bad(w, r, t.Server, code, "done: "+err.Error())
		return
	}
	var counted *v1.PieceStats // set by the effect; counted once it committed
	sw := &httpstatus.Recorder{ResponseWriter: w}
	defer func() { m.cfg.Pieces.count(sw.Code, counted) }()
	m.use(sw, r, tok, state.PurposeDone, body, false, func(tx *state.Tx, t state.Token) (state.Answer, error) {
		srv, err := tx.Server(t.Server)
		if err != nil {
			return state.Answer{}, err
		}
		if srv.BootMAC != "" && !strings.EqualFold(res.BootMAC, srv.BootMAC) {
			return state.Answer{}, &answerError{status: http.StatusBadRequest, body: v1.Error{Message: "done: bootMAC is not this server's", Code: "bad_request"},
				event: fmt.Sprintf("done refused: bootMAC %q is not %s", res.BootMAC, srv.BootMAC)}
		}
		ok := res.OK
		reason := fmt.Sprintf("image written to %s (%d bytes, sha256 %s, read back)", res.DiskName, res.BytesWritten, res.SHA256)
		if !ok {
			reason = "deploy failed: " + res.Reason
		} else if err := checkDone(srv.Deploy, res); err != nil {
			ok, reason = false, "deploy not verified: "+err.Error()
		}
		fault(faultDoneBeforeCommit)
		if err := piecesTx(tx, t.Server, res.Pieces); err != nil {
			return state.Answer{}, err
		}
		counted = res.Pieces
		if err := deployOutcomeTx(tx, t.Server, ok, reason, true); err != nil {
			return state.Answer{}, err
		}
		m.log.Info("deploy outcome", "machine", t.Server, "ok", ok, "reason", reason)
		return state.Answer{Status: http.StatusNoContent}, nil
	})
}

// deployOutcomeTx moves server deploying → deployed (ok: FinishDeploy set,
// so the executor sets the boot override to disk and reads it back; an
// image deploy's record marked verified) or → failed with reason; a server
// no longer deploying answers 409. The image deploy's done and the
// installer's callback share it.
func deployOutcomeTx(tx *state.Tx, server string, ok bool, reason string, image bool) error {
	to := state.LifecycleDeployed
	if !ok {
		to = state.LifecycleFailed
	}
	_, err := tx.Apply(state.Move{Server: server, From: state.LifecycleDeploying, To: to, Reason: reason, Update: func(s *state.Server) error {
		heard(s, "deploy outcome")
		if ok {
			s.FinishDeploy, s.NeedsWipe, s.LastError = true, false, ""
			if image && s.Deploy != nil {
				s.Deploy.Verified, s.Deploy.VerifiedAt = true, time.Now().UTC()
			}
		} else {
			s.LastError, s.Allocation = reason, nil
		}
		return nil
	}})
	return conflictFrom(err, "server is not deploying")
}

// wipeReason is the event message and, on failure, LastError of a wipe
// outcome: each erased disk's method, bytes, duration and verified
// samples; on failure the agent's reason (the step and the disk), marked
// EraseUnsupported when a disk cannot do the method.
func wipeReason(res v1.WipeResult) string {
	var per []string
	for _, e := range res.Erased {
		per = append(per, fmt.Sprintf("%s: %s, %d bytes in %s, %d samples verified", e.Disk, e.Method, e.Bytes, e.Duration.Round(time.Millisecond), e.VerifiedSamples))
	}
	done := strings.Join(per, "; ")
	switch {
	case res.OK && len(res.Erased) == 0:
		return fmt.Sprintf("release wipe done: partition tables and signatures cleared on %s", strings.Join(res.Disks, ", "))
	case res.OK:
		return "release wipe done: erased " + done
	}
	why := "release wipe failed: "
	if res.Unsupported {
		why = "release wipe failed: EraseUnsupported: "
	}
	why += res.Reason
	if done != "" {
		why += " (erased before it: " + done + ")"
	}
	return why
}

// erasedRecords copies the wire outcomes into the server's record.
// eraseDiskList names each disk of a wipe plan with its method, for the
// log ("pci-0000:00:04.0-nvme-1 secure, ..."); "" when there are none.
func eraseDiskList(ds []v1.EraseDisk) string {
	parts := make([]string, 0, len(ds))
	for _, d := range ds {
		parts = append(parts, cmp.Or(d.Disk.ByPath, d.Disk.WWN, d.Disk.Serial, d.Disk.Name)+" "+d.Method)
	}
	return strings.Join(parts, ", ")
}

func erasedRecords(es []v1.DiskErase) []state.DiskErase {
	var out []state.DiskErase
	for _, e := range es {
		out = append(out, state.DiskErase{Disk: e.Disk, Name: e.Name, Method: e.Method, Bytes: e.Bytes, Duration: e.Duration, VerifiedSamples: e.VerifiedSamples})
	}
	return out
}

// errNotWiping refuses a wipe request for a server that is not a released
// server waiting for its wipe.
var errNotWiping = errors.New("server is not waiting for a release wipe")

// wipePlan answers the release wipe plan to the ramdisk booted in wipe
// mode. Like plan, the checks and the wipe hint come first (a 503 consumes
// nothing, so the agent's retry works); then one transaction uses the wipe
// token and mints the single-use wiped token. A retry of the same request
// (same source) gets the plan again with a fresh wiped token.
func (m *Machine) wipePlan(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r)
	t, err := m.cfg.Store.PeekToken(tok, state.TokenClaim{Purpose: state.PurposeWipe})
	if err != nil {
		m.use(w, r, tok, state.PurposeWipe, nil, true, nil) // refused, with its event
		return
	}
	if m.wrongAddress(w, r, t.Server) || m.attestGate(w, t) {
		return
	}
	srv, err := m.cfg.Store.Server(t.Server)
	if m.readFailed(w, r, err) {
		return
	}
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
	m.use(w, r, tok, state.PurposeWipe, nil, true, func(tx *state.Tx, t state.Token) (state.Answer, error) {
		cur, err := tx.Server(t.Server)
		if err != nil {
			return state.Answer{}, err
		}
		if cur.Lifecycle != state.LifecycleReady || !cur.NeedsWipe {
			return state.Answer{}, &answerError{status: http.StatusConflict, body: v1.Error{Message: errNotWiping.Error(), Code: "conflict", Lifecycle: string(cur.Lifecycle)}}
		}
		out := plan
		if out.DoneToken, _, err = tx.IssueToken(state.TokenSpec{Purpose: state.PurposeWiped, Server: cur.Name, MAC: cur.BootMAC, TTL: m.cfg.ImageTokenTTL}); err != nil {
			return state.Answer{}, err
		}
		// The erase method of the released allocation; an erase that
		// runs long reports its progress with a reusable token.
		out.Erase = cmp.Or(cur.WipeErase, v1.EraseMetadata)
		erases := out.Erase != v1.EraseMetadata
		for _, d := range cur.WipeEraseDisks {
			out.EraseDisks = append(out.EraseDisks, v1.EraseDisk{Method: cmp.Or(d.Method, v1.EraseMetadata),
				Disk: v1.StorageDiskRef{Name: d.Name, ByPath: d.ByPath, WWN: d.WWN, Serial: d.Serial, SizeBytes: d.SizeBytes}})
			erases = erases || cmp.Or(d.Method, v1.EraseMetadata) != v1.EraseMetadata
		}
		if erases {
			if out.ProgressToken, _, err = tx.IssueToken(state.TokenSpec{Purpose: state.PurposeEraseProgress, Server: cur.Name, MAC: cur.BootMAC, TTL: m.cfg.ImageTokenTTL, Reusable: true}); err != nil {
				return state.Answer{}, err
			}
			out.ProgressEvery = m.cfg.ProgressEvery
		}
		m.log.Info("wipe plan served", "machine", cur.Name, "erase", out.Erase, "eraseDisks", eraseDiskList(out.EraseDisks))
		return jsonAnswer(http.StatusOK, out)
	})
}

// wiped takes the release wipe's outcome. A good wipe clears NeedsWipe (the
// server may be allocated again) and records the power off the agent does
// next; a failed one is counted (WipeFailures, WipeFailedAt, LastError) and
// the plan retries it after a doubling delay.
func (m *Machine) wiped(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r)
	t, err := m.cfg.Store.PeekToken(tok, state.TokenClaim{Purpose: state.PurposeWiped})
	if err != nil {
		m.use(w, r, tok, state.PurposeWiped, nil, false, nil)
		return
	}
	if m.wrongAddress(w, r, t.Server) {
		return
	}
	var res v1.WipeResult
	body, code, err := readStrict(r, v1.MaxDoneBytes, &res)
	if err != nil {
		m.bad(w, r, t.Server, code, "wiped: "+err.Error())
		return
	}
	reason := wipeReason(res)
	m.use(w, r, tok, state.PurposeWiped, body, false, func(tx *state.Tx, t state.Token) (state.Answer, error) {
		now := time.Now().UTC()
		_, err := tx.UpdateServer(t.Server, func(s *state.Server) error {
			if s.Lifecycle != state.LifecycleReady || !s.NeedsWipe {
				return &answerError{status: http.StatusConflict, body: v1.Error{Message: errNotWiping.Error(), Code: "conflict"}}
			}
			s.WipeStartedAt = time.Time{}
			s.LastErase, s.WipeUnsupported = erasedRecords(res.Erased), !res.OK && res.Unsupported
			if res.OK {
				s.NeedsWipe, s.WipeFailures, s.WipeFailedAt, s.LastError = false, 0, time.Time{}, ""
			} else {
				s.WipeFailures++
				s.WipeFailedAt, s.LastError = now, reason
			}
			heard(s, "release wipe outcome")
			return nil
		})
		if err != nil {
			return state.Answer{}, err
		}
		kind := state.EventKind("wipe.done")
		if !res.OK {
			kind = "wipe.failed"
		}
		if err := tx.AppendEvent(state.Event{Server: t.Server, Kind: kind, Message: reason}); err != nil {
			return state.Answer{}, err
		}
		// The agent powers off after the wipe; the plan confirms it
		// through the BMC (state.PowerSourceAgent).
		if _, err := tx.SetPower(t.Server, state.PowerOff, state.PowerSourceAgent); err != nil {
			return state.Answer{}, err
		}
		m.log.Info("wipe outcome", "machine", t.Server, "ok", res.OK, "reason", reason)
		return state.Answer{Status: http.StatusNoContent}, nil
	})
}
