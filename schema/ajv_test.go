package schema

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/machina-metal/machina/internal/peertest"
)

// TestSecondOpinionAjv validates the example inventory and schema-level
// corpus cases with ajv (an independent draft 2020-12 implementation, run
// with node) and checks it agrees with ours: same verdict, and errors at the
// same instance locations. `.ci/run` installs ajv with `npm ci` in
// scripts/ajv; without it the test fails (skips in the quick mode).
func TestSecondOpinionAjv(t *testing.T) {
	ajvDir := "../scripts/ajv"
	if _, err := os.Stat(filepath.Join(ajvDir, "node_modules", "ajv")); err != nil {
		peertest.Missing(t, "ajv not installed in "+ajvDir, "the npm modules with `npm ci --prefix scripts/ajv`")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		peertest.Missing(t, "node not in PATH", "node and npm (the Debian packages nodejs npm)")
	}
	v, err := New()
	if err != nil {
		t.Fatal(err)
	}
	inv := "../inventory/testdata/invalid/"
	cases := []string{
		"../inventory-example",
		"../inventory/testdata/valid/crlf",
		"../inventory/testdata/valid/mac-forms",
		"../inventory/testdata/valid/labels",
		"../inventory/testdata/valid/firmware",
		"../inventory/testdata/valid/networks",
		inv + "bad-mac", inv + "bad-labels", inv + "bad-names", inv + "unknown-field", inv + "wrong-types",
		inv + "image-catalog-and-url", inv + "image-md5-checksum", inv + "ipmi-address-is-url",
		inv + "vlan-out-of-range", inv + "lvm-pool-without-disks", inv + "missing-required",
		inv + "inline-password", inv + "bmc-url-with-password", inv + "private-ssh-key",
		inv + "password-field", inv + "root-device-kernel-name", inv + "firmware-schema", inv + "firmware-cross-file",
		inv + "networks-schema", inv + "networks-cross-file", inv + "cloudinit",
	}
	schemaDir := t.TempDir()
	for _, k := range Kinds {
		b, _ := files.ReadFile(k.FileName())
		if err := os.WriteFile(filepath.Join(schemaDir, k.FileName()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	checked := 0
	for _, dir := range cases {
		for _, k := range Kinds {
			y, err := os.ReadFile(filepath.Join(dir, string(k)+".yaml"))
			if err != nil {
				continue
			}
			js, err := yaml.YAMLToJSON(y)
			if err != nil {
				t.Fatalf("%s/%s.yaml: %v", dir, k, err)
			}
			docPath := filepath.Join(t.TempDir(), "doc.json")
			if err := os.WriteFile(docPath, js, 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(node, filepath.Join(ajvDir, "validate.js"), filepath.Join(schemaDir, k.FileName()), docPath).Output()
			if err != nil {
				t.Fatalf("ajv on %s/%s.yaml: %v", dir, k, err)
			}
			var ajv struct {
				Valid  bool
				Errors []struct{ InstancePath string }
			}
			if err := json.Unmarshal(out, &ajv); err != nil {
				t.Fatalf("ajv output %q: %v", out, err)
			}
			ours, err := v.ValidateJSON(k, js)
			if err != nil {
				t.Fatal(err)
			}
			if ajv.Valid != (len(ours) == 0) {
				t.Errorf("%s/%s.yaml: ajv valid=%v, ours has %d violations: %+v", dir, k, ajv.Valid, len(ours), ours)
				continue
			}
			// ajv also reports the failing branches of oneOf/if and the
			// parents of nested failures; every location we report must be
			// one ajv reports.
			ajvPaths := map[string]bool{}
			for _, e := range ajv.Errors {
				ajvPaths[e.InstancePath] = true
			}
			var missing []string
			for _, o := range ours {
				if !ajvPaths[o.Pointer] {
					missing = append(missing, o.Pointer)
				}
			}
			sort.Strings(missing)
			if len(missing) > 0 {
				t.Errorf("%s/%s.yaml: we report %s, ajv does not (ajv: %v)", dir, k, strings.Join(missing, ", "), ajvPaths)
			}
			checked++
		}
	}
	if checked < 20 {
		t.Errorf("compared only %d documents", checked)
	}
	t.Logf("ajv and Machina agree on %d documents", checked)
}
