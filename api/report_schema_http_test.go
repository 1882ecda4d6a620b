package api_test

import (
	"net/http"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// TestReportSchemaGatesTheToken: the report endpoint checks the body
// against schema/agent-report.schema.json before the token is used: a
// report only the schema refuses (a 10,000-character test reason, a
// 1,000-character DMI vendor) is answered 400 naming the schema, the
// server stays commissioning and the token still takes the good report.
// Before, those reports were accepted and stored.
func TestReportSchemaGatesTheToken(t *testing.T) {
	f := machineFixture(t, nil)
	walk(t, f, state.LifecycleCommissioning)
	tok := issueFor(t, f, state.PurposeReport)
	long := goodReport()
	long.Tests[2] = v1.TestResult{Name: v1.TestDisk, Passed: false, Reason: strings.Repeat("x", 10000)}
	vendor := goodReport()
	vendor.Facts.DMI.SystemVendor = strings.Repeat("v", 1000)
	for name, rep := range map[string]v1.AgentReport{"long reason": long, "long vendor": vendor} {
		code, _, b := f.do(t, http.MethodPost, v1.PathAgentReport, tok, mustJSON(t, rep))
		if code != http.StatusBadRequest || !strings.Contains(string(b), "agent-report.schema.json") {
			t.Errorf("%s: %d %.300s, want 400 naming the schema", name, code, b)
		}
	}
	if s, _ := f.store.Server("r1-n07"); s.Lifecycle != state.LifecycleCommissioning || s.Hardware != nil {
		t.Fatalf("after refused reports: %s, hardware %v", s.Lifecycle, s.Hardware)
	}
	if code, _, b := f.do(t, http.MethodPost, v1.PathAgentReport, tok, mustJSON(t, goodReport())); code != http.StatusOK {
		t.Fatalf("good report: %d %s", code, b)
	}
}
