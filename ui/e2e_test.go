package ui_test

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/machina-metal/machina/ui/uitest"
)

// chromiumPath is Debian's chromium (packages chromium and chromium-driver,
// installed by .ci/run); no browser is downloaded.
const chromiumPath = "/usr/bin/chromium"

// cspWatch is installed in every document before the page's own scripts
// (Page.addScriptToEvaluateOnNewDocument runs outside the page's CSP): it
// records securitypolicyviolation events so the test can read them.
const cspWatch = `window.__csp = []; document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(e.violatedDirective + " " + e.blockedURI + " " + e.sourceFile + ":" + e.lineNumber));`

// browser starts headless Chromium with a fresh profile and the flags that
// keep it off the network (no background networking, component updates,
// sync or QUIC; see /work/.library/env/machines/go.md).
func browser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s missing in CI: .ci/run installs Debian's chromium", chromiumPath)
		}
		t.Skipf("%s not installed (apt-get install chromium chromium-driver)", chromiumPath)
	}
	if _, err := exec.LookPath("chromedriver"); err != nil && os.Getenv("CI") == "true" {
		t.Fatalf("chromedriver missing in CI: .ci/run installs chromium-driver")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-features", "Translate,OptimizationHints,MediaRouter"),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 860),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelB()
		cancelA()
	})
	return ctx
}

// recorder keeps every URL the page asked for (HTTP and WebSocket), the
// page's uncaught exceptions and console errors.
type recorder struct {
	mu         sync.Mutex
	urls       []string
	exceptions []string
}

func (r *recorder) listen(t *testing.T, ctx context.Context) {
	t.Helper()
	err := chromedp.Listen(ctx, func(ev any) {
		r.mu.Lock()
		defer r.mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			r.urls = append(r.urls, ev.Request.URL)
		case *network.EventWebSocketCreated:
			r.urls = append(r.urls, ev.URL)
		case *runtime.EventExceptionThrown:
			r.exceptions = append(r.exceptions, ev.ExceptionDetails.Text+" "+ev.ExceptionDetails.URL)
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				r.exceptions = append(r.exceptions, "console.error")
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, runtime.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: cspWatch}); err != nil {
		t.Fatal(err)
	}
}

func (r *recorder) snapshot() ([]string, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.urls...), append([]string(nil), r.exceptions...)
}

// screenshots is where the test writes PNGs of the main pages:
// $MACHINA_UI_SCREENSHOTS (docs/screenshots to refresh the committed one),
// else a temporary folder.
func screenshots(t *testing.T) string {
	if d := os.Getenv("MACHINA_UI_SCREENSHOTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

func shot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s.png: %d bytes", name, len(png))
}

func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, steps...); err != nil {
		loc, _ := chromedp.Run(ctx, chromedp.Location())
		text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 600) + "\nCSP: " + JSON.stringify(window.__csp)`))
		t.Fatalf("%s: %v (at %s)\n%s", what, err, loc, text)
	}
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// typeText types text into the focused element as the keyboard's text
// input (Input.insertText), which xterm.js turns into one onData call.
func typeText(text string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, input.InsertText, input.InsertTextParams{Text: text})
		return err
	})
}

// pressEnter sends one Enter key press (keyDown with its text, keyUp).
func pressEnter() chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		down := input.DispatchKeyEventParams{Type: input.DispatchKeyEventTypeKeyDown, Key: "Enter", Code: "Enter", WindowsVirtualKeyCode: 13, NativeVirtualKeyCode: 13, Text: "\r"}
		if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, down); err != nil {
			return err
		}
		up := input.DispatchKeyEventParams{Type: input.DispatchKeyEventTypeKeyUp, Key: "Enter", Code: "Enter", WindowsVirtualKeyCode: 13, NativeVirtualKeyCode: 13}
		_, err := cdp.Call(ctx, t, input.DispatchKeyEvent, up)
		return err
	})
}

func poll(js string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(20*time.Second), chromedp.WithPollingInterval(50*time.Millisecond))
}

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
	ctx := browser(t)
	if u := os.Getenv("MACHINA_UI_E2E_URL"); u != "" {
		runE2E(t, ctx, &uitest.APITarget{BaseURL: u, AdminToken: os.Getenv("MACHINA_UI_E2E_TOKEN")}, nil)
		return
	}
	l := newLab(t, uitest.Options{})
	runE2E(t, ctx, l, l)
}

func runE2E(t *testing.T, ctx context.Context, target uitest.Target, lab *uitest.Lab) {
	rec := &recorder{}
	rec.listen(t, ctx)
	dir := screenshots(t)
	base := target.URL()

	// Log in: the fleet page redirects to the login form and back.
	do(t, ctx, "login",
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), target.Token()),
		chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS(`#live[data-state="live"]`)),
		poll(`document.querySelectorAll("#chart path").length > 0`),
	)
	if got := eval[string](t, ctx, `document.cookie`); got != "" {
		t.Errorf("document.cookie = %q: the session cookie must be HttpOnly", got)
	}

	// Live update without a reload: the marker survives only if the page does.
	eval[bool](t, ctx, `window.__marker = "same page"; true`)
	before := eval[int](t, ctx, `document.querySelectorAll("#chart path").length > 0 ? window.__csp.length : -1`)
	if before != 0 {
		t.Fatalf("CSP violations before the test acted: %d", before)
	}
	chartBefore := eval[string](t, ctx, `[...document.querySelectorAll("#chart path")].map(p => p.getAttribute("d")).join("|")`)
	if err := target.Transition(context.Background(), "r1-n02", "commissioning", "ready", "commissioning report accepted"); err != nil {
		t.Fatal(err)
	}
	do(t, ctx, "watch r1-n02 become ready",
		poll(`document.querySelector('#srv-r1-n02 [data-field="lifecycle"]').textContent === "ready"`),
		poll(`document.querySelector('#counts li[data-lifecycle="commissioning"] .n').textContent === "0"`),
	)
	if m := eval[string](t, ctx, `window.__marker || ""`); m != "same page" {
		t.Fatal("the fleet page reloaded to show the change")
	}
	if ev := eval[string](t, ctx, `document.querySelector('#srv-r1-n02 [data-field="event"]').textContent`); !strings.Contains(ev, "commissioning → ready") {
		t.Errorf("last event cell = %q", ev)
	}
	if after := eval[string](t, ctx, `[...document.querySelectorAll("#chart path")].map(p => p.getAttribute("d")).join("|")`); after == chartBefore {
		t.Error("the lifecycle chart did not change with the transition")
	}
	shot(t, ctx, dir, "fleet")

	// Filters and search.
	do(t, ctx, "search r3", chromedp.SendKeys(chromedp.CSS("#q"), "r3-"))
	vis := eval[string](t, ctx, `[...document.querySelectorAll("tr[data-name]")].filter(r => !r.classList.contains("hidden")).map(r => r.dataset.name).join(",")`)
	if vis != "r3-n01,r3-n02,r3-n03" {
		t.Errorf("search r3- shows %q", vis)
	}
	hiddenZones := eval[int](t, ctx, `document.querySelectorAll("section.zone.hidden").length`)
	if hiddenZones != 2 {
		t.Errorf("search r3- hides %d zones, want 2", hiddenZones)
	}
	eval[bool](t, ctx, `for (const [id, v] of [["q", ""], ["f-lifecycle", "failed"]]) {
	  const e = document.getElementById(id); e.value = v; e.dispatchEvent(new Event("input")); } true`)
	if vis := eval[string](t, ctx, `[...document.querySelectorAll("tr[data-name]")].filter(r => !r.classList.contains("hidden")).map(r => r.dataset.name).join(",")`); vis != "r2-n02" {
		t.Errorf("lifecycle=failed shows %q", vis)
	}

	// Server page: identity, BMC read model, events.
	do(t, ctx, "open a server page",
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`a[href="/ui/servers/r1-n03"]`)),
		chromedp.Click(chromedp.CSS(`a[href="/ui/servers/r1-n03"]`)),
		chromedp.WaitVisible(chromedp.CSS("#bmc")),
	)
	body := eval[string](t, ctx, `document.body.innerText`)
	for _, want := range []string{"CPU1 Temp", "312 W", "hypervisor", "br-mgmt: vlan 10", "deploying → deployed"} {
		if !strings.Contains(body, want) {
			t.Errorf("server page lacks %q", want)
		}
	}
	shot(t, ctx, dir, "server")
	// The timeline is live too.
	if err := target.Transition(context.Background(), "r1-n03", "deployed", "ready", "released"); err != nil {
		t.Fatal(err)
	}
	do(t, ctx, "server page live", poll(`document.getElementById("lifecycle").textContent === "ready"`),
		poll(`document.querySelector("#timeline li").textContent.includes("deployed → ready")`))

	// Inventory: approve the held plan after the confirmation page.
	do(t, ctx, "open the held plan",
		chromedp.Navigate(base+"/ui/inventory"),
		chromedp.WaitVisible(chromedp.CSS("#held")),
	)
	shot(t, ctx, dir, "inventory")
	do(t, ctx, "approve the held plan",
		chromedp.Click(chromedp.CSS("#approve")),
		chromedp.WaitVisible(chromedp.CSS("#will-happen")),
	)
	if n := eval[int](t, ctx, `document.querySelectorAll("#will-happen tbody tr").length`); n != 3 {
		t.Errorf("confirmation lists %d steps, want 3", n)
	}
	// Submitting without ticking the box is refused by the form itself.
	do(t, ctx, "submit unconfirmed", chromedp.Click(chromedp.CSS("#do-approve")))
	if loc := eval[string](t, ctx, `location.pathname`); loc != "/ui/inventory/approve" {
		t.Errorf("unconfirmed submit went to %s", loc)
	}
	if lab != nil {
		if ok, _ := lab.Store.Approved(uitest.HeldDigest); ok {
			t.Fatal("approved before confirming")
		}
	}
	do(t, ctx, "confirm",
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
	do(t, ctx, "images", chromedp.Navigate(base+"/ui/images"), chromedp.WaitVisible(chromedp.CSS("#images")))
	if v := eval[float64](t, ctx, `document.querySelector('tr[data-image="ubuntu-24.04"] progress').value`); v != 42 {
		t.Errorf("ubuntu-24.04 progress = %v, want 42", v)
	}
	shot(t, ctx, dir, "images")
	// The page polls while an import runs: the bar fills and the state turns verified, no reload.
	do(t, ctx, "import progress", poll(`document.querySelector('tr[data-image="ubuntu-24.04"] [data-field="state"] .st').textContent === "verified"`),
		poll(`document.querySelector('tr[data-image="ubuntu-24.04"] progress').value === 100`))
	do(t, ctx, "hosts", chromedp.Navigate(base+"/ui/hosts"), chromedp.WaitVisible(chromedp.CSS(`tr[data-host="hv-r1-n03"]`)))
	shot(t, ctx, dir, "hosts")

	// Serial console: type, see the echo.
	do(t, ctx, "open the console",
		chromedp.Navigate(base+"/ui/servers/r1-n01/console"),
		chromedp.WaitVisible(chromedp.CSS(".xterm-helper-textarea"), chromedp.NodeReady),
		poll(`document.getElementById("role").dataset.state === "writer"`),
		chromedp.Click(chromedp.CSS(".xterm-screen")),
		pressEnter(),
		poll(`document.querySelector(".xterm-rows").textContent.includes("r1-n01 login:")`),
		typeText("operator-typed-this"),
		poll(`document.querySelector(".xterm-rows").textContent.includes("operator-typed-this")`),
	)
	shot(t, ctx, dir, "console")

	// A second tab (same browser, same session cookie) is read-only.
	tab, cancelTab := chromedp.NewContext(ctx)
	defer cancelTab()
	rec2 := &recorder{}
	rec2.listen(t, tab)
	do(t, tab, "second console tab",
		chromedp.Navigate(base+"/ui/servers/r1-n01/console"),
		poll(`document.getElementById("role").dataset.state === "reader"`),
		chromedp.Click(chromedp.CSS(".xterm-screen")),
		typeText("reader-typed-this"),
	)
	if role := eval[string](t, tab, `document.getElementById("role").textContent`); !strings.Contains(role, "read-only") {
		t.Errorf("second tab role badge = %q", role)
	}
	// The writer types once more; both see it, and the reader's text never reached the console.
	do(t, ctx, "writer types again",
		typeText(" second-line"),
		poll(`document.querySelector(".xterm-rows").textContent.includes("second-line")`),
	)
	do(t, tab, "reader sees the writer", poll(`document.querySelector(".xterm-rows").textContent.includes("second-line")`))
	if got := eval[string](t, ctx, `document.querySelector(".xterm-rows").textContent`); strings.Contains(got, "reader-typed-this") {
		t.Error("the read-only tab's typing reached the console")
	}

	// Nothing left the host, no script error, no CSP violation.
	for i, r := range []*recorder{rec, rec2} {
		urls, exc := r.snapshot()
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
		if v := eval[[]string](t, c, `window.__csp`); len(v) > 0 {
			t.Errorf("CSP violations: %q", v)
		}
	}
	if lab != nil && lab.UI.CSPReports() != 0 {
		t.Errorf("the server received %d CSP reports", lab.UI.CSPReports())
	}

	// Control: an inline script injected now is blocked and reported, so
	// the zero counts above mean something.
	eval[bool](t, ctx, `const s = document.createElement("script"); s.textContent = "window.__ran = 1"; document.body.appendChild(s); true`)
	do(t, ctx, "inline script blocked", poll(`window.__csp.length === 1`))
	if ran := eval[bool](t, ctx, `window.__ran === 1`); ran {
		t.Error("an inline script ran")
	}
	if lab != nil {
		deadline := time.Now().Add(10 * time.Second)
		for lab.UI.CSPReports() == 0 && time.Now().Before(deadline) {
			// One round trip to the server per check: polling, not sleeping.
			eval[bool](t, ctx, `fetch("/ui/static/app.css").then(() => true)`)
		}
		if lab.UI.CSPReports() != 1 {
			t.Errorf("server CSP reports after the control = %d, want 1", lab.UI.CSPReports())
		}
	}
	urls, _ := rec.snapshot()
	t.Logf("%d requests, all to %s", len(urls), base)
}
