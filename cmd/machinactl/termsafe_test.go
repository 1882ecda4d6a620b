package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/state"
)

// TestStatusNeutralisesMachineText: a ramdisk's failed-test reason with
// terminal escapes (clear screen, a title-setting OSC, a CSI in its C1
// form, a bidi override) is printed by machinactl status with each control
// character replaced. Before the fix the escapes reached the terminal raw.
func TestStatusNeutralisesMachineText(t *testing.T) {
	evil := "disk test failed: \x1b[2J\x1b]0;pwned\x07 \u009b31m \u202eevil\u202c ok"
	snap := state.Snapshot{Servers: map[string]state.Server{
		"a": {Name: "a", Lifecycle: state.LifecycleFailed, LastError: evil},
	}}
	var b bytes.Buffer
	writeStatus(&b, "http://c", map[string]int{"failed": 1}, true, 1, 0, gitops.InventoryStatus{}, reconciler.Result{}, snap)
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
