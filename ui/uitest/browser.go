package uitest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/machina-metal/machina/internal/peertest"
)

// ChromiumPath is Debian's chromium (packages chromium and chromium-driver,
// installed by .ci/run); no browser is downloaded.
const ChromiumPath = "/usr/bin/chromium"

// cspWatch is installed in every document before the page's own scripts
// (Page.addScriptToEvaluateOnNewDocument runs outside the page's CSP): it
// records securitypolicyviolation events in window.__csp so tests can
// read them.
const cspWatch = `window.__csp = []; document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(e.violatedDirective + " " + e.blockedURI + " " + e.sourceFile + ":" + e.lineNumber));`

// Browser starts headless Chromium (ChromiumPath) with a fresh profile and
// the flags that keep it off the network (no background networking,
// component updates, sync or QUIC) and returns its first tab's context; the
// browser is stopped by t.Cleanup. Without Chromium it fails naming the
// Debian package (skips only in the quick mode, internal/peertest).
func Browser(t testing.TB) context.Context {
	t.Helper()
	peertest.File(t, ChromiumPath, "chromium")
	peertest.Command(t, "chromedriver")
	home := t.TempDir()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(ChromiumPath),
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
		// Its own HOME and XDG folders: with --user-data-dir alone,
		// Chromium still writes ~/.config/chromium/Crash Reports and GLib
		// ~/.cache/dconf, which the suite's leftover check (scripts/fscheck.sh)
		// found on a fresh machine.
		chromedp.Env("HOME="+home, "XDG_CONFIG_HOME="+home+"/.config", "XDG_CACHE_HOME="+home+"/.cache", "XDG_DATA_HOME="+home+"/.local/share", "XDG_RUNTIME_DIR="+home),
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

// Recorder keeps every URL a tab asked for (HTTP requests and WebSockets),
// the page's uncaught exceptions and console.error calls. Start it with
// Listen before the tab navigates.
type Recorder struct {
	mu         sync.Mutex
	urls       []string
	exceptions []string
}

// Listen subscribes r to ctx's tab (Network and Runtime domains) and
// installs the CSP violation recorder (window.__csp) in every document the
// tab loads from now on.
func (r *Recorder) Listen(t testing.TB, ctx context.Context) {
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

// Snapshot returns copies of the URLs and the page errors recorded so far.
func (r *Recorder) Snapshot() (urls, pageErrors []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.urls...), append([]string(nil), r.exceptions...)
}

// ScreenshotDir is where tests write PNGs of the pages:
// $MACHINA_UI_SCREENSHOTS (created if needed), else a temporary folder.
func ScreenshotDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("MACHINA_UI_SCREENSHOTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// Shot writes a PNG screenshot of ctx's tab as dir/name.png.
func Shot(t testing.TB, ctx context.Context, dir, name string) {
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

// Do runs steps in ctx's tab within StepTimeout; on error it fails the
// test with the tab's location, the start of the page's text and the CSP
// violations recorded.
func Do(t testing.TB, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, StepTimeout)
	defer cancel()
	if err := chromedp.Do(sctx, steps...); err != nil {
		loc, _ := chromedp.Run(ctx, chromedp.Location())
		text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 800) + "\nCSP: " + JSON.stringify(window.__csp)`))
		t.Fatalf("%s: %v (at %s)\n%s", what, err, loc, text)
	}
}

// StepTimeout bounds one Do call and one Poll.
const StepTimeout = time.Minute

// Eval evaluates js in ctx's tab and returns its value as T; errors fail
// the test.
func Eval[T any](t testing.TB, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// Poll waits (every 50 ms, up to StepTimeout) until js is truthy in the
// page: it polls the page's state, it does not sleep for a fixed time.
func Poll(js string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(StepTimeout), chromedp.WithPollingInterval(50*time.Millisecond))
}

// TypeText types text into the focused element as the keyboard's text
// input (Input.insertText), which xterm.js turns into one onData call.
func TypeText(text string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, input.InsertText, input.InsertTextParams{Text: text})
		return err
	})
}

// PressEnter sends one Enter key press (keyDown with its text "\r", keyUp)
// to the focused element.
func PressEnter() chromedp.Action[chromedp.Void] {
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

// TermText is a JS expression for the text of the xterm.js terminal on the
// console page.
const TermText = `document.querySelector(".xterm-rows").textContent`

// TypeOnConsole opens server's page at base, opens its serial console (it
// must get the writer's seat), presses Enter, waits for the getty's
// "SERVER login:" prompt and types a unique string, waiting for its echo;
// it returns the string typed. The tests that drive a real console behind
// ipmi_sim (lab/sim, cmd/machina) share it.
func TypeOnConsole(t testing.TB, ctx context.Context, base, server string) string {
	t.Helper()
	typed := fmt.Sprintf("typed-in-chromium-%d", time.Now().UnixNano()%1e6)
	Do(t, ctx, "type on the console of "+server,
		chromedp.Navigate(base+"/ui/servers/"+server),
		chromedp.WaitVisible(chromedp.CSS("#open-console")),
		chromedp.Click(chromedp.CSS("#open-console")),
		chromedp.WaitVisible(chromedp.CSS(".xterm-helper-textarea"), chromedp.NodeReady),
		Poll(`document.getElementById("role").dataset.state === "writer"`),
		chromedp.Click(chromedp.CSS(".xterm-screen")),
		PressEnter(),
		Poll(TermText+`.includes("`+server+` login:")`),
		TypeText(typed),
		Poll(TermText+`.includes("`+typed+`")`),
	)
	return typed
}

// Login signs in through the web console's real login form at base with
// token, waits for the live event stream and for ready (a JavaScript
// condition, e.g. the fleet table's rows), and fails t when the session
// cookie is readable from JavaScript (it must be HttpOnly).
func Login(t testing.TB, ctx context.Context, base, token, ready string) {
	t.Helper()
	Do(t, ctx, "login",
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS(`#live[data-state="live"]`)),
		Poll(ready),
	)
	if got := Eval[string](t, ctx, `document.cookie`); got != "" {
		t.Errorf("document.cookie = %q: the session cookie must be HttpOnly", got)
	}
}
