package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	apiv1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/bmc/ipmi/ipmisim/ipmisimtest"
	"github.com/machina-metal/machina/ui/uitest"
)

// TestBrowserAgainstMachinaSim is the web console's end-to-end test against
// the `machina sim` binary itself, started as a user starts it (built from
// this package, default boot delay and intervals, its own folder): read
// the controller's address and the admin token file from its banner, log
// in at /ui/ in headless Chromium, wait until the example site is
// deployed, then change the fleet the way the banner tells an operator to
// (a commit in the working clone raising r3-n02's commission counter,
// pushed with git) and watch r3-n02's row go ready → commissioning → ready
// on the fleet page through the event stream with no reload, and its health
// cell fill with what the controller's BMC sweep read from its BMC. Pin
// IPMI server r2-n03 to storage with another commit and type on its serial
// console (xterm.js → console WebSocket → ipmitool SOL → ipmi_sim → the
// simulated serial port's getty, which echoes). Commit a revision retiring
// 6 of 12 servers, see it held on the inventory page and approve it there
// (the six then retire). Commit a typo and see the inventory page name
// the file, line and field. Open the
// server page from the row's link and check the hardware facts of the new
// commissioning report (as the admin API reports them) and the BMC read
// model. Every request the browser made went to the controller, no CSP
// violation happened (an injected inline script is the control), and
// SIGINT stops the binary with exit 0.
func TestBrowserAgainstMachinaSim(t *testing.T) {
	ctx := uitest.Browser(t)
	ipmisimtest.RequireTools(t) // the IPMI servers' serial consoles
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Fatalf("git is needed to change the fleet as an operator: %v", err)
	}
	bin := buildMachina(t, t.TempDir())
	dir := t.TempDir()
	sim := startSim(t, bin, dir)
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "controller.log")); err == nil {
				t.Logf("controller log (last 8 KiB):\n%s", b[max(0, len(b)-8192):])
			}
		}
	})

	banner := sim.waitLine(t, regexp.MustCompile(`^  export PATH=\S+:\$PATH MACHINA_API=(\S+) MACHINA_TOKEN=\$\(cat (\S+)\)$`), 2*time.Minute)
	base, tokenPath := banner[1], banner[2]
	tokBytes, err := os.ReadFile(tokenPath)
	if err != nil {
		t.Fatalf("the banner's admin token file: %v", err)
	}
	if fi, err := os.Stat(tokenPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("admin token file mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	tok := strings.TrimSpace(string(tokBytes))
	clone := sim.waitLine(t, regexp.MustCompile(`^\s+your working clone:\s+(\S+)$`), 0)[1]

	rec := &uitest.Recorder{}
	rec.Listen(t, ctx)
	shots := uitest.ScreenshotDir(t)
	uitest.Login(t, ctx, base, tok, `document.querySelectorAll("tr[data-name]").length === 12`)
	sim.waitLine(t, regexp.MustCompile(`^Every profile's count is deployed`), 3*time.Minute)

	const name = "r3-n02"
	cell := `document.querySelector('#srv-` + name + ` [data-field="lifecycle"]')`
	uitest.Do(t, ctx, name+" ready on the page", uitest.Poll(cell+`.textContent.trim() === "ready"`))
	uitest.Eval[bool](t, ctx, `window.__marker = "same page"; window.__seen = [];
	  { const cell = `+cell+`;
	    new MutationObserver(() => window.__seen.push(cell.textContent.trim())).observe(cell, {childList: true, characterData: true, subtree: true}); }
	  true`)
	operatorCommit(t, gitBin, clone, "recommission "+name, func(servers string) string {
		entry := "  - name: " + name + "\n"
		if strings.Count(servers, entry) != 1 {
			t.Fatalf("servers.yaml has %d entries %q", strings.Count(servers, entry), name)
		}
		return strings.Replace(servers, entry, entry+"    actions: {commission: 1}\n", 1)
	})
	uitest.Do(t, ctx, "watch "+name+" commission",
		uitest.Poll(`window.__seen.includes("commissioning")`),
		uitest.Poll(`window.__seen.lastIndexOf("ready") > window.__seen.indexOf("commissioning")`),
	)
	// The BMC sweep's health reading reaches the row through the event
	// stream too, and it is what the admin API says the BMC reported.
	health := `document.querySelector('#srv-` + name + ` [data-field="health"]').textContent.trim()`
	uitest.Do(t, ctx, name+" health from its BMC", uitest.Poll(health+` !== "—"`))
	if got, api := uitest.Eval[string](t, ctx, health), getServer(t, base, tok, name).Health; got != api || api == "" {
		t.Errorf("fleet page shows health %q, the admin API %q", got, api)
	}
	if m := uitest.Eval[string](t, ctx, `window.__marker || ""`); m != "same page" {
		t.Fatal("the fleet page reloaded to show the change")
	}
	t.Logf("%s lifecycle cell showed %q", name, uitest.Eval[[]string](t, ctx, `window.__seen`))
	uitest.Shot(t, ctx, shots, "machina-sim-fleet")

	// The server page shows what the admin API says the new report found.
	srv := getServer(t, base, tok, name)
	if srv.Hardware == nil || srv.Lifecycle != "ready" {
		t.Fatalf("admin API: %s is %s with hardware %v", name, srv.Lifecycle, srv.Hardware)
	}
	uitest.Do(t, ctx, "open the server page",
		chromedp.Click(chromedp.CSS(`a[href="/ui/servers/`+name+`"]`)),
		chromedp.WaitVisible(chromedp.CSS("#bmc")),
		uitest.Poll(`document.querySelectorAll("#bmc dl").length === 1`),
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
		if want == "" || !strings.Contains(body, want) {
			t.Errorf("server page lacks %q", want)
		}
	}
	uitest.Shot(t, ctx, shots, "machina-sim-server")

	// Serial console of IPMI server r2-n03, pinned to the storage profile
	// by an operator commit: keystrokes typed in xterm.js go through the
	// controller's console WebSocket, ipmitool's SOL session and ipmi_sim to
	// the simulated machine's serial port, whose getty echoes them.
	const con = "r2-n03"
	if srv := getServer(t, base, tok, con); srv.Lifecycle == "ready" {
		operatorCommit(t, gitBin, clone, "deploy "+con+" as storage", func(servers string) string {
			entry := "  - name: " + con + "\n"
			if strings.Count(servers, entry) != 1 {
				t.Fatalf("servers.yaml has %d entries %q", strings.Count(servers, entry), con)
			}
			return strings.Replace(servers, entry, entry+"    want: deployed\n    profile: storage\n", 1)
		})
	}
	waitAPI(t, base, tok, con+" deployed and joined", 2*time.Minute, func(list []apiv1.Server) bool {
		for _, s := range list {
			if s.Name == con {
				return s.Lifecycle == "deployed" && !s.FinishDeploy
			}
		}
		return false
	})
	uitest.TypeOnConsole(t, ctx, base, con)
	uitest.Shot(t, ctx, shots, "machina-sim-console")

	// The safety brake: an operator commit retiring 6 ready servers is
	// held; the inventory page lists the held steps, the approve button's
	// page lists each retirement, and the ticked confirmation approves it.
	var victims []string
	for _, s := range listServers(t, base, tok) {
		if s.Lifecycle == "ready" && len(victims) < 6 {
			victims = append(victims, s.Name)
		}
	}
	if len(victims) != 6 {
		t.Fatalf("only %d ready servers: %q", len(victims), victims)
	}
	operatorCommit(t, gitBin, clone, "retire half the fleet", func(servers string) string {
		for _, v := range victims {
			entry := "  - name: " + v + "\n"
			if strings.Count(servers, entry) != 1 {
				t.Fatalf("servers.yaml has %d entries %q", strings.Count(servers, entry), v)
			}
			servers = strings.Replace(servers, entry, entry+"    want: retired\n", 1)
		}
		return servers
	})
	reloadUntil(t, ctx, base+"/ui/inventory", `document.querySelectorAll("#held tbody tr").length === 6`)
	if b := uitest.Eval[string](t, ctx, `document.body.innerText`); !strings.Contains(b, "retire 6 of 12") {
		t.Errorf("inventory page does not give the brake's reason:\n%s", b)
	}
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
	uitest.Do(t, ctx, "confirm and approve",
		chromedp.Click(chromedp.CSS("#confirm")),
		chromedp.Click(chromedp.CSS("#do-approve")),
		chromedp.WaitVisible(chromedp.CSS("#approved-flash")),
	)
	waitAPI(t, base, tok, "6 retired", 2*time.Minute, func(list []apiv1.Server) bool {
		n := 0
		for _, s := range list {
			if slices.Contains(victims, s.Name) && s.Lifecycle == "retired" {
				n++
			}
		}
		return n == 6
	})

	// A bad merge: the inventory page names the file, line and field the
	// validator found, and says the controller stays on the last good
	// revision.
	operatorCommit(t, gitBin, clone, "typo in r1-n01's boot MAC", func(servers string) string {
		old := `bootMAC: "52:54:00:01:00:01"`
		if strings.Count(servers, old) != 1 {
			t.Fatalf("servers.yaml has %d lines %s", strings.Count(servers, old), old)
		}
		return strings.Replace(servers, old, `bootMAC: "52:54:00:01:00"`, 1)
	})
	reloadUntil(t, ctx, base+"/ui/inventory", `document.getElementById("validation") !== null`)
	errs := uitest.Eval[string](t, ctx, `document.getElementById("validation").innerText`)
	if !regexp.MustCompile(`servers\.yaml:\d+:\d+: servers\[0\]\.bootMAC`).MatchString(errs) {
		t.Errorf("inventory page's validation errors do not name servers.yaml:LINE:COL and the field:\n%s", errs)
	}
	if body := uitest.Eval[string](t, ctx, `document.body.innerText`); !strings.Contains(body, "keeps acting on the last good one") || !strings.Contains(body, "typo in r1-n01") {
		t.Errorf("inventory page does not show the newest (invalid) revision and the last good one:\n%s", body)
	}
	uitest.Shot(t, ctx, shots, "machina-sim-inventory")

	// Nothing left the host; no page error; no CSP violation.
	bu, _ := url.Parse(base)
	urls, exc := rec.Snapshot()
	if len(urls) < 10 {
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
	if v := uitest.Eval[[]string](t, ctx, `window.__csp`); len(v) > 0 {
		t.Errorf("CSP violations: %q", v)
	}
	uitest.Eval[bool](t, ctx, `const s = document.createElement("script"); s.textContent = "window.__ran = 1"; document.body.appendChild(s); true`)
	uitest.Do(t, ctx, "inline script blocked", uitest.Poll(`window.__csp.length === 1`))
	if ran := uitest.Eval[bool](t, ctx, `window.__ran === 1`); ran {
		t.Error("an inline script ran")
	}
	t.Logf("%d requests, all to %s; screenshots in %s", len(urls), base, shots)

	if code := sim.interrupt(t, time.Minute); code != 0 {
		t.Errorf("machina sim exited %d after SIGINT\n%s", code, sim.output())
	}
	if out := sim.output(); !strings.Contains(out, "Stopped.") {
		t.Errorf("machina sim did not say it stopped:\n%s", out)
	}
}

// simProcess is a running `machina sim` and the lines it has printed.
type simProcess struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	more  chan struct{} // closed and replaced on each new line
	done  chan struct{} // closed when stdout ends
	exit  chan int
}

// startSim starts bin sim in dir; t.Cleanup sends SIGINT and, if the
// process is still there after a minute, kills it by its PID.
func startSim(t *testing.T, bin, dir string) *simProcess {
	t.Helper()
	cmd := exec.Command(bin, "sim", "--dir", dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &simProcess{cmd: cmd, more: make(chan struct{}), done: make(chan struct{}), exit: make(chan int, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			close(p.more)
			p.more = make(chan struct{})
			p.mu.Unlock()
		}
		close(p.done)
		err := cmd.Wait()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			code = -1
		}
		p.exit <- code
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		if code := p.interrupt(t, time.Minute); code != 0 {
			t.Logf("machina sim exited %d at cleanup", code)
		}
	})
	return p
}

// waitLine waits up to d (zero: only lines already printed) for a line
// matching re and returns its submatches.
func (p *simProcess) waitLine(t *testing.T, re *regexp.Regexp, d time.Duration) []string {
	t.Helper()
	deadline := time.After(d)
	seen := 0
	for {
		p.mu.Lock()
		for ; seen < len(p.lines); seen++ {
			if m := re.FindStringSubmatch(p.lines[seen]); m != nil {
				p.mu.Unlock()
				return m
			}
		}
		more := p.more
		p.mu.Unlock()
		if d == 0 {
			t.Fatalf("machina sim printed no line matching %s:\n%s", re, p.output())
		}
		select {
		case <-more:
		case <-p.done:
			t.Fatalf("machina sim ended before printing %s:\n%s", re, p.output())
		case <-deadline:
			t.Fatalf("machina sim printed no line matching %s within %s:\n%s", re, d, p.output())
		}
	}
}

func (p *simProcess) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// interrupt sends SIGINT (what Ctrl-C sends) to the process by its PID and
// returns its exit code; after d it kills it and fails.
func (p *simProcess) interrupt(t *testing.T, d time.Duration) int {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case code := <-p.exit:
		return code
	case <-time.After(d):
		_ = p.cmd.Process.Kill()
		<-p.exit
		t.Errorf("machina sim (pid %d) did not stop within %s of SIGINT; killed", p.cmd.Process.Pid, d)
		return -1
	}
}

// operatorCommit does what the banner tells an operator: pull, edit
// servers.yaml in the working clone, commit with message and push. A push
// that loses the race with a status commit is pulled again (rebased) and
// retried.
func operatorCommit(t *testing.T, gitBin, clone, message string, edit func(servers string) string) {
	t.Helper()
	git := func(args ...string) error {
		cmd := exec.Command(gitBin, append([]string{"-C", clone}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=Operator", "GIT_AUTHOR_EMAIL=op@example.invalid",
			"GIT_COMMITTER_NAME=Operator", "GIT_COMMITTER_EMAIL=op@example.invalid", "GIT_TERMINAL_PROMPT=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := git("pull", "--rebase", "-q"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(clone, "servers.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(edit(string(b))), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := git("commit", "-q", "-am", message); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		err := git("push", "-q")
		if err == nil {
			return
		}
		if attempt == 10 {
			t.Fatal(err)
		}
		if err := git("pull", "--rebase", "-q"); err != nil {
			t.Fatal(err)
		}
	}
}

// getServer reads name from the admin API with the admin token.
func getServer(t *testing.T, base, tok, name string) apiv1.Server {
	t.Helper()
	var srv apiv1.Server
	apiGet(t, base, tok, "/api/v1/servers/"+name, &srv)
	return srv
}

// apiGet GETs path from the admin API with the admin token and decodes the
// 200 answer into out.
func apiGet(t *testing.T, base, tok, path string, out any) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

// reloadUntil loads url until js is true in it (the controller polls the
// repository every 2 s; the inventory page shows what it has when loaded),
// for at most a minute.
func reloadUntil(t *testing.T, ctx context.Context, url, js string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; {
		uitest.Do(t, ctx, "load "+url, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS("main")))
		if uitest.Eval[bool](t, ctx, js) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never had %s:\n%s", url, js, uitest.Eval[string](t, ctx, `document.body.innerText`))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// listServers reads every server from the admin API.
func listServers(t *testing.T, base, tok string) []apiv1.Server {
	t.Helper()
	var page apiv1.ServerList
	apiGet(t, base, tok, "/api/v1/servers?limit=1000", &page)
	return page.Servers
}

// waitAPI polls the admin API's server list (every 200 ms, up to d) until
// cond holds.
func waitAPI(t *testing.T, base, tok, what string, d time.Duration, cond func([]apiv1.Server) bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		list := listServers(t, base, tok)
		if cond(list) {
			return
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, s := range list {
				fmt.Fprintf(&b, "  %s %s\n", s.Name, s.Lifecycle)
			}
			t.Fatalf("not %s within %s:\n%s", what, d, b.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
