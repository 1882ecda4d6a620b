package ui

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/state"
)

// pages are the templates that render a whole document with the layout.
var pages = []string{"login", "fleet", "server", "images", "hosts", "inventory", "approve", "console", "error"}

func parseTemplates() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"ts": func(t time.Time) string {
			if t.IsZero() {
				return "—"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"bytes": humanBytes,
		// gitloop bundles one row of the inventory page's Git table.
		"gitloop": func(name, id string, l GitLoop) gitLoopRow { return gitLoopRow{Name: name, ID: id, Loop: l} },
		"short":   func(s string) string { return shortDigest(s) },
		"pct": func(p float64) string {
			if p < 0 {
				return "?"
			}
			return fmt.Sprintf("%.0f", p)
		},
		"watts": func(p *float64) string {
			if p == nil {
				return ""
			}
			return fmt.Sprintf("%.0f W", *p)
		},
	}
	out := map[string]*template.Template{}
	for _, p := range pages {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+p+".html")
		if err != nil {
			return nil, fmt.Errorf("parse template %s: %w", p, err)
		}
		out[p] = t
	}
	return out, nil
}

// humanBytes formats a size in bytes with binary units: "512 B", "4.0 MiB",
// "1.7 TiB" (one decimal, the largest unit the value reaches, up to TiB).
// Negative sizes are shown in bytes.
func humanBytes(b int64) string {
	if b < 1024 {
		return fmt.Sprintf("%d B", b)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	v := float64(b) / 1024
	i := 0
	// 1023.96 KiB would print as "1024.0 KiB": move up a unit when
	// rounding to one decimal reaches 1024.
	for i < len(units)-1 && v >= 1023.95 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

// shortDigest returns the first 12 hex digits of a "sha256:..." digest or a
// commit hash, as machinactl shows them.
func shortDigest(s string) string {
	s = strings.TrimPrefix(s, "sha256:")
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// layoutData is what layout.html needs around every page.
type layoutData struct {
	Title  string
	Nav    string // the active navigation entry
	Actor  string // "" on the login page
	CSRF   string
	Script string // a module under /ui/static/js/, or ""
	Extra  []string
	Page   any
}

func (u *UI) render(w http.ResponseWriter, r *http.Request, name string, code int, page any) {
	d := layoutData{Page: page}
	if s := sessionOf(r); s != nil {
		d.Actor, d.CSRF = s.actor, s.csrf
	}
	switch v := page.(type) {
	case titled:
		d.Title, d.Nav, d.Script = v.title()
	}
	if name == "login" {
		d.Title = "Log in"
	}
	var buf bytes.Buffer
	if err := u.tmpl[name].Execute(&buf, d); err != nil {
		u.log.Error("ui render", "page", name, "err", err)
		http.Error(w, "ui: internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes()) // the client went away; nothing to do
}

// titled page views name their title, nav entry and script.
type titled interface {
	title() (title, nav, script string)
}

func (u *UI) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	u.render(w, r, "error", code, errorView{Code: code, Message: msg})
}

type errorView struct {
	Code    int
	Message string
}

func (errorView) title() (string, string, string) { return "Error", "", "" }

// ---- fleet ----

type fleetView struct {
	Zones      []zoneView
	Lifecycles []string
	Counts     []countView
	Total      int
	LastSeq    uint64
}

type zoneView struct {
	Name    string
	Servers []serverRow
}

type countView struct {
	Lifecycle string
	N         int
}

type serverRow struct {
	state.Server
	LastEvent   string
	LastEventAt time.Time
}

func (fleetView) title() (string, string, string) { return "Fleet", "fleet", "fleet.mjs" }

// maxFleet bounds the servers the fleet page lists.
const maxFleet = state.MaxPageSize

func (u *UI) handleFleet(w http.ResponseWriter, r *http.Request) {
	page, err := u.store.ListServers(state.ListOptions{Limit: maxFleet})
	if err != nil {
		u.storeFail(w, r, err)
		return
	}
	seq, err := u.store.LastEventSeq()
	if err != nil {
		u.storeFail(w, r, err)
		return
	}
	last, err := u.lastEvents(seq, len(page.Servers))
	if err != nil {
		u.storeFail(w, r, err)
		return
	}
	v := fleetView{Total: len(page.Servers), LastSeq: seq}
	zones := map[string]*zoneView{}
	counts := map[state.Lifecycle]int{}
	for _, s := range page.Servers {
		z := s.Zone
		if z == "" {
			z = "(no zone)"
		}
		if zones[z] == nil {
			zones[z] = &zoneView{Name: z}
		}
		row := serverRow{Server: s}
		if e, ok := last[s.Name]; ok {
			row.LastEvent, row.LastEventAt = describe(e), e.At
		}
		zones[z].Servers = append(zones[z].Servers, row)
		counts[s.Lifecycle]++
	}
	for _, l := range state.Lifecycles() {
		v.Lifecycles = append(v.Lifecycles, string(l))
		v.Counts = append(v.Counts, countView{string(l), counts[l]})
	}
	names := make([]string, 0, len(zones))
	for n := range zones {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		v.Zones = append(v.Zones, *zones[n])
	}
	u.render(w, r, "fleet", http.StatusOK, v)
}

// lastEvents returns the newest event per server, reading back from seq
// at most a few pages (servers with no recent event show none).
func (u *UI) lastEvents(seq uint64, servers int) (map[string]state.Event, error) {
	out := map[string]state.Event{}
	const page = 1000
	for pages := 0; pages < 5 && seq > 0 && len(out) < servers; pages++ {
		after := uint64(0)
		if seq > page {
			after = seq - page
		}
		evs, err := u.store.Events(state.EventQuery{After: after, Limit: page})
		if err != nil {
			return nil, err
		}
		for _, e := range evs {
			if e.Server == "" || e.Seq > seq {
				continue
			}
			if prev, ok := out[e.Server]; !ok || e.Seq > prev.Seq {
				out[e.Server] = e
			}
		}
		seq = after
	}
	return out, nil
}

// describe is the one-line text of an event, as the fleet and timeline show it.
func describe(e state.Event) string {
	switch e.Kind {
	case state.EventTransition:
		s := fmt.Sprintf("%s → %s", e.From, e.To)
		if e.Message != "" {
			s += ": " + e.Message
		}
		return s
	default:
		if e.Message != "" {
			return e.Message
		}
		return string(e.Kind)
	}
}

// historyPoint is the fleet's lifecycle counts just after one event.
type historyPoint struct {
	Seq    uint64         `json:"seq"`
	At     time.Time      `json:"at"`
	Counts map[string]int `json:"counts"`
}

// maxHistory bounds the lifecycle events the chart replays.
const maxHistory = 2000

// handleHistory answers GET /ui/data/history: the fleet's count per
// lifecycle after each of the last lifecycle-changing events (newest
// last), rebuilt backwards from today's counts. JSON
// {"lifecycles": [...], "points": [historyPoint...]}.
func (u *UI) handleHistory(w http.ResponseWriter, r *http.Request) {
	counts, err := u.store.CountServers()
	if err != nil {
		u.storeFailJSON(w, err)
		return
	}
	seq, err := u.store.LastEventSeq()
	if err != nil {
		u.storeFailJSON(w, err)
		return
	}
	after := uint64(0)
	if seq > maxHistory*5 {
		after = seq - maxHistory*5
	}
	evs, err := u.store.Events(state.EventQuery{After: after, Limit: maxHistory * 5})
	if err != nil {
		u.storeFailJSON(w, err)
		return
	}
	cur := map[string]int{}
	for l, n := range counts {
		cur[string(l)] = n
	}
	snap := func(e state.Event) historyPoint {
		c := make(map[string]int, len(cur))
		for k, v := range cur {
			c[k] = v
		}
		return historyPoint{Seq: e.Seq, At: e.At, Counts: c}
	}
	var rev []historyPoint
	for i := len(evs) - 1; i >= 0 && len(rev) < maxHistory; i-- {
		e := evs[i]
		switch e.Kind {
		case state.EventTransition:
			rev = append(rev, snap(e))
			cur[string(e.To)]--
			cur[string(e.From)]++
		case state.EventCreated:
			rev = append(rev, snap(e))
			cur[string(e.To)]--
		}
	}
	pts := make([]historyPoint, 0, len(rev))
	for i := len(rev) - 1; i >= 0; i-- {
		pts = append(pts, rev[i])
	}
	var lcs []string
	for _, l := range state.Lifecycles() {
		lcs = append(lcs, string(l))
	}
	writeJSON(w, map[string]any{"lifecycles": lcs, "points": pts, "seq": seq})
}

// ---- server page ----

type serverView struct {
	Server     state.Server
	Next       []string
	Events     []eventRow
	Conditions []Condition
	CondErr    string
	BMC        *bmc.Info
	BMCErr     string
	Hosts      []hostLog
	HasConsole bool
	LastSeq    uint64 // the live timeline resumes after this event
}

type eventRow struct {
	state.Event
	Text string
}

type hostLog struct {
	Host state.Host
	Log  []state.JoinLogEntry
}

func (v serverView) title() (string, string, string) { return v.Server.Name, "fleet", "server.mjs" }

// maxTimeline bounds the server page's events timeline.
const maxTimeline = 200

func (u *UI) handleServer(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	srv, err := u.store.Server(name)
	if err != nil {
		u.storeFail(w, r, err)
		return
	}
	v := serverView{Server: srv, HasConsole: u.allows(r, patternConsole) && u.consoleSupported(r.Context(), name)}
	for _, l := range state.NextLifecycles(srv.Lifecycle) {
		v.Next = append(v.Next, string(l))
	}
	// The newest maxTimeline events of this server, newest first.
	seq, err := u.store.LastEventSeq()
	if err != nil {
		u.storeFail(w, r, err)
		return
	}
	v.LastSeq = seq
	evs, err := u.serverEvents(name)
	if err != nil {
		u.storeFail(w, r, err)
		return
	}
	for i := len(evs) - 1; i >= 0; i-- {
		v.Events = append(v.Events, eventRow{Event: evs[i], Text: describe(evs[i])})
	}
	if u.cfg.Inventory != nil {
		st, err := u.cfg.Inventory.InventoryStatus(r.Context())
		if err != nil {
			v.CondErr = err.Error()
		}
		for _, c := range st.Conditions {
			if c.Subject == "server/"+name {
				v.Conditions = append(v.Conditions, c)
			}
		}
	} else {
		v.CondErr = "not available: no inventory status source is configured"
	}
	if u.cfg.BMC != nil {
		ctx, cancel := context.WithTimeout(r.Context(), u.cfg.BMCTimeout)
		info, err := u.cfg.BMC.BMCInfo(ctx, name)
		cancel()
		if err != nil {
			v.BMCErr = err.Error()
		} else {
			v.BMC = info
		}
	} else {
		v.BMCErr = "not available: no BMC read model source is configured"
	}
	hosts, err := u.store.Hosts()
	if err != nil {
		u.storeFail(w, r, err)
		return
	}
	for _, h := range hosts {
		if h.Server != name {
			continue
		}
		log, err := u.store.JoinLog(h.Name)
		if err != nil {
			u.storeFail(w, r, err)
			return
		}
		v.Hosts = append(v.Hosts, hostLog{Host: h, Log: log})
	}
	u.render(w, r, "server", http.StatusOK, v)
}

// serverEvents returns up to maxTimeline of the newest events of server,
// ascending.
func (u *UI) serverEvents(server string) ([]state.Event, error) {
	var all []state.Event
	after := uint64(0)
	for {
		evs, err := u.store.Events(state.EventQuery{Server: server, After: after, Limit: 1000})
		if err != nil {
			return nil, err
		}
		all = append(all, evs...)
		if len(all) > maxTimeline {
			all = all[len(all)-maxTimeline:]
		}
		if len(evs) < 1000 {
			return all, nil
		}
		after = evs[len(evs)-1].Seq
	}
}

// ---- images ----

type imagesView struct {
	Images []ImageStatus
	Err    string
}

func (imagesView) title() (string, string, string) { return "Images", "images", "images.mjs" }

func (u *UI) imageStatuses(ctx context.Context) ([]ImageStatus, string) {
	if u.cfg.Images == nil {
		return nil, "not available: no image status source is configured"
	}
	list, err := u.cfg.Images.ImageStatuses(ctx)
	if err != nil {
		return nil, err.Error()
	}
	return list, ""
}

func (u *UI) handleImages(w http.ResponseWriter, r *http.Request) {
	list, msg := u.imageStatuses(r.Context())
	u.render(w, r, "images", http.StatusOK, imagesView{Images: list, Err: msg})
}

// handleImagesData answers GET /ui/data/images: {"images": [...], "error": ""},
// polled by the images page while an import runs.
func (u *UI) handleImagesData(w http.ResponseWriter, r *http.Request) {
	list, msg := u.imageStatuses(r.Context())
	if list == nil {
		list = []ImageStatus{}
	}
	writeJSON(w, map[string]any{"images": list, "error": msg})
}

// ---- hosts ----

type hostsView struct {
	Hosts   []hostRow
	Offline time.Duration
}

type hostRow struct {
	state.Host
	Online   bool
	Networks []applied // from the host record (what GET /api/v1/hosts returns)
	Pools    []applied
}

// applied is one network or storage pool a host reported applied in its
// last join: its name, and the join log's message for the step "network
// NAME" or "pool NAME" (join/node.Apply), empty when the log has none.
type applied struct {
	Name   string
	Detail string
}

func (hostsView) title() (string, string, string) { return "Hosts", "hosts", "" }

// hostOffline is how long without a heartbeat makes a host offline.
const hostOffline = 2 * time.Minute

func (u *UI) handleHosts(w http.ResponseWriter, r *http.Request) {
	hosts, err := u.store.Hosts()
	if err != nil {
		u.storeFail(w, r, err)
		return
	}
	now := u.cfg.Now()
	v := hostsView{Offline: hostOffline}
	for _, h := range hosts {
		row := hostRow{Host: h, Online: h.Lost == nil && !h.LastSeen.IsZero() && now.Sub(h.LastSeen) < hostOffline}
		log, err := u.store.JoinLog(h.Name)
		if err != nil {
			u.storeFail(w, r, err)
			return
		}
		detail := map[string]string{}
		for _, e := range log {
			detail[e.Step] = e.Message // the last join's message wins
		}
		for _, n := range h.Networks {
			row.Networks = append(row.Networks, applied{Name: n, Detail: detail["network "+n]})
		}
		for _, p := range h.StoragePools {
			row.Pools = append(row.Pools, applied{Name: p, Detail: detail["pool "+p]})
		}
		v.Hosts = append(v.Hosts, row)
	}
	u.render(w, r, "hosts", http.StatusOK, v)
}

// ---- inventory and approvals ----

// gitLoopRow is one row of the inventory page's Git table.
type gitLoopRow struct {
	Name, ID string
	Loop     GitLoop
}

type inventoryView struct {
	Status   InventoryStatus
	Err      string
	Approved bool
	Done     string // flash after an approval
	// CanApprove: the session's token has the role POST
	// /api/v1/approve needs (else the approve button is not shown).
	CanApprove bool
}

func (inventoryView) title() (string, string, string) { return "Inventory", "inventory", "" }

func (u *UI) inventoryStatus(ctx context.Context) (InventoryStatus, string) {
	if u.cfg.Inventory == nil {
		return InventoryStatus{}, "not available: no inventory status source is configured"
	}
	st, err := u.cfg.Inventory.InventoryStatus(ctx)
	if err != nil {
		return InventoryStatus{}, err.Error()
	}
	return st, ""
}

func (u *UI) handleInventory(w http.ResponseWriter, r *http.Request) {
	st, msg := u.inventoryStatus(r.Context())
	v := inventoryView{Status: st, Err: msg, CanApprove: u.allows(r, patternApprove)}
	if st.Acting.Digest != "" {
		ok, err := u.store.Approved(st.Acting.Digest)
		if err != nil {
			u.storeFail(w, r, err)
			return
		}
		v.Approved = ok
	}
	if d := r.URL.Query().Get("approved"); hexRE.MatchString(d) {
		v.Done = d
	}
	u.render(w, r, "inventory", http.StatusOK, v)
}

var hexRE = regexp.MustCompile(`^[0-9a-f]{12,64}$`)

type approveView struct {
	Revision Revision
	Prefix   string
	Held     []PlanStep
	Brake    string
	CSRF     string
	// CanApprove: the session's token may approve (else no form).
	CanApprove bool
}

func (approveView) title() (string, string, string) { return "Approve held plan", "inventory", "" }

// handleApproveConfirm shows what approving the held plan will do (every
// held step) and asks for confirmation; it changes nothing.
func (u *UI) handleApproveConfirm(w http.ResponseWriter, r *http.Request) {
	st, msg := u.inventoryStatus(r.Context())
	if msg != "" {
		u.fail(w, r, http.StatusServiceUnavailable, msg)
		return
	}
	rev := r.URL.Query().Get("rev")
	if !hexRE.MatchString(rev) || !strings.HasPrefix(strings.TrimPrefix(st.Acting.Digest, "sha256:"), rev) {
		u.fail(w, r, http.StatusConflict, "that revision is not the one being acted on any more; reload the inventory page")
		return
	}
	if len(st.Held) == 0 {
		u.fail(w, r, http.StatusConflict, "the acting revision has no held plan")
		return
	}
	u.render(w, r, "approve", http.StatusOK, approveView{Revision: st.Acting, Prefix: rev, Held: st.Held, Brake: st.Brake, CSRF: sessionOf(r).csrf,
		CanApprove: u.allows(r, patternApprove)})
}

// handleApprove records the approval (state.Store.Approve, which writes an
// EventApproval with the session's token name as Actor) after checking
// that the revision is still the acting one with held steps, then
// redirects to the inventory page.
func (u *UI) handleApprove(w http.ResponseWriter, r *http.Request) {
	s := sessionOf(r)
	if !u.allows(r, patternApprove) {
		u.fail(w, r, http.StatusForbidden, "approving a held plan needs an admin token with role "+string(u.need(patternApprove))+"; nothing was approved")
		return
	}
	rev := r.PostFormValue("rev")
	if r.PostFormValue("confirm") != "yes" {
		u.fail(w, r, http.StatusBadRequest, "approval not confirmed")
		return
	}
	st, msg := u.inventoryStatus(r.Context())
	if msg != "" {
		u.fail(w, r, http.StatusServiceUnavailable, msg)
		return
	}
	if !hexRE.MatchString(rev) || !strings.HasPrefix(strings.TrimPrefix(st.Acting.Digest, "sha256:"), rev) {
		u.fail(w, r, http.StatusConflict, "that revision is not the one being acted on any more; nothing was approved")
		return
	}
	if len(st.Held) == 0 {
		u.fail(w, r, http.StatusConflict, "the acting revision has no held plan; nothing was approved")
		return
	}
	if err := u.store.Approve(rev, s.actor); err != nil {
		u.storeFail(w, r, err)
		return
	}
	u.log.Info("held plan approved", "rev", rev, "actor", s.actor, "steps", len(st.Held))
	http.Redirect(w, r, "/ui/inventory?approved="+rev, http.StatusSeeOther)
}

// ---- console ----

type consoleView struct {
	Server    string
	Available bool
	// Unsupported is set when Config.ConsoleSupport said the server's BMC
	// has no serial console.
	Unsupported bool
}

func (consoleView) title() (string, string, string) { return "Console", "fleet", "console.mjs" }

func (u *UI) handleConsolePage(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, err := u.store.Server(name); err != nil {
		u.storeFail(w, r, err)
		return
	}
	v := consoleView{Server: name, Available: u.consoleSupported(r.Context(), name)}
	v.Unsupported = u.cfg.Console != nil && !v.Available
	u.render(w, r, "console", http.StatusOK, v)
}

// consoleSupported reports whether the console page of server can open a
// terminal: a console handler is configured and Config.ConsoleSupport (if
// set) did not answer bmc.ErrUnsupported. Other errors from the check are
// logged and answer true (the WebSocket then reports what happens).
func (u *UI) consoleSupported(ctx context.Context, server string) bool {
	if u.cfg.Console == nil {
		return false
	}
	if u.cfg.ConsoleSupport == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, u.cfg.BMCTimeout)
	defer cancel()
	err := u.cfg.ConsoleSupport.ConsoleSupported(ctx, server)
	if err != nil && !errors.Is(err, bmc.ErrUnsupported) {
		u.log.Warn("console support check failed", "server", server, "err", err)
	}
	return !errors.Is(err, bmc.ErrUnsupported)
}

// Console subprotocols: the page offers both; the UI selects the one that
// names the role the console handler gave (console.RoleHeader), so the
// page knows whether it may type.
const (
	protoWriter = "machina.console.writer"
	protoReader = "machina.console.reader"
)

// handleConsoleWS forwards a session's WebSocket to Config.Console as
// GET /api/v1/servers/{name}/console with Principal set, so the console
// handler audits it under the session's token name.
func (u *UI) handleConsoleWS(w http.ResponseWriter, r *http.Request) {
	if u.cfg.Console == nil {
		http.Error(w, "ui: console not available", http.StatusNotImplemented)
		return
	}
	if !u.allows(r, patternConsole) {
		http.Error(w, "ui: the serial console needs an admin token with role "+string(u.need(patternConsole)), http.StatusForbidden)
		return
	}
	s := sessionOf(r)
	name := r.PathValue("name")
	ctx, cancel := s.bind(r.Context()) // logout or expiry closes the console
	defer cancel()
	r2 := r.Clone(context.WithValue(ctx, principalKey{}, s.actor))
	r2.URL.Path = "/api/v1/servers/" + name + "/console"
	r2.URL.RawPath = ""
	r2.RequestURI = r2.URL.RequestURI()
	r2.SetPathValue("name", name)
	r2.Header.Del("Authorization")
	u.cfg.Console.ServeHTTP(&roleWriter{ResponseWriter: w, offered: r.Header.Values("Sec-WebSocket-Protocol")}, r2)
}

// roleWriter selects the console subprotocol matching the role header just
// before the 101 answer goes out (RFC 6455 section 4.2.2: the server picks
// one of the client's offered subprotocols).
type roleWriter struct {
	http.ResponseWriter
	offered []string
}

func (w *roleWriter) WriteHeader(code int) {
	if code == http.StatusSwitchingProtocols {
		proto := protoReader
		if w.Header().Get("X-Machina-Console-Role") == "writer" {
			proto = protoWriter
		}
		for _, o := range w.offered {
			for _, p := range strings.Split(o, ",") {
				if strings.TrimSpace(p) == proto {
					w.Header().Set("Sec-WebSocket-Protocol", proto)
				}
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *roleWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *roleWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

func (w *roleWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ---- admin API reads ----

// apiReadable are the admin API routes the browser may read through the UI.
var apiReadable = regexp.MustCompile(`^/api/v1/(status|servers|servers/[a-z0-9-]{1,63}|servers/[a-z0-9-]{1,63}/events|events|events/stream)$`)

// handleAPIProxy forwards GET /ui/api/v1/<route> to the admin API as
// GET /api/v1/<route> with the session's token as the bearer, for the
// routes in apiReadable; others answer 404. The event stream passes
// through unbuffered (the API flushes).
func (u *UI) handleAPIProxy(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, "/ui")
	if !apiReadable.MatchString(path) {
		http.NotFound(w, r)
		return
	}
	s := sessionOf(r)
	ctx, cancel := s.bind(r.Context()) // logout or expiry ends the event stream
	defer cancel()
	r2 := r.Clone(ctx)
	r2.URL.Path = path
	r2.URL.RawPath = ""
	r2.RequestURI = r2.URL.RequestURI()
	r2.Header.Del("Cookie")
	r2.Header.Set("Authorization", "Bearer "+s.token)
	u.cfg.API.ServeHTTP(w, r2)
}

// ---- helpers ----

func (u *UI) storeFail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, state.ErrNotFound):
		u.fail(w, r, http.StatusNotFound, "not found")
	case errors.Is(err, state.ErrInvalid):
		u.fail(w, r, http.StatusBadRequest, "invalid request")
	default:
		u.log.Error("ui request failed", "path", r.URL.Path, "err", err)
		u.fail(w, r, http.StatusInternalServerError, "internal error")
	}
}

func (u *UI) storeFailJSON(w http.ResponseWriter, err error) {
	u.log.Error("ui data request failed", "err", err)
	http.Error(w, "ui: internal error", http.StatusInternalServerError)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v) // the client went away; nothing to do
}

// Admin API patterns whose needed role (Config.RouteRole) gates the UI's
// own actions: the console WebSocket is forwarded to the console handler,
// and an approval records what POST /api/v1/approve records.
const (
	patternConsole = "GET /api/v1/servers/{name}/console"
	patternApprove = "POST /api/v1/approve"
)

// need returns the role the admin API route pattern needs
// (Config.RouteRole; admin without one).
func (u *UI) need(pattern string) state.Role {
	if u.cfg.RouteRole == nil {
		return state.RoleAdmin
	}
	return u.cfg.RouteRole(pattern)
}

// allows reports whether the token of r's session has the role pattern
// needs; false without a session or when the token is gone.
func (u *UI) allows(r *http.Request, pattern string) bool {
	s := sessionOf(r)
	if s == nil {
		return false
	}
	at, err := u.store.AuthenticateAdmin(s.token)
	return err == nil && at.Role.Allows(u.need(pattern))
}
