package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestSimUntilDeployed runs `machina sim --until-deployed` as make demo
// does (without its interactive wait): the example site commissions and
// its profiles' counts deploy.
func TestSimUntilDeployed(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"sim", "--until-deployed", "--timeout", "3m", "--boot-delay", "0", "--poll", "200ms", "--dir", t.TempDir()},
		strings.NewReader(""), &out, &errOut)
	if code != 0 {
		t.Fatalf("machina sim: exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"new → commissioning", "commissioning → ready", "deploying → deployed", "joined the fleet", "Every profile's count is deployed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
