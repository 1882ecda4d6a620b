package ui_test

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/machina-metal/machina/ui/uitest"
)

// TestBrowserEndToEnd drives the UI in headless Chromium against the
// in-process lab (uitest, the stand-in for `machina sim`): log in, watch a
// server go commissioning → ready without a reload, filter, open a server
// page, approve the held plan, type on a serial console and see the echo,
// watch read-only from a second tab; then check that every request stayed
// on the test server and that no CSP violation happened.
//
// With MACHINA_UI_E2E_URL and MACHINA_UI_E2E_TOKEN set, it runs against
// that controller instead (e.g. `machina sim` serving the same seed),
// driving transitions through the admin API (uitest.APITarget); the checks
// that read the store directly are then left out.
func TestBrowserEndToEnd(t *testing.T) {
	ctx := uitest.Browser(t)
	if u := os.Getenv("MACHINA_UI_E2E_URL"); u != "" {
		runE2E(t, ctx, &uitest.APITarget{BaseURL: u, AdminToken: os.Getenv("MACHINA_UI_E2E_TOKEN")}, nil)
		return
	}
	l := newLab(t, uitest.Options{})
	runE2E(t, ctx, l, l)
}

func runE2E(t *testing.T, ctx context.Context, target uitest.Target, lab *uitest.Lab) {
	rec := &uitest.Recorder{}
	rec.Listen(t, ctx)
	dir := uitest.ScreenshotDir(t)
	base := target.URL()

	// Log in: the fleet page redirects to the login form and back.
	uitest.Login(t, ctx, base, target.Token(), `document.querySelectorAll("#chart path").length > 0`)

	// Live update without a reload: the marker survives only if the page does.
	uitest.Eval[bool](t, ctx, `window.__marker = "same page"; true`)
	before := uitest.Eval[int](t, ctx, `document.querySelectorAll("#chart path").length > 0 ? window.__csp.length : -1`)
	if before != 0 {
		t.Fatalf("CSP violations before the test acted: %d", before)
	}
	chartBefore := uitest.Eval[string](t, ctx, `[...document.querySelectorAll("#chart path")].map(p => p.getAttribute("d")).join("|")`)
	if err := target.Transition(context.Background(), "r1-n02", "commissioning", "ready", "commissioning report accepted"); err != nil {
		t.Fatal(err)
	}
	uitest.Do(t, ctx, "watch r1-n02 become ready",
		uitest.Poll(`document.querySelector('#srv-r1-n02 [data-field="lifecycle"]').textContent === "ready"`),
		uitest.Poll(`document.querySelector('#counts li[data-lifecycle="commissioning"] .n').textContent === "0"`),
	)
	if m := uitest.Eval[string](t, ctx, `window.__marker || ""`); m != "same page" {
		t.Fatal("the fleet page reloaded to show the change")
	}
	if ev := uitest.Eval[string](t, ctx, `document.querySelector('#srv-r1-n02 [data-field="event"]').textContent`); !strings.Contains(ev, "commissioning → ready") {
		t.Errorf("last event cell = %q", ev)
	}
	if after := uitest.Eval[string](t, ctx, `[...document.querySelectorAll("#chart path")].map(p => p.getAttribute("d")).join("|")`); after == chartBefore {
		t.Error("the lifecycle chart did not change with the transition")
	}
	uitest.Shot(t, ctx, dir, "fleet")

	// Filters and search.
	uitest.Do(t, ctx, "search r3", chromedp.SendKeys(chromedp.CSS("#q"), "r3-"))
	vis := uitest.Eval[string](t, ctx, `[...document.querySelectorAll("tr[data-name]")].filter(r => !r.classList.contains("hidden")).map(r => r.dataset.name).join(",")`)
	if vis != "r3-n01,r3-n02,r3-n03" {
		t.Errorf("search r3- shows %q", vis)
	}
	hiddenZones := uitest.Eval[int](t, ctx, `document.querySelectorAll("section.zone.hidden").length`)
	if hiddenZones != 2 {
		t.Errorf("search r3- hides %d zones, want 2", hiddenZones)
	}
	uitest.Eval[bool](t, ctx, `for (const [id, v] of [["q", ""], ["f-lifecycle", "failed"]]) {
	  const e = document.getElementById(id); e.value = v; e.dispatchEvent(new Event("input")); } true`)
	if vis := uitest.Eval[string](t, ctx, `[...document.querySelectorAll("tr[data-name]")].filter(r => !r.classList.contains("hidden")).map(r => r.dataset.name).join(",")`); vis != "r2-n02" {
		t.Errorf("lifecycle=failed shows %q", vis)
	}

	// Server page: identity, BMC read model, events.
	uitest.Do(t, ctx, "open a server page",
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`a[href="/ui/servers/r1-n03"]`)),
		chromedp.Click(chromedp.CSS(`a[href="/ui/servers/r1-n03"]`)),
		chromedp.WaitVisible(chromedp.CSS("#bmc")),
	)
	body := uitest.Eval[string](t, ctx, `document.body.innerText`)
	for _, want := range []string{"CPU1 Temp", "312 W", "hypervisor", "br-mgmt: vlan 10", "deploying → deployed"} {
		if !strings.Contains(body, want) {
			t.Errorf("server page lacks %q", want)
		}
	}
	uitest.Shot(t, ctx, dir, "server")
	// The timeline is live too.
	if err := target.Transition(context.Background(), "r1-n03", "deployed", "ready", "released"); err != nil {
		t.Fatal(err)
	}
	uitest.Do(t, ctx, "server page live", uitest.Poll(`document.getElementById("lifecycle").textContent === "ready"`),
		uitest.Poll(`document.querySelector("#timeline li").textContent.includes("deployed → ready")`))

	// Inventory: approve the held plan after the confirmation page.
	uitest.Do(t, ctx, "open the held plan",
		chromedp.Navigate(base+"/ui/inventory"),
		chromedp.WaitVisible(chromedp.CSS("#held")),
	)
	uitest.Shot(t, ctx, dir, "inventory")
	if lab != nil {
		// The Git side (the lab's seed: a write-back refused 4 times).
		uitest.Do(t, ctx, "the Git table", chromedp.ScrollIntoView(chromedp.CSS("#git")),
			uitest.Poll(`document.querySelector("#git-push").textContent.includes("pre-receive hook declined")`))
		uitest.Shot(t, ctx, dir, "inventory-git")
	}
	uitest.Do(t, ctx, "approve the held plan",
		chromedp.Click(chromedp.CSS("#approve")),
		chromedp.WaitVisible(chromedp.CSS("#will-happen")),
	)
	if n := uitest.Eval[int](t, ctx, `document.querySelectorAll("#will-happen tbody tr").length`); n != 3 {
		t.Errorf("confirmation lists %d steps, want 3", n)
	}
	// Submitting without ticking the box is refused by the form itself.
	uitest.Do(t, ctx, "submit unconfirmed", chromedp.Click(chromedp.CSS("#do-approve")))
	if loc := uitest.Eval[string](t, ctx, `location.pathname`); loc != "/ui/inventory/approve" {
		t.Errorf("unconfirmed submit went to %s", loc)
	}
	if lab != nil {
		if ok, _ := lab.Store.Approved(uitest.HeldDigest); ok {
			t.Fatal("approved before confirming")
		}
	}
	uitest.Do(t, ctx, "confirm",
		chromedp.Click(chromedp.CSS("#confirm")),
		chromedp.Click(chromedp.CSS("#do-approve")),
		chromedp.WaitVisible(chromedp.CSS("#approved-flash")),
	)
	if lab != nil {
		if ok, err := lab.Store.Approved(uitest.HeldDigest); !ok || err != nil {
			t.Fatalf("Store.Approved = %v, %v after the browser approved", ok, err)
		}
	}

	// Images and hosts pages.
	uitest.Do(t, ctx, "images", chromedp.Navigate(base+"/ui/images"), chromedp.WaitVisible(chromedp.CSS("#images")))
	if v := uitest.Eval[float64](t, ctx, `document.querySelector('tr[data-image="ubuntu-24.04"] progress').value`); v != 42 {
		t.Errorf("ubuntu-24.04 progress = %v, want 42", v)
	}
	uitest.Shot(t, ctx, dir, "images")
	// The page polls while an import runs: the bar fills and the state turns verified, no reload.
	uitest.Do(t, ctx, "import progress", uitest.Poll(`document.querySelector('tr[data-image="ubuntu-24.04"] [data-field="state"] .st').textContent === "verified"`),
		uitest.Poll(`document.querySelector('tr[data-image="ubuntu-24.04"] progress').value === 100`))
	uitest.Do(t, ctx, "hosts", chromedp.Navigate(base+"/ui/hosts"), chromedp.WaitVisible(chromedp.CSS(`tr[data-host="hv-r1-n03"]`)))
	uitest.Shot(t, ctx, dir, "hosts")

	// Serial console: type, see the echo.
	uitest.Do(t, ctx, "open the console",
		chromedp.Navigate(base+"/ui/servers/r1-n01/console"),
		chromedp.WaitVisible(chromedp.CSS(".xterm-helper-textarea"), chromedp.NodeReady),
		uitest.Poll(`document.getElementById("role").dataset.state === "writer"`),
		chromedp.Click(chromedp.CSS(".xterm-screen")),
		uitest.PressEnter(),
		uitest.Poll(`document.querySelector(".xterm-rows").textContent.includes("r1-n01 login:")`),
		uitest.TypeText("operator-typed-this"),
		uitest.Poll(`document.querySelector(".xterm-rows").textContent.includes("operator-typed-this")`),
	)
	uitest.Shot(t, ctx, dir, "console")

	// A second tab (same browser, same session cookie) is read-only.
	tab, cancelTab := chromedp.NewContext(ctx)
	defer cancelTab()
	rec2 := &uitest.Recorder{}
	rec2.Listen(t, tab)
	uitest.Do(t, tab, "second console tab",
		chromedp.Navigate(base+"/ui/servers/r1-n01/console"),
		uitest.Poll(`document.getElementById("role").dataset.state === "reader"`),
		chromedp.Click(chromedp.CSS(".xterm-screen")),
		uitest.TypeText("reader-typed-this"),
	)
	if role := uitest.Eval[string](t, tab, `document.getElementById("role").textContent`); !strings.Contains(role, "read-only") {
		t.Errorf("second tab role badge = %q", role)
	}
	// The writer types once more; both see it, and the reader's text never reached the console.
	uitest.Do(t, ctx, "writer types again",
		uitest.TypeText(" second-line"),
		uitest.Poll(`document.querySelector(".xterm-rows").textContent.includes("second-line")`),
	)
	uitest.Do(t, tab, "reader sees the writer", uitest.Poll(`document.querySelector(".xterm-rows").textContent.includes("second-line")`))
	if got := uitest.Eval[string](t, ctx, `document.querySelector(".xterm-rows").textContent`); strings.Contains(got, "reader-typed-this") {
		t.Error("the read-only tab's typing reached the console")
	}

	// Nothing left the host, no script error, no CSP violation.
	for i, r := range []*uitest.Recorder{rec, rec2} {
		urls, exc := r.Snapshot()
		if min := []int{20, 4}[i]; len(urls) < min {
			t.Errorf("recorded only %d requests; the recorder is not working", len(urls))
		}
		bu, _ := url.Parse(base)
		for _, raw := range urls {
			u, err := url.Parse(raw)
			if err != nil || (u.Scheme != "data" && u.Host != bu.Host) {
				t.Errorf("request left the test server: %s", raw)
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
	if lab != nil && lab.UI.CSPReports() != 0 {
		t.Errorf("the server received %d CSP reports", lab.UI.CSPReports())
	}

	// Control: an inline script injected now is blocked and reported, so
	// the zero counts above mean something.
	uitest.Eval[bool](t, ctx, `const s = document.createElement("script"); s.textContent = "window.__ran = 1"; document.body.appendChild(s); true`)
	uitest.Do(t, ctx, "inline script blocked", uitest.Poll(`window.__csp.length === 1`))
	if ran := uitest.Eval[bool](t, ctx, `window.__ran === 1`); ran {
		t.Error("an inline script ran")
	}
	if lab != nil {
		deadline := time.Now().Add(10 * time.Second)
		for lab.UI.CSPReports() == 0 && time.Now().Before(deadline) {
			// One round trip to the server per check (awaited): polling, not sleeping.
			if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`fetch("/ui/static/app.css").then(() => true)`, chromedp.EvalAwaitPromise)); err != nil {
				t.Fatal(err)
			}
		}
		if lab.UI.CSPReports() != 1 {
			t.Errorf("server CSP reports after the control = %d, want 1", lab.UI.CSPReports())
		}
	}
	urls, _ := rec.Snapshot()
	t.Logf("%d requests, all to %s", len(urls), base)
}
