package api_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/machina-metal/machina/api"
)

// TestRouteRolesDocumented: the route → role table of docs/operations.md
// ("Admin token roles") is api.RouteRoles, row for row.
func TestRouteRolesDocumented(t *testing.T) {
	data, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(data), "### Admin token roles")
	if !ok {
		t.Fatal("docs/operations.md has no \"Admin token roles\" section")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	row := regexp.MustCompile("(?m)^\\| `([A-Z]+ /[^`]+)` \\| (\\w+) \\|$")
	doc := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(sec, -1) {
		doc[m[1]] = m[2]
	}
	table := api.RouteRoles()
	for p, r := range table {
		if doc[p] != string(r) {
			t.Errorf("docs/operations.md: %s is %q, api.RouteRoles says %q", p, doc[p], r)
		}
	}
	for p := range doc {
		if _, ok := table[p]; !ok {
			t.Errorf("docs/operations.md lists %s, which api.RouteRoles lacks", p)
		}
	}
}
