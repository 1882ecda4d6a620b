package sim_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/machina-metal/machina/bmc/ipmi/ipmisim/ipmisimtest"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/state"
	"github.com/machina-metal/machina/ui/uitest"
)

// TestBrowserAgainstController drives the web console in headless Chromium
// against the real controller (controller.Run, the code `machina sim`
// runs) on the simulated lab with a 1 s firmware boot delay: log in at
// /ui/ with a fresh admin token, watch a recommissioned server go ready →
// commissioning → ready on the fleet page through the event stream without
// a reload, open its server page (hardware facts from the commissioning
// report, the Redfish BMC's read model), see every image of the inventory
// verified on the images page and every joined host on the hosts page,
// hold a revision retiring 6 of 12
// servers and approve it through the inventory page's approve button and
// confirmation (the six then retire), open a serial console page of a
// Redfish server (the simulated Redfish BMCs have no serial console: the
// page must say so), open the serial console of a deployed IPMI server
// and type on it: the keystrokes go through the controller's console
// WebSocket, ipmitool's Serial-over-LAN session, OpenIPMI's ipmi_sim and
// the simulated machine's serial port, whose getty echoes them back into
// xterm.js; a second tab is read-only and its typing never reaches the
// machine. Finally check that every request stayed on the controller and
// that no CSP violation happened (with an injected inline script as the
// control).
func TestBrowserAgainstController(t *testing.T) {
	ctx := uitest.Browser(t)
	ipmisimtest.RequireTools(t)
	r := startRig(t, rigOptions{lab: sim.Config{BootDelay: time.Second}, ipmi: true})
	snap := r.steady()
	tok, _, err := r.run.Store.CreateAdminToken(fmt.Sprintf("ui-e2e-%d", time.Now().UnixNano()), "test")
	if err != nil {
		t.Fatal(err)
	}
	rec := &uitest.Recorder{}
	rec.Listen(t, ctx)
	dir := uitest.ScreenshotDir(t)
	base := r.run.URL

	// Log in through the real login form; the fleet page goes live.
	uitest.Login(t, ctx, base, tok, `document.querySelectorAll("tr[data-name]").length === 12`)

	// Recommission a ready server and watch its row change without a reload.
	const name = "r3-n02"
	if record(snap, name).Lifecycle != state.LifecycleReady {
		t.Fatalf("%s is %s, want ready", name, record(snap, name).Lifecycle)
	}
	uitest.Eval[bool](t, ctx, `window.__marker = "same page"; window.__seen = [];
	  { const cell = document.querySelector('#srv-`+name+` [data-field="lifecycle"]');
	    new MutationObserver(() => window.__seen.push(cell.textContent)).observe(cell, {childList: true, characterData: true, subtree: true}); }
	  true`)
	r.commit("recommission "+name, func(dir string) { r.setActions(dir, name, inventory.Actions{Commission: 1}) })
	uitest.Do(t, ctx, "watch "+name+" commission",
		uitest.Poll(`window.__seen.includes("commissioning")`),
		uitest.Poll(`window.__seen.indexOf("ready") > window.__seen.indexOf("commissioning")`),
	)
	if m := uitest.Eval[string](t, ctx, `window.__marker || ""`); m != "same page" {
		t.Fatal("the fleet page reloaded to show the change")
	}
	seen := uitest.Eval[[]string](t, ctx, `window.__seen`)
	t.Logf("%s lifecycle cell showed %q", name, seen)
	if srv, _ := r.run.Store.Server(name); srv.Lifecycle != state.LifecycleReady {
		t.Errorf("the page shows ready but the store has %s", srv.Lifecycle)
	}
	uitest.Shot(t, ctx, dir, "sim-fleet")

	// Server page: hardware facts from the commissioning report, BMC read model.
	srv, err := r.run.Store.Server(name)
	if err != nil || srv.Hardware == nil {
		t.Fatalf("%s has no hardware facts: %v", name, err)
	}
	uitest.Do(t, ctx, "open the server page",
		chromedp.Click(chromedp.CSS(`a[href="/ui/servers/`+name+`"]`)),
		chromedp.WaitVisible(chromedp.CSS("#bmc")),
	)
	body := uitest.Eval[string](t, ctx, `document.body.innerText`)
	wants := []string{srv.Hardware.Serial, fmt.Sprint(srv.Hardware.Cores), "ready → commissioning", "commissioning → ready"}
	for _, d := range srv.Hardware.Disks {
		wants = append(wants, d.Name)
	}
	for _, n := range srv.Hardware.NICs {
		wants = append(wants, n.MAC)
	}
	for _, want := range wants {
		if !strings.Contains(body, want) {
			t.Errorf("server page lacks %q", want)
		}
	}
	if strings.Contains(body, "Not commissioned yet") {
		t.Error("server page says not commissioned")
	}
	if n := uitest.Eval[int](t, ctx, `document.querySelectorAll("#bmc dl").length`); n != 1 {
		t.Errorf("server page shows no BMC read model:\n%s", uitest.Eval[string](t, ctx, `document.getElementById("bmc").innerText`))
	}
	if n := uitest.Eval[int](t, ctx, `document.querySelectorAll("#open-console").length`); n != 0 {
		t.Error("server page offers a serial console its Redfish BMC does not have")
	}
	uitest.Shot(t, ctx, dir, "sim-server")

	// Images page: every image of the acting inventory, verified by the
	// controller's image store, at 100%.
	inv := r.run.Reconciler.Desired()
	uitest.Do(t, ctx, "images page", chromedp.Navigate(base+"/ui/images"), chromedp.WaitVisible(chromedp.CSS("#images")))
	if n := uitest.Eval[int](t, ctx, `document.querySelectorAll("tr[data-image]").length`); n != len(inv.Images) || n == 0 {
		t.Errorf("images page lists %d images, the inventory has %d", n, len(inv.Images))
	}
	for _, im := range inv.Images {
		sel := `tr[data-image="` + im.Name + `"]`
		if st := uitest.Eval[string](t, ctx, `(document.querySelector('`+sel+` [data-field="state"] .st') || {}).textContent || ""`); st != "verified" {
			t.Errorf("images page: %s is %q, want verified", im.Name, st)
		}
		if v := uitest.Eval[float64](t, ctx, `(document.querySelector('`+sel+` progress') || {}).value || 0`); v != 100 {
			t.Errorf("images page: %s progress %v, want 100", im.Name, v)
		}
	}

	// Hosts page: the deployed machines joined as hosts; each has a row.
	r.waitFor("deployed machines joined", time.Minute, func(s state.Snapshot) bool {
		for n, srv := range s.Servers {
			if srv.Lifecycle == state.LifecycleDeployed && !r.lab.Machine(n).Joined() {
				return false
			}
		}
		return true
	})
	hosts, err := r.run.Store.Hosts()
	if err != nil || len(hosts) == 0 {
		t.Fatalf("no joined hosts: %v", err)
	}
	uitest.Do(t, ctx, "hosts page", chromedp.Navigate(base+"/ui/hosts"), chromedp.WaitVisible(chromedp.CSS(`tr[data-host]`)))
	rows := uitest.Eval[[]string](t, ctx, `[...document.querySelectorAll("tr[data-host]")].map(r => r.dataset.host)`)
	withBoth := 0 // joined hosts with networks and storage pools applied
	for _, h := range hosts {
		if !slices.Contains(rows, h.Name) {
			t.Errorf("hosts page lacks joined host %s (rows %q)", h.Name, rows)
			continue
		}
		// The Networks and Storage pools cells show the host record's
		// names (what GET /api/v1/hosts returns), in report order.
		if len(h.Networks) > 0 && len(h.StoragePools) > 0 {
			withBoth++
		}
		for field, want := range map[string][]string{"networks": h.Networks, "pools": h.StoragePools} {
			got := uitest.Eval[[]string](t, ctx, `[...document.querySelectorAll('tr[data-host="`+h.Name+`"] [data-field="`+field+`"] .name')].map(d => d.textContent)`)
			if !slices.Equal(got, want) {
				t.Errorf("hosts page: %s %s cell = %q, the store's host record has %q", h.Name, field, got, want)
			}
		}
	}
	if withBoth == 0 {
		t.Errorf("no joined host has both networks and storage pools (the example's hypervisor profile applies both): %+v", hosts)
	}
	uitest.Shot(t, ctx, dir, "sim-hosts")

	// Serial console of an IPMI server deployed and booted to its OS: a
	// real byte stream through ipmitool's SOL session and ipmi_sim to the
	// machine's serial port, where the simulated getty echoes.
	// Usually the storage profile's count takes a smaller server and r2-n03
	// stays ready; when r2-n03 became ready first, the count already took
	// it and there is nothing to pin.
	const con = "r2-n03" // IPMI in the example inventory, zone-b: pin it to storage
	srv, err = r.run.Store.Server(con)
	if err != nil || srv.BMC.Driver != string(inventory.DriverIPMI) ||
		(srv.Lifecycle != state.LifecycleReady && srv.Lifecycle != state.LifecycleDeployed) {
		t.Fatalf("%s: BMC driver %q, %s (%v); want an IPMI server ready or deployed", con, srv.BMC.Driver, srv.Lifecycle, err)
	}
	if srv.Lifecycle == state.LifecycleReady {
		r.commit("deploy "+con+" (storage)", func(dir string) {
			r.setServer(dir, con, "want", "deployed")
			r.setServer(dir, con, "profile", "storage")
		})
	}
	r.waitFor(con+" deployed and booted", time.Minute, func(s state.Snapshot) bool {
		srv := record(s, con)
		return srv.Lifecycle == state.LifecycleDeployed && !srv.FinishDeploy && r.lab.Machine(con).Phase() == sim.PhaseOS
	})
	typed := uitest.TypeOnConsole(t, ctx, base, con)
	term := uitest.TermText
	if in := string(r.lab.Machine(con).SerialInput()); !strings.Contains(in, "\r"+typed) {
		t.Errorf("%s's serial line received %q, want Enter then %q", con, in, typed)
	}
	uitest.Shot(t, ctx, dir, "sim-console")

	// A second tab (same session cookie) attaches read-only; what it types
	// never reaches the machine, and it sees what the writer types.
	tab, cancelTab := chromedp.NewContext(ctx)
	defer cancelTab()
	rec2 := &uitest.Recorder{}
	rec2.Listen(t, tab)
	uitest.Do(t, tab, "second console tab",
		chromedp.Navigate(base+"/ui/servers/"+con+"/console"),
		uitest.Poll(`document.getElementById("role").dataset.state === "reader"`),
		chromedp.Click(chromedp.CSS(".xterm-screen")),
		uitest.TypeText("reader-typed-this"),
	)
	if role := uitest.Eval[string](t, tab, `document.getElementById("role").textContent`); !strings.Contains(role, "read-only") {
		t.Errorf("second tab role badge = %q", role)
	}
	// The writer types more and presses Enter: the getty's answer starts
	// a new row at column 0 (the typed CR came back as CR LF).
	uitest.Do(t, ctx, "writer types again",
		uitest.TypeText(" second-line"),
		uitest.Poll(term+`.includes("second-line")`),
		uitest.PressEnter(),
		uitest.Poll(`[...document.querySelectorAll(".xterm-rows > div")].some(d => d.textContent.startsWith("Login incorrect"))`),
	)
	uitest.Do(t, tab, "reader sees the writer", uitest.Poll(term+`.includes("second-line")`), uitest.Poll(term+`.includes("Login incorrect")`))
	in := string(r.lab.Machine(con).SerialInput())
	if !strings.Contains(in, "\r"+typed+" second-line\r") {
		t.Errorf("%s's serial line received %q, want %q", con, in, "\r"+typed+" second-line\r")
	}
	if strings.Contains(in, "reader-typed-this") || strings.Contains(uitest.Eval[string](t, ctx, term), "reader-typed-this") {
		t.Error("the read-only tab's typing reached the console")
	}
	roles := map[string]string{}
	evs, err := r.run.Store.Events(state.EventQuery{Server: con, Limit: state.MaxPageSize})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Kind == "console.open" {
			for _, role := range []string{"writer", "reader"} {
				if strings.Contains(e.Message, " as "+role) {
					roles[role] = e.Actor
				}
			}
		}
	}
	if !strings.HasPrefix(roles["writer"], "ui:ui-e2e-") || !strings.HasPrefix(roles["reader"], "ui:ui-e2e-") { // ui: a browser session of that token
		t.Errorf("console.open audit events of %s by role: %q, want writer and reader by the browser session's token", con, roles)
	}
	t.Logf("console of %s (IPMI SOL through ipmi_sim): typed %q, echoed; serial line received %q", con, typed, in)

	// The safety brake: retiring 6 of 12 is held; approve it in the browser.
	snap, err = r.run.Store.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var victims []string
	for _, n := range []string{"r1-n01", "r1-n02", "r1-n03", "r1-n04", "r1-n05", "r2-n01", "r2-n02", "r2-n03", "r2-n04", "r3-n01", "r3-n02"} {
		if record(snap, n).Lifecycle == state.LifecycleReady && len(victims) < 6 {
			victims = append(victims, n)
		}
	}
	if len(victims) != 6 {
		t.Fatalf("only %d ready servers", len(victims))
	}
	r.commit("retire half the fleet", func(dir string) {
		for _, v := range victims {
			r.setServer(dir, v, "want", "retired")
		}
	})
	r.waitFor("retirements held", time.Minute, func(state.Snapshot) bool { return len(r.run.Reconciler.LastPlan().Held) == 6 })
	digest := r.run.Reconciler.Desired().Digest
	uitest.Do(t, ctx, "open the held plan",
		chromedp.Navigate(base+"/ui/inventory"),
		chromedp.WaitVisible(chromedp.CSS("#held")),
	)
	if n := uitest.Eval[int](t, ctx, `document.querySelectorAll("#held tbody tr").length`); n != 6 {
		t.Errorf("inventory page lists %d held steps, want 6", n)
	}
	if b := uitest.Eval[string](t, ctx, `document.body.innerText`); !strings.Contains(b, "retire 6 of 12") {
		t.Errorf("inventory page does not show the brake's reason")
	}
	if a := uitest.Eval[string](t, ctx, `document.getElementById("acting").innerText`); !strings.Contains(a, "retire half the fleet") || strings.Contains(a, "—") {
		t.Errorf("acting revision lacks its commit subject or time:\n%s", a)
	}
	uitest.Shot(t, ctx, dir, "sim-inventory")
	uitest.Do(t, ctx, "approve button",
		chromedp.Click(chromedp.CSS("#approve")),
		chromedp.WaitVisible(chromedp.CSS("#will-happen")),
	)
	shown := uitest.Eval[string](t, ctx, `[...document.querySelectorAll("#will-happen tbody tr")].map(r => r.cells[0].textContent + " " + r.cells[1].textContent).join(",")`)
	for _, v := range victims {
		if !strings.Contains(shown, v+" retire") {
			t.Errorf("confirmation page lacks %s retire: %q", v, shown)
		}
	}
	uitest.Do(t, ctx, "submit unconfirmed", chromedp.Click(chromedp.CSS("#do-approve")))
	if ok, err := r.run.Store.Approved(digest); ok || err != nil {
		t.Fatalf("approved (%v, %v) before the confirmation was ticked", ok, err)
	}
	uitest.Do(t, ctx, "confirm",
		chromedp.Click(chromedp.CSS("#confirm")),
		chromedp.Click(chromedp.CSS("#do-approve")),
		chromedp.WaitVisible(chromedp.CSS("#approved-flash")),
	)
	if ok, err := r.run.Store.Approved(digest); !ok || err != nil {
		t.Fatalf("Store.Approved = %v, %v after the browser approved", ok, err)
	}
	r.waitFor("6 retired", time.Minute, func(s state.Snapshot) bool { return count(s, state.LifecycleRetired) == 6 })
	evs, err = r.run.Store.Events(state.EventQuery{Limit: state.MaxPageSize})
	if err != nil {
		t.Fatal(err)
	}
	approvedBy := ""
	for _, e := range evs {
		if e.Kind == state.EventApproval {
			approvedBy = e.Actor
		}
	}
	if !strings.HasPrefix(approvedBy, "ui-e2e-") {
		t.Errorf("approval event actor = %q, want the browser session's token name", approvedBy)
	}
	uitest.Shot(t, ctx, dir, "sim-approved")

	// Serial console: the simulated Redfish BMCs offer none; the page says so.
	uitest.Do(t, ctx, "console page",
		chromedp.Navigate(base+"/ui/servers/r3-n01/console"),
		chromedp.WaitVisible(chromedp.CSS("#console-unsupported")),
	)
	if b := uitest.Eval[string](t, ctx, `document.getElementById("console-unsupported").textContent`); !strings.Contains(b, "not supported by this BMC") {
		t.Errorf("console page says %q", b)
	}
	if n := uitest.Eval[int](t, ctx, `document.querySelectorAll("#terminal").length`); n != 0 {
		t.Error("console page opened a terminal for a BMC without a serial console")
	}
	uitest.Shot(t, ctx, dir, "sim-console-unsupported")

	// Nothing left the host, no page error, no CSP violation, in either tab.
	bu, _ := url.Parse(base)
	for i, rc := range []*uitest.Recorder{rec, rec2} {
		urls, exc := rc.Snapshot()
		if min := []int{20, 4}[i]; len(urls) < min {
			t.Errorf("recorded only %d requests; the recorder is not working", len(urls))
		}
		for _, raw := range urls {
			u, err := url.Parse(raw)
			if err != nil || (u.Scheme != "data" && u.Host != bu.Host) {
				t.Errorf("request left the controller: %s", raw)
			}
		}
		if len(exc) > 0 {
			t.Errorf("page errors: %q", exc)
		}
	}
	for _, c := range []context.Context{ctx, tab} {
		if v := uitest.Eval[[]string](t, c, `window.__csp`); len(v) > 0 {
			t.Errorf("CSP violations: %q", v)
		}
	}
	urls, _ := rec.Snapshot()
	// Control: an inline script is blocked and reported, so zero means something.
	uitest.Eval[bool](t, ctx, `const s = document.createElement("script"); s.textContent = "window.__ran = 1"; document.body.appendChild(s); true`)
	uitest.Do(t, ctx, "inline script blocked", uitest.Poll(`window.__csp.length === 1`))
	if ran := uitest.Eval[bool](t, ctx, `window.__ran === 1`); ran {
		t.Error("an inline script ran")
	}
	if !slices.ContainsFunc(urls, func(s string) bool { return strings.Contains(s, "/ui/api/v1/events/stream") }) {
		t.Error("the fleet page never opened the event stream")
	}
	t.Logf("%d requests, all to %s; screenshots in %s", len(urls), base, dir)
}
