package inventory

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/machina-metal/machina/bench/inventorygen"
)

// viaYAMLToJSON is the conversion convert replaces: sigs.k8s.io/yaml's
// YAMLToJSON, then encoding/json with UseNumber.
func viaYAMLToJSON(t *testing.T, data []byte) any {
	t.Helper()
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatalf("YAMLToJSON: %v", err)
	}
	return decodeNumbers(t, js)
}

func decodeNumbers(t *testing.T, js []byte) any {
	t.Helper()
	var v any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", js, err)
	}
	return v
}

// checkConvert asserts that convert gives up on data (when want is false)
// or gives the value and JSON text sigs.k8s.io/yaml gives.
func checkConvert(t *testing.T, name string, data []byte, wantOK bool) {
	t.Helper()
	d, _ := parseYAML(name, data, Limits{}.withDefaults())
	if d == nil {
		t.Fatalf("%s: does not parse", name)
	}
	got, js, ok := convert(d.root)
	if ok && hasBareTag(d.data) {
		ok = false
	}
	if ok != wantOK {
		t.Fatalf("%s: convert ok = %v, want %v", name, ok, wantOK)
	}
	if !ok {
		return
	}
	want := viaYAMLToJSON(t, d.data)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s: convert value differs from YAMLToJSON (-want +got):\n%s", name, diff)
	}
	if diff := cmp.Diff(want, decodeNumbers(t, js)); diff != "" {
		t.Errorf("%s: convert JSON text differs from YAMLToJSON (-want +got):\n%s", name, diff)
	}
}

func TestConvertMatchesYAMLToJSON(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		ok        bool
	}{
		{"strings and quoting", "a: plain\nb: \"double \\\" \\\\ \\t \\u0001 é\"\nc: 'single ''q'''\nd: |\n  literal\n  text\ne: >\n  folded\n  text\n", true},
		{"yaml 1.1 booleans", "a: yes\nb: No\nc: on\nd: OFF\ne: y\nf: N\ng: true\nh: False\ni: \"yes\"\n", true},
		{"nulls", "a:\nb: ~\nc: null\nd: NULL\ne: [~, null, '']\n", true},
		{"integers", "a: 0\nb: -12\nc: 1_000\nd: 0x1F\ne: 0o17\nf: 017\ng: 0b101\nh: -0b11\ni: 18446744073709551615\nj: +7\n", true},
		{"floats", "a: 1.5\nb: -0.25\nc: 1e3\nd: .5\ne: 1_0.5\nf: 1e-7\ng: 1e21\nh: 3.0\n", true},
		{"strings that look numeric elsewhere", "a: 52:54:00:00:01:01\nb: 10.0.0.1\nc: 1:30\nd: 0x\ne: 1.2.3\n", true},
		{"nesting", "servers:\n  - name: a\n    labels: {rack: r1, 'k/v': x}\n    list: [1, two, {x: y}]\n  - {}\n", true},
		{"quoted keys", "'yes': 1\n\"1\": 2\n'~': 3\n", true},
		{"duplicate keys keep the last", "a: 1\na: 2\n", true},
		{"exclamation in a string", "a: \"hi! there\"\nb: 'wow!'\n", true},
		{"plain boolean key", "yes: 1\n", false},
		{"plain integer key", "1: a\n", false},
		{"plain null key", "~: a\n", false},
		{"merge key", "base: &b {x: 1}\nc:\n  <<: *b\n", false},
		{"anchor and alias", "a: &x 1\nb: *x\n", false},
		{"explicit tag", "a: !!str 123\n", false},
		{"local tag", "a: !foo bar\n", false},
		{"non-specific tag", "a: ! 123\n", false},
		{"timestamp", "a: 2001-12-14\n", false},
		{"infinity", "a: .inf\n", false},
		{"not a number", "a: .nan\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkConvert(t, tc.name, []byte(tc.doc), tc.ok)
		})
	}
}

// TestConvertMatchesYAMLToJSONOnInventories runs the comparison over every
// YAML file of the test inventories, the example inventory and a generated
// site with networks.
func TestConvertMatchesYAMLToJSONOnInventories(t *testing.T) {
	var files []string
	for _, root := range []string{"testdata", "../inventory-example"} {
		err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() && strings.HasSuffix(p, ".yaml") {
				files = append(files, p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	gen := t.TempDir()
	if err := inventorygen.Write(gen, inventorygen.Size{Servers: 50, Profiles: 5, Images: 3, Networks: true}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{ServersFile, ProfilesFile, ImagesFile, NetworksFile} {
		files = append(files, filepath.Join(gen, f))
	}
	compared := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := parseYAML(f, data, Limits{}.withDefaults())
		if d == nil {
			continue // a file the parse checks refuse: never converted
		}
		got, js, ok := convert(d.root)
		if _, err := yaml.YAMLToJSON(d.data); err != nil {
			if ok {
				t.Errorf("%s: YAMLToJSON refuses it (%v) but convert gave a value", f, err)
			}
			continue
		}
		if !ok {
			continue
		}
		compared++
		want := viaYAMLToJSON(t, d.data)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: convert value differs from YAMLToJSON (-want +got):\n%s", f, diff)
		}
		if diff := cmp.Diff(want, decodeNumbers(t, js)); diff != "" {
			t.Errorf("%s: convert JSON text differs from YAMLToJSON (-want +got):\n%s", f, diff)
		}
	}
	if compared < 20 {
		t.Fatalf("compared %d files of %d, want at least 20", compared, len(files))
	}
}
