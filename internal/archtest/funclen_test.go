package archtest

import (
	"testing"
)

// longFuncAllowed are the product functions allowed over MaxFuncLines:
// data tables only (a function that is one literal of rows), each with why.
var longFuncAllowed = map[string]string{}

// longFuncPending are the product functions still over MaxFuncLines that
// are not data tables and have not been split yet. Each may not grow
// past the length recorded here, and no function may join the list; split
// one and delete its row.
var longFuncPending = map[string]int{}

// TestNoLongFunctions: no product function is over MaxFuncLines lines
// except the data tables in longFuncAllowed; an allowed entry that is no
// longer long (or no longer exists) must be removed.
func TestNoLongFunctions(t *testing.T) {
	root, g := loadModule(t)
	long, err := LongFuncs(root, g, MaxFuncLines)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	n := 0
	for _, f := range long {
		seen[f.Name] = true
		if _, ok := longFuncAllowed[f.Name]; ok {
			continue
		}
		n++
		if most, ok := longFuncPending[f.Name]; ok && f.Lines <= most {
			continue
		}
		t.Errorf("over %d lines: %s", MaxFuncLines, f)
	}
	for name := range longFuncAllowed {
		if !seen[name] {
			t.Errorf("longFuncAllowed names %s, which is not over %d lines (any more): remove it", name, MaxFuncLines)
		}
	}
	for name := range longFuncPending {
		if !seen[name] {
			t.Errorf("longFuncPending names %s, which is not over %d lines (any more): remove it", name, MaxFuncLines)
		}
	}
	t.Logf("%d product functions over %d lines outside the data-table allow-list (%d pending a split)", n, MaxFuncLines, len(longFuncPending))
}

// TestLongFuncsCounts: the checker measures from `func` to the closing
// brace and names methods by receiver, on this package's own files.
func TestLongFuncsCounts(t *testing.T) {
	fs, err := packageFuncs("..", "archtest")
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]int{}
	for _, f := range fs {
		found[f.Name] = f.Lines
	}
	if found["archtest.Violation.String"] != 3 {
		t.Errorf("Violation.String: %d lines, want 3 (found %v)", found["archtest.Violation.String"], found)
	}
	if found["archtest.Check"] == 0 || found["archtest.(Graph).deps"] != 0 && found["archtest.Graph.deps"] == 0 {
		t.Errorf("missing functions: %v", found)
	}
}
