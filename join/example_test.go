package join_test

import (
	"fmt"
	"strings"

	"github.com/machina-metal/machina/join"
)

// The deploy path renders the first-boot command for the NoCloud seed from
// an enrolment token's answer (join.Server.IssueToken).
func ExampleFirstBootCommand() {
	cmd, err := join.FirstBootCommand("https://10.0.0.1:8443", strings.Repeat("ab", 32), join.ScriptSHA256(), "mj_0123456789abcdefghijklmnopqrstuvwxyzABCDEFG")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(strings.HasPrefix(cmd, "(set -eu;"), strings.Contains(cmd, "\n"), len(cmd) < 4096)
	// Output: true false true
}
