package schema

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// referencePage is the generated inventory reference, relative to this
// package.
var referencePage = filepath.Join("..", "docs", "reference", "inventory.md")

// TestReferenceCurrent fails when docs/reference/inventory.md is not what
// Reference renders from the embedded schemas. MACHINA_UPDATE_DOCS=1 (as
// `make docs` sets it) writes the page instead.
func TestReferenceCurrent(t *testing.T) {
	got, err := Reference()
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("MACHINA_UPDATE_DOCS") == "1" {
		if err := os.MkdirAll(filepath.Dir(referencePage), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(referencePage, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(referencePage)
	if err != nil {
		t.Fatalf("%v: run `make docs` to generate it", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale: the schemas changed; run `make docs` and commit the page", referencePage)
	}
}

// TestReferenceCoversSchemas checks the page against the schemas: every
// file, every top-level field and a field deep inside definitions appear.
func TestReferenceCoversSchemas(t *testing.T) {
	page, err := Reference()
	if err != nil {
		t.Fatal(err)
	}
	s := string(page)
	for _, want := range []string{
		"## servers.yaml", "## profiles.yaml", "## images.yaml",
		"| `servers` | list of `server` (object) | yes |",
		"| `servers[].bmc.driver` |",
		"| `profiles[].name` |",
		"One of `\"redfish\"`, `\"ipmi\"`.",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("reference lacks %q", want)
		}
	}
	if strings.Count(s, "\n| `") < 60 {
		t.Errorf("reference has %d field rows; the schemas have more", strings.Count(s, "\n| `"))
	}
}
