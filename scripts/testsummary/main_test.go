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
