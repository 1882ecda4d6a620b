package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestReport: counts come from the events (subtests included), failed
// tests' output is printed, skips are listed with their reason.
func TestReport(t *testing.T) {
	in := `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"run","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:9: boom\n"}
{"Action":"output","Package":"p","Test":"TestB","Output":"--- FAIL: TestB (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestB"}
{"Action":"run","Package":"p","Test":"TestC/sub"}
{"Action":"output","Package":"p","Test":"TestC/sub","Output":"    c_test.go:3: ipmi_sim not in PATH\n"}
{"Action":"output","Package":"p","Test":"TestC/sub","Output":"--- SKIP: TestC/sub (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestC/sub"}
{"Action":"pass","Package":"p","Test":"TestC"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.1s\n"}
{"Action":"fail","Package":"p"}
{"Action":"output","Package":"q","Output":"ok  \tq\t0.1s\n"}
{"Action":"pass","Package":"q"}
`
	var w bytes.Buffer
	c := report(strings.NewReader(in), &w)
	if c.packages != 2 || c.pkgFailed != 1 || c.passed != 2 || c.failed != 1 || c.skipped != 1 {
		t.Fatalf("counts = %+v", c)
	}
	for _, want := range []string{"b_test.go:9: boom", "FAIL\tp", "ok  \tq"} {
		if !strings.Contains(w.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, w.String())
		}
	}
	if strings.Contains(w.String(), "=== RUN   TestA") {
		t.Errorf("passing test's output printed:\n%s", w.String())
	}
	if len(c.skips) != 1 || !strings.Contains(c.skips[0], "ipmi_sim not in PATH") {
		t.Errorf("skips = %q", c.skips)
	}
}

// TestFailedMessagesRepeated: a failed test's own messages (t.Error and
// t.Log lines with their continuation lines) are kept for the end of the
// report; the logs of the code it ran (slog lines) are not, and only the
// last maxMessages are kept.
func TestFailedMessagesRepeated(t *testing.T) {
	lines := []string{
		"=== RUN   TestX\n",
		"    x_test.go:10: first message\n",
		"    time=2026-12-07T19:31:39.973Z level=INFO msg=\"controller log\"\n",
		"    x_test.go:20: wanted a, got:\n",
		"        line one of the dump\n",
		"    helper.go:7: time=2026 level=WARN msg=logged\n",
		"        time=2026 level=INFO msg=\"indented log\"\n",
		"    --- FAIL: TestX/sub (0.00s)\n",
		"        x_test.go:30: subtest failure\n",
		"--- FAIL: TestX (0.00s)\n",
	}
	got := testMessages(lines, 10)
	want := []string{lines[1], lines[3], lines[4], lines[8]}
	if strings.Join(got, "") != strings.Join(want, "") {
		t.Errorf("testMessages =\n%s\nwant\n%s", strings.Join(got, ""), strings.Join(want, ""))
	}
	if got := testMessages(lines, 2); len(got) != 2 || got[1] != lines[8] {
		t.Errorf("testMessages with max 2 = %q", got)
	}
	in := `{"Action":"run","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:9: boom\n"}
{"Action":"output","Package":"p","Test":"TestB","Output":"    time=x level=INFO msg=noise\n"}
{"Action":"output","Package":"p","Test":"TestB","Output":"--- FAIL: TestB (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestB"}
`
	c := report(strings.NewReader(in), &bytes.Buffer{})
	if m := c.messages["p TestB"]; len(m) != 1 || m[0] != "    b_test.go:9: boom\n" {
		t.Errorf("messages of the failed test = %q", m)
	}
}
