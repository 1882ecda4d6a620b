package main

import (
	"bytes"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestStatusNeutralisesMachineText: a ramdisk's failed-test reason with
// terminal escapes (clear screen, a title-setting OSC, a CSI in its C1
// form, a bidi override) is printed by machinactl status with each control
// character replaced. Before the fix the escapes reached the terminal raw.
func TestStatusNeutralisesMachineText(t *testing.T) {
	evil := "disk test failed: \x1b[2J\x1b]0;pwned\x07 \u009b31m \u202eevil\u202c ok"
	snap := state.Snapshot{Servers: map[string]*state.Server{
		"a": {Name: "a", Lifecycle: state.LifecycleFailed, LastError: evil},
	}}
	var b bytes.Buffer
	writeStatus(&b, "http://c", map[string]int{"failed": 1}, true, 1, 0, gitops.InventoryStatus{}, plan.Result{}, snap)
	out := b.String()
	for _, bad := range []string{"\x1b", "\x07", "\u009b", "\u202e"} {
		if strings.Contains(out, bad) {
			t.Errorf("status prints %q raw:\n%q", bad, out)
		}
	}
	if !strings.Contains(out, "disk test failed: \uFFFD[2J\uFFFD]0;pwned\uFFFD \uFFFD31m \uFFFDevil\uFFFD ok") {
		t.Errorf("status does not show the neutralised reason:\n%q", out)
	}
	if got := termSafe("plain r1-n01 (ready)"); got != "plain r1-n01 (ready)" {
		t.Errorf("termSafe changed plain text: %q", got)
	}
}

// TestStatusNeutralisesEveryMachineField: every line of `machinactl
// status` that can carry text from a machine, a BMC or the repository
// (a BMC error, a plan condition's subject and message, e.g. Waiting
// naming the last thing heard, an inventory error quoting a value, the
// brake's reason, a host condition) prints control characters, escape
// sequences and bidi overrides replaced (before, the inventory error,
// the condition subject and the brake were printed raw).
func TestStatusNeutralisesEveryMachineField(t *testing.T) {
	evil := "x\x1b[2J\x1b]0;pwned\x07\u009b31m\u202eevil\u202c\ny"
	snap := state.Snapshot{Servers: map[string]*state.Server{
		"b": {Name: "b", Lifecycle: state.LifecycleReady, BMCError: "bmc: " + evil},
	}}
	inv := gitops.InventoryStatus{Invalid: &gitops.InvalidRevision{Commit: "0123456789abcdef",
		Errors: []inventory.FieldError{{File: "servers.yaml", Line: 3, Col: 5, Path: "servers[0].name", Msg: "value " + evil}}}}
	plan := plan.Result{Brake: "brake " + evil, Conditions: []plan.Condition{
		{Subject: "server/c" + evil, Type: "Waiting", Reason: "MachineSilent", Message: "last heard: " + evil},
	}}
	var b bytes.Buffer
	writeStatus(&b, "http://c", map[string]int{"ready": 1}, true, 1, 0, inv, plan, snap)
	writeHostStatus(&b, []v1.Host{{Name: "h1", Conditions: []v1.HostCondition{{Type: "HostLost", Message: "lost " + evil}}}})
	out := b.String()
	for _, bad := range []string{"\x1b", "\x07", "\u009b", "\u202e", "\u202c"} {
		if strings.Contains(out, bad) {
			t.Errorf("status prints %q raw:\n%s", bad, strings.ReplaceAll(out, "\x1b", "ESC"))
		}
	}
	for _, want := range []string{"bmc: x", "value x", "brake x", "last heard: x", "lost x"} {
		if !strings.Contains(out, want+"\uFFFD[2J") {
			t.Errorf("status lacks the neutralised %q...:\n%q", want, out)
		}
	}
}

// TestPlanTextNeutralisesMachineText: `machinactl plan` prints the plan's
// text through termSafeLines: a wipe failure reason with escapes in a
// WipeFailed condition reaches the terminal neutralised, the plan's lines
// stay lines (before, the text plan was printed raw).
func TestPlanTextNeutralisesMachineText(t *testing.T) {
	r := plan.Result{Conditions: []plan.Condition{
		{Subject: "server/a", Type: "WipeFailed", Reason: "ReleaseWipeFailed", Message: "last: \x1b]0;pwned\x07\u202eevil"},
		{Subject: "server/b", Type: "WipeFailed", Reason: "ReleaseWipeFailed", Message: "plain"},
	}}
	out := termSafeLines(r.Text())
	if strings.ContainsAny(out, "\x1b\x07\u202e") {
		t.Errorf("plan text keeps control characters: %q", out)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.Contains(lines[1], "last: \uFFFD]0;pwned\uFFFD\uFFFDevil") {
		t.Errorf("plan text = %q", out)
	}
}
