package plan

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strings"
	"testing"
)

// declaredActions parses action.go for the Action constants.
func declaredActions(t *testing.T) []Action {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "action.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []Action
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, sp := range gd.Specs {
			vs := sp.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "Action" {
				for _, v := range vs.Values {
					out = append(out, Action(strings.Trim(v.(*ast.BasicLit).Value, `"`)))
				}
			}
		}
	}
	return out
}

// TestEveryActionHasRow: each Action constant has a row in actionInfo,
// the table has a row for nothing else, and Actions lists exactly the
// rows (the executor's TestEveryActionHasHandler checks a handler for
// each of them).
func TestEveryActionHasRow(t *testing.T) {
	acts := declaredActions(t)
	if len(acts) < 17 {
		t.Fatalf("found %d Action constants in action.go: the parser lost them", len(acts))
	}
	for _, a := range acts {
		if _, ok := a.Info(); !ok {
			t.Errorf("action %s has no row in actionInfo", a)
		}
	}
	for a := range actionInfo {
		if !slices.Contains(acts, a) {
			t.Errorf("actionInfo row %s is not an Action constant", a)
		}
	}
	listed := Actions()
	if len(listed) != len(actionInfo) {
		t.Errorf("Actions() = %d actions, table has %d rows", len(listed), len(actionInfo))
	}
	for i := 1; i < len(listed); i++ {
		if actionInfo[listed[i-1]].Order > actionInfo[listed[i]].Order {
			t.Errorf("Actions() not by Order: %s before %s", listed[i-1], listed[i])
		}
	}
}
