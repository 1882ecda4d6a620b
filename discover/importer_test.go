package discover

import (
	"bytes"
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/machina-metal/machina/inventory"
	inventoryexample "github.com/machina-metal/machina/inventory-example"
)

var update = flag.Bool("update", false, "rewrite the import golden files")

func exampleFiles(t *testing.T) map[string][]byte {
	t.Helper()
	m := map[string][]byte{}
	for _, n := range inventory.Files {
		b, err := fs.ReadFile(inventoryexample.FS, n)
		if err != nil {
			t.Fatal(err)
		}
		m[n] = b
	}
	return m
}

// TestImportCorpus imports every file of testdata/import into the example
// inventory and compares the report and the appended YAML with the
// .golden file next to it (go test ./discover -run ImportCorpus -update).
func TestImportCorpus(t *testing.T) {
	files, _ := filepath.Glob("testdata/import/*.*")
	n := 0
	for _, in := range files {
		if strings.HasSuffix(in, ".golden") {
			continue
		}
		n++
		t.Run(filepath.Base(in), func(t *testing.T) {
			data, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			ex := exampleFiles(t)
			base, err := inventory.Load(mapFS(ex), inventory.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			rows, err := ParseRows(in, data)
			if err != nil {
				t.Fatal(err)
			}
			out, rep, err := Import(ex[inventory.ServersFile], base.Inventory, rows)
			if err != nil {
				t.Fatal(err)
			}
			// The whole result is a valid inventory with the added servers.
			ex[inventory.ServersFile] = out
			res, err := inventory.Load(mapFS(ex), inventory.Limits{})
			if err != nil {
				t.Fatalf("imported inventory invalid: %v", err)
			}
			if len(res.Inventory.Servers) != len(base.Inventory.Servers)+len(rep.Added) {
				t.Errorf("%d servers, want %d", len(res.Inventory.Servers), len(base.Inventory.Servers)+len(rep.Added))
			}
			if len(rep.Added)+len(rep.Skipped)+len(rep.Invalid) != len(rows) {
				t.Errorf("rows unaccounted: %d rows, report %+v", len(rows), rep)
			}
			var got bytes.Buffer
			_ = WriteImportReport(&got, filepath.Base(in), rep)
			got.WriteString("--- appended to servers.yaml ---\n")
			got.Write(bytes.TrimPrefix(out, base0(t)))
			golden := in + ".golden"
			if *update {
				if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("report differs from %s:\n--- got\n%s\n--- want\n%s", golden, got.Bytes(), want)
			}
			if strings.Contains(got.String(), "hunter2") {
				t.Error("a credentials value that looks like a password is echoed")
			}
		})
	}
	if n < 2 {
		t.Fatalf("corpus has %d files", n)
	}
}

func base0(t *testing.T) []byte {
	b, err := fs.ReadFile(inventoryexample.FS, inventory.ServersFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	return b
}

func TestParseRowsRefusals(t *testing.T) {
	for name, data := range map[string]string{
		"x.txt":        "name\nx\n",
		"unknown.csv":  "name,zone,password\nx,y,z\n",
		"twice.csv":    "name,name\nx,y\n",
		"empty.csv":    "",
		"object.json":  `{"name":"x"}`,
		"badkey.json":  `[{"name":"x","passwd":"y"}]`,
		"trunc.json":   `[{"name":"x"`,
		"badquote.csv": "name,zone\n\"x,y\n",
	} {
		if _, err := ParseRows(name, []byte(data)); !errors.Is(err, ErrImportFormat) {
			t.Errorf("%s: err %v, want ErrImportFormat", name, err)
		}
	}
}

// TestParseJSONStrict: a key given twice in a JSON row is refused with its
// line (encoding/json alone keeps the last value), tags must be an array,
// and a truncated file names the line where it ends.
func TestParseJSONStrict(t *testing.T) {
	_, err := ParseRows("dup.json", []byte("[\n {\"name\":\"a\",\"zone\":\"zone-a\"},\n {\"name\":\"b\",\"zone\":\"zone-a\",\"zone\":\"zone-b\"}\n]"))
	if !errors.Is(err, ErrImportFormat) || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), `key "zone" given twice`) {
		t.Errorf("duplicate key: %v", err)
	}
	rows, err := ParseRows("tags.json", []byte(`[{"name":"a","tags":"notarray"}]`))
	if err != nil || len(rows) != 1 || rows[0].Fields["\x00"] != "tags must be an array of strings" {
		t.Errorf("tags as a string: rows %+v, %v", rows, err)
	}
	_, err = ParseRows("trunc.json", []byte("[\n {\"name\":\"a\"},\n"))
	if !errors.Is(err, ErrImportFormat) || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), "unexpected EOF") {
		t.Errorf("truncated: %v", err)
	}
}

func TestImportIntoRepo(t *testing.T) {
	dir := newRepo(t)
	raw, inv, err := ReadInventory(dir, "main")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile("testdata/import/rack5.json")
	rows, err := ParseRows("rack5.json", data)
	if err != nil {
		t.Fatal(err)
	}
	out, rep, err := Import(raw, inv, rows)
	if err != nil {
		t.Fatal(err)
	}
	h, err := Commit(Change{Repo: dir, Branch: "main", Message: "import rack5"}, out)
	if err != nil {
		t.Fatal(err)
	}
	after := atBranch(t, dir, "main")
	for _, a := range rep.Added {
		if after.Server(a.Key) == nil {
			t.Errorf("%s not in main after commit %s", a.Key, h)
		}
	}
	// Importing again adds nothing.
	raw2, inv2, _ := ReadInventory(dir, "main")
	_, rep2, _ := Import(raw2, inv2, rows)
	if len(rep2.Added) != 0 || len(rep2.Skipped) != len(rep.Added)+len(rep.Skipped) {
		t.Errorf("re-import: %+v", rep2)
	}
}

func FuzzParseRows(f *testing.F) {
	for _, in := range []string{"testdata/import/rack4.csv", "testdata/import/rack5.json"} {
		b, _ := os.ReadFile(in)
		f.Add(filepath.Ext(in), b)
	}
	f.Fuzz(func(t *testing.T, ext string, data []byte) {
		rows, err := ParseRows("f"+ext, data)
		if err != nil {
			return
		}
		for _, r := range rows {
			if r.Line < 1 {
				t.Fatalf("row line %d", r.Line)
			}
		}
		out, rep, err := Import(nil, nil, rows)
		if err != nil {
			return
		}
		if len(rep.Added) > 0 {
			if _, err := inventory.Load(fstest.MapFS{inventory.ServersFile: {Data: out}}, inventory.Limits{}); err != nil {
				t.Fatalf("added rows make an invalid servers.yaml: %v\n%s", err, out)
			}
		}
	})
}

func TestDiff(t *testing.T) {
	for _, tc := range []struct{ old, new, want string }{
		{"a\nb\n", "a\nb\n", ""},
		{"a\nb\n", "a\nb\nc\nd\n", "--- a/f\n+++ b/f\n@@ -2,0 +3,2 @@\n+c\n+d\n"},
		{"servers: []\n", "servers:\n  - x\n", "--- a/f\n+++ b/f\n@@ -1,1 +1,2 @@\n-servers: []\n+servers:\n+  - x\n"},
		{"", "a\n", "--- a/f\n+++ b/f\n@@ -0,0 +1,1 @@\n+a\n"},
		{"a", "a\nb\n", "--- a/f\n+++ b/f\n@@ -1,1 +1,2 @@\n-a\n\\ No newline at end of file\n+a\n+b\n"},
	} {
		if got := Diff("f", []byte(tc.old), []byte(tc.new)); got != tc.want {
			t.Errorf("Diff(%q, %q):\n%s\nwant\n%s", tc.old, tc.new, got, tc.want)
		}
	}
}
