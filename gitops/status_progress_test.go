package gitops

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestStatusShowsProgressAndFailing: a deploying server's progress (in
// whole tens of percent, so status commits do not follow every report)
// is its file's progress:, only while the report is of the running deploy;
// a Failing condition of the plan is in its file and in its README row.
func TestStatusShowsProgressAndFailing(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, name := range []string{"r1-n01", "r1-n02"} {
		if _, err := st.CreateServer(state.Server{Name: name}); err != nil {
			t.Fatal(err)
		}
		from := state.LifecycleNew
		for _, lc := range []state.Lifecycle{state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying} {
			if _, err := st.Transition(name, from, lc, "test"); err != nil {
				t.Fatal(err)
			}
			from = lc
		}
	}
	rec, _ := st.Server("r1-n01")
	at := rec.LifecycleAt.Add(1)
	for name, p := range map[string]state.Progress{
		"r1-n01": {Step: "image-write", BytesDone: 17 << 30, BytesTotal: 40 << 30, At: at},
		"r1-n02": {Step: "image-write", BytesDone: 1 << 30, BytesTotal: 40 << 30, At: rec.LifecycleAt.Add(-1)}, // of an earlier deploy
	} {
		if _, err := st.UpdateServer(name, func(s *state.Server) error { s.Progress = &p; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	res := plan.Result{Conditions: []plan.Condition{{Subject: "server/r1-n02", Type: plan.CondFailing, Reason: plan.ReasonActionFailing,
		Message: "finish-deploy failed 3 times in a row; next retry at 2026-11-01T12:01:00Z; last error: finish-deploy: 503"}}}
	out, err := (&StatusBuilder{Store: st}).Build(InventoryStatus{}, nil, res)
	if err != nil {
		t.Fatal(err)
	}
	files, errs := renderStatus(out, 5, nil)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	got := map[string]string{}
	for _, f := range files {
		got[f.path] = string(f.data)
	}
	if s := got[ServerStatusPath("r1-n01")]; !strings.Contains(s, `progress: "image-write 40% of 40.0 GiB"`) {
		t.Errorf("r1-n01's status has no progress line:\n%s", s)
	}
	if s := got[ServerStatusPath("r1-n02")]; strings.Contains(s, "progress:") || !strings.Contains(s, "type: Failing") || !strings.Contains(s, "finish-deploy failed 3 times") {
		t.Errorf("r1-n02's status shows an earlier deploy's progress, or no Failing condition:\n%s", s)
	}
	if s := got["status/README.md"]; !strings.Contains(s, "Failing=True (ActionFailing)") {
		t.Errorf("status/README.md does not show Failing:\n%s", s)
	}
}
