package api_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/state"
)

// mapLeases is a LeaseLookup over a fixed table.
type mapLeases map[string]netip.Addr

func (l mapLeases) LeasedIP(mac string) (netip.Addr, bool) {
	a, ok := l[strings.ToLower(mac)]
	return a, ok
}

// TestKnownTokenRefusalsPaced: a bounded flood on loopback of 600 refused
// machine requests that all carry a real token (a used report token with
// another body, the same token with a malformed body, a plan token on the
// report route, a live token from an address not leased to its machine)
// costs one event per server and kind at once and one summary event per
// server and kind when the interval ends, with the state file written for
// those events only (before the fix: 600 events, each its own commit and
// fsync and planner wake); all 600 are counted per reason in
// machina_machine_refusals_total; no refusal logs above Debug.
func TestKnownTokenRefusalsPaced(t *testing.T) {
	f := newFixture(t, state.Options{RefusalSummaryEvery: time.Hour}) // the test ends the interval itself
	const otherMAC = "52:54:00:00:00:08"
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, Planner: &flakyPlanner{},
		PerIP:  boot.Limit{Burst: 100000, Every: time.Microsecond},
		Leases: mapLeases{otherMAC: netip.MustParseAddr("192.0.2.8")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	for name, mac := range map[string]string{"r1-n07": onceMAC, "r1-n08": otherMAC} {
		if _, err := f.store.CreateServer(state.Server{Name: name, BootMAC: mac}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.store.Transition(name, state.LifecycleNew, state.LifecycleCommissioning, "test"); err != nil {
			t.Fatal(err)
		}
	}
	used := issueFor(t, f, state.PurposeReport)
	if code, _, b := f.do(t, http.MethodPost, v1.PathAgentReport, used, mustJSON(t, goodReport())); code != http.StatusOK {
		t.Fatalf("report: %d %s", code, b)
	}
	plan := issueFor(t, f, state.PurposePlan)
	other, _, err := f.store.IssueToken(state.TokenSpec{Purpose: state.PurposeReport, Server: "r1-n08", MAC: otherMAC})
	if err != nil {
		t.Fatal(err)
	}
	another := goodReport()
	another.Facts.CPU.Cores = 16

	events := func() int {
		evs, err := f.store.Events(state.EventQuery{Limit: 10000})
		if err != nil {
			t.Fatal(err)
		}
		return len(evs)
	}
	e0, w0, logs0 := events(), f.store.Writes(), len(f.logs.String())
	const each = 150
	for i := range each {
		for _, c := range []struct {
			name, token, body string
			want              int
		}{
			{"used token, another report", used, mustJSON(t, another), http.StatusForbidden},
			{"used token, malformed body", used, "{", http.StatusBadRequest},
			{"plan token on the report route", plan, mustJSON(t, goodReport()), http.StatusForbidden},
			{"live token from an address not leased", other, mustJSON(t, goodReport()), http.StatusForbidden},
		} {
			if code, _, b := f.do(t, http.MethodPost, v1.PathAgentReport, c.token, c.body); code != c.want {
				t.Fatalf("%s (%d): %d %s, want %d", c.name, i, code, b, c.want)
			}
		}
	}
	// One event at once per (server, kind): r1-n07 token.refused (used,
	// mismatch), r1-n07 machine.refused (bad body), r1-n08 machine.refused
	// (wrong address).
	if n := events() - e0; n != 3 {
		t.Errorf("%d events during %d refusals, want 3 (one per server and kind)", n, 4*each)
	}
	// bbolt writes at least the meta page per commit: 600 commits before.
	if n := f.store.Writes() - w0; n > 40 {
		t.Errorf("%d page writes during %d refusals, want at most 40 (three event commits)", n, 4*each)
	}
	for _, line := range strings.Split(f.logs.String()[logs0:], "\n") {
		if line != "" && !strings.Contains(line, "level=DEBUG") {
			t.Errorf("log line above Debug during the flood: %s", line)
		}
	}

	if err := f.store.FlushRefusals(); err != nil {
		t.Fatal(err)
	}
	evs, _ := f.store.Events(state.EventQuery{Limit: 10000})
	summaries := map[string]string{}
	for _, e := range evs[e0+3:] {
		summaries[e.Server+" "+string(e.Kind)] = e.Message
	}
	for key, want := range map[string]string{
		"r1-n07 token.refused":   "299 more requests refused within 1h0m0s: token_used 149, token_mismatch 150",
		"r1-n07 machine.refused": "149 more requests refused within 1h0m0s: bad_request 149",
		"r1-n08 machine.refused": "149 more requests refused within 1h0m0s: wrong_address 149",
	} {
		if !strings.Contains(summaries[key], want) {
			t.Errorf("summary %s = %q, want %q", key, summaries[key], want)
		}
	}
	if len(summaries) != 3 || len(evs)-e0 != 6 {
		t.Errorf("after the interval: %d events, summaries %v; want 3 + 3", len(evs)-e0, summaries)
	}

	resp, err := http.Get(f.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`machina_machine_refusals_total{reason="token_used"} 150`,
		`machina_machine_refusals_total{reason="token_mismatch"} 150`,
		`machina_machine_refusals_total{reason="bad_request"} 150`,
		`machina_machine_refusals_total{reason="wrong_address"} 150`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// brokenInstaller has no installer files and cannot render documents.
type brokenInstaller struct{}

func (brokenInstaller) InstallerFiles(context.Context, state.Server) (string, string, error) {
	return "", "", errors.New("installer ISO not imported")
}

func (brokenInstaller) InstallerDocument(context.Context, state.Server, string) ([]byte, error) {
	return nil, errors.New("template: no join command")
}

// TestInstallerUnavailablePaced: 100 installer-document fetches with the
// real reusable install token while the controller cannot render the
// document answer 503 each, but write one event at once and one summary
// at the interval's end, log one Error line, and are counted (before: an
// event and an Error line per request).
func TestInstallerUnavailablePaced(t *testing.T) {
	f := newFixture(t, state.Options{RefusalSummaryEvery: time.Hour})
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, Installer: brokenInstaller{}, PerIP: boot.Limit{Burst: 100000, Every: time.Microsecond},
		Logger: slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	deployingServer(t, f, "r1-n01", "52:54:00:00:00:01", "autoinstall")
	tok, _, err := f.store.IssueToken(state.TokenSpec{Purpose: state.PurposeInstall, Server: "r1-n01", MAC: "52:54:00:00:00:01", Reusable: true})
	if err != nil {
		t.Fatal(err)
	}
	unavailable := func() int {
		evs, _ := f.store.Events(state.EventQuery{Server: "r1-n01", Limit: 10000})
		n := 0
		for _, e := range evs {
			if e.Kind == "install.unavailable" {
				n++
			}
		}
		return n
	}
	logs0 := len(f.logs.String())
	for i := range 100 {
		if code, _, b := f.do(t, http.MethodGet, "/install/"+tok+"/nocloud/user-data", "", ""); code != http.StatusServiceUnavailable {
			t.Fatalf("fetch %d: %d %s, want 503", i, code, b)
		}
	}
	if n := unavailable(); n != 1 {
		t.Errorf("%d install.unavailable events for 100 failed fetches, want 1 at once", n)
	}
	// (Each fetch still writes the document's fresh completion token,
	// minted before the document is rendered: not counted here.)
	if n := strings.Count(f.logs.String()[logs0:], "level=ERROR"); n != 1 {
		t.Errorf("%d Error lines for 100 failed fetches, want 1", n)
	}
	if err := f.store.FlushRefusals(); err != nil {
		t.Fatal(err)
	}
	if n := unavailable(); n != 2 {
		t.Errorf("after the interval: %d events, want 2 (the summary of 99)", n)
	}
	if c := f.store.RefusalCounts()[state.RefusalUnavailable]; c != 100 {
		t.Errorf("RefusalCounts[unavailable] = %d, want 100", c)
	}
}
