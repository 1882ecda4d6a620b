package ui_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"golang.org/x/net/html"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
	"github.com/machina-metal/machina/ui/uitest"
)

// hostileReason is what a hostile ramdisk puts in a failed test's reason:
// markup, a script, an event handler, terminal escapes and Markdown.
const hostileReason = `<script>window.__pwn=1</script><img src=x onerror="alert(1)"> ` +
	"\x1b[2J\x1b]0;owned\x07 **bold** [click](javascript:alert(1)) `code` </dd><b>x</b>"

// TestMachineTextEscapedInPages: a failed-test reason sent by the machine
// through the real report endpoint reaches the server page (last error,
// history) and the fleet page HTML-escaped: it adds no element, no
// attribute and no script to the page, and reads back as the same text.
func TestMachineTextEscapedInPages(t *testing.T) {
	l := newLab(t, uitest.Options{})
	m, err := api.NewMachine(api.MachineConfig{Store: l.Store})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(l.API); err != nil {
		t.Fatal(err)
	}
	const name, mac = "r9-n66", "52:54:00:00:09:66"
	if _, err := l.Store.CreateServer(state.Server{Name: name, BootMAC: mac, Zone: "zone-a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Store.Transition(name, state.LifecycleNew, state.LifecycleCommissioning, "test"); err != nil {
		t.Fatal(err)
	}
	tok, _, err := l.Store.IssueToken(state.TokenSpec{Purpose: state.PurposeReport, Server: name, MAC: mac})
	if err != nil {
		t.Fatal(err)
	}
	rep := v1.AgentReport{BootMAC: mac,
		Facts: v1.Facts{CPU: v1.CPU{Cores: 8}, Memory: v1.Memory{TotalBytes: 32 << 30}, Disks: []v1.Disk{{Name: "sda", SizeBytes: 200 << 30}}},
		Tests: []v1.TestResult{{Name: v1.TestCPU, Passed: true}, {Name: v1.TestMemory, Passed: true},
			{Name: v1.TestDisk, Passed: false, Reason: hostileReason}, {Name: v1.TestNetwork, Passed: true}}}
	body, _ := json.Marshal(rep)
	req, _ := http.NewRequest(http.MethodPost, l.URL()+v1.PathAgentReport, strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("report: %d", resp.StatusCode)
	}
	if s, _ := l.Store.Server(name); s.Lifecycle != state.LifecycleFailed || !strings.Contains(s.LastError, "<script>") {
		t.Fatalf("server after the report: %s %q", s.Lifecycle, s.LastError)
	}

	c := client(t)
	login(t, l, c)
	for _, page := range []string{"/ui/servers/" + name, "/ui/"} {
		resp, got := get(t, c, l.URL()+page)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s = %d", page, resp.StatusCode)
		}
		if strings.Contains(got, "<script>window.__pwn") || strings.Contains(got, "<img src=x") || strings.Contains(got, "<b>x</b>") {
			t.Errorf("GET %s: the machine's markup is in the page unescaped", page)
		}
		doc, err := html.Parse(strings.NewReader(got))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for n := range doc.Descendants() {
			switch {
			case n.Type == html.ElementNode && (n.Data == "img" || n.Data == "b"):
				t.Errorf("GET %s: an element <%s> came from the machine's text", page, n.Data)
			case n.Type == html.ElementNode && n.Data == "script" && n.FirstChild != nil:
				t.Errorf("GET %s: an inline script: %q", page, n.FirstChild.Data)
			case n.Type == html.ElementNode:
				for _, a := range n.Attr {
					if strings.HasPrefix(a.Key, "on") {
						t.Errorf("GET %s: <%s %s=%q>", page, n.Data, a.Key, a.Val)
					}
				}
			case n.Type == html.TextNode && strings.Contains(n.Data, "<script>window.__pwn=1</script>") && strings.Contains(n.Data, "**bold**"):
				found = true // the text, read back as text
			}
		}
		if page != "/ui/" && !found {
			t.Errorf("GET %s: the reason is not shown as text", page)
		}
	}
}
