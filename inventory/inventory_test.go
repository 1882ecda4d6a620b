package inventory

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
)

// TestNormaliseMAC: every notation the schema's "mac" format admits ends in
// canonical form after loading (normalise), as inventory.NormalizeMAC did.
func TestNormaliseMAC(t *testing.T) {
	for _, in := range []string{"52:54:00:AA:bb:01", "52-54-00-aa-BB-01", "5254.00aa.bb01", "525400AABB01", " 52:54:00:aa:bb:01 "} {
		inv := Inventory{Servers: []Server{{Name: "a", BootMAC: in}}}
		normalise(&inv)
		if got := inv.Servers[0].BootMAC; got != "52:54:00:aa:bb:01" {
			t.Errorf("normalise(%q) = %q; want 52:54:00:aa:bb:01", in, got)
		}
	}
}

func TestNormalizeBMCAddress(t *testing.T) {
	tests := []struct {
		driver BMCDriver
		in     string
		want   string
	}{
		{DriverRedfish, "https://10.0.0.1", "https://10.0.0.1"},
		{DriverRedfish, "https://10.0.0.1:443/", "https://10.0.0.1"},
		{DriverRedfish, "https://BMC-1.lab:8443/redfish/", "https://bmc-1.lab:8443/redfish"},
		{DriverRedfish, "http://10.0.0.1:80", "http://10.0.0.1"},
		{DriverIPMI, "10.0.0.1", "10.0.0.1:623"},
		{DriverIPMI, "10.0.0.1:623", "10.0.0.1:623"},
		{DriverIPMI, "[fd00::1]:6230", "[fd00::1]:6230"},
		{DriverIPMI, "BMC-3", "bmc-3:623"},
	}
	for _, tt := range tests {
		if got := NormalizeBMCAddress(tt.driver, tt.in); got != tt.want {
			t.Errorf("NormalizeBMCAddress(%s, %q) = %q, want %q", tt.driver, tt.in, got, tt.want)
		}
	}
}

func loadDir(t *testing.T, dir string) (*Result, error) {
	t.Helper()
	return Load(os.DirFS(dir), Limits{})
}

func TestLoadExample(t *testing.T) {
	res, err := loadDir(t, "../inventory-example")
	if err != nil {
		t.Fatal(err)
	}
	inv := res.Inventory
	if len(inv.Servers) < 12 || len(inv.Profiles) != 3 || len(inv.Images) < 8 {
		t.Fatalf("example has %d servers, %d profiles, %d images", len(inv.Servers), len(inv.Profiles), len(inv.Images))
	}
	zones, drivers, modes := map[string]bool{}, map[BMCDriver]bool{}, map[BootMode]bool{}
	for _, s := range inv.Servers {
		zones[s.Zone], drivers[s.BMC.Driver], modes[s.BootMode] = true, true, true
		if s.Want == "" || s.BootMode == "" {
			t.Errorf("%s: defaults not filled: want=%q bootMode=%q", s.Name, s.Want, s.BootMode)
		}
	}
	if len(zones) < 3 || len(drivers) != 2 || len(modes) != 2 {
		t.Errorf("example lacks variety: zones %v drivers %v modes %v", zones, drivers, modes)
	}
	catalog := map[string]bool{}
	for _, im := range inv.Images {
		if im.Catalog != "" {
			catalog[im.Catalog] = true
		}
	}
	if len(catalog) != 7 {
		t.Errorf("example uses %d catalog entries, want all 7", len(catalog))
	}
	if !strings.HasPrefix(inv.Digest, "sha256:") || len(inv.Digest) != 71 {
		t.Errorf("digest %q", inv.Digest)
	}
}

// TestDigestIgnoresFormatting: comments, key order, quoting and MAC notation
// do not change the desired state, so they do not change the digest.
func TestDigestIgnoresFormatting(t *testing.T) {
	a := fstest.MapFS{ServersFile: {Data: []byte(`servers:
  - name: n01
    zone: z
    bootMAC: "52:54:00:00:00:01"
    bmc: {driver: ipmi, address: "10.0.0.1", credentials: c}
`)}}
	b := fstest.MapFS{ServersFile: {Data: []byte(`# a comment
servers:
  - bmc:
      credentials: "c"
      address: '10.0.0.1'
      driver: ipmi
    bootMAC: "5254.0000.0001"
    zone: "z"
    name: n01
    want: ready
`)}}
	ra, err := Load(a, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := Load(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if ra.Inventory.Digest != rb.Inventory.Digest {
		t.Errorf("digests differ: %s vs %s", ra.Inventory.Digest, rb.Inventory.Digest)
	}
	if diff := cmp.Diff(ra.Inventory.Servers, rb.Inventory.Servers); diff != "" {
		t.Errorf("servers differ:\n%s", diff)
	}
}

// TestAliasBombBoundedMemory: a billion-laughs document is refused before
// any expansion, using little memory.
func TestAliasBombBoundedMemory(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(`a: &a ["x","x","x","x","x","x","x","x","x","x"]` + "\n")
	prev := "a"
	for _, name := range []string{"b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m"} {
		b.WriteString(name + ": &" + name + " [")
		for i := 0; i < 10; i++ {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString("*" + prev)
		}
		b.WriteString("]\n")
		prev = name
	}
	b.WriteString("servers: [*" + prev + "]\n") // 10^13 nodes once expanded
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := Load(fstest.MapFS{ServersFile: {Data: b.Bytes()}}, Limits{})
	runtime.ReadMemStats(&after)
	var verr *ValidationError
	if !errors.As(err, &verr) || !strings.Contains(verr.Errors[0].Msg, "alias bomb") {
		t.Fatalf("Load(alias bomb) = %v, want an alias-bomb error", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
		t.Errorf("Load allocated %d bytes on an alias bomb, want under 16 MiB", grew)
	}
}

// TestAliasesWithinBudget: ordinary anchors, such as a shared key list, are fine.
func TestAliasesWithinBudget(t *testing.T) {
	fsys := fstest.MapFS{
		ServersFile: {Data: []byte(`servers:
  - name: n01
    zone: z
    bootMAC: "52:54:00:00:00:01"
    bmc: &bmc {driver: ipmi, address: "10.0.0.1", credentials: c}
`)},
		ProfilesFile: {Data: []byte(`keys: &keys ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops"]
profiles: []
`)},
	}
	_, err := Load(fsys, Limits{})
	var verr *ValidationError
	if !errors.As(err, &verr) || len(verr.Errors) != 1 || verr.Errors[0].Msg != `unknown field "keys"` {
		t.Fatalf("Load = %v, want exactly the unknown top-level key error", err)
	}
}

func TestValidationErrorFormat(t *testing.T) {
	fe := FieldError{File: "servers.yaml", Line: 14, Col: 7, Path: "servers[2].bootMAC", Msg: `"52:54:00:zz:00:01" is not a MAC address`}
	if got, want := fe.Error(), `servers.yaml:14:7: servers[2].bootMAC: "52:54:00:zz:00:01" is not a MAC address`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// FuzzLoad: parse and validate never panic, and every error has a file.
func FuzzLoad(f *testing.F) {
	for _, dir := range []string{"testdata/valid/crlf", "../inventory-example"} {
		b, err := os.ReadFile(dir + "/servers.yaml")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, []byte(""))
	}
	f.Add([]byte("servers: [*a]\n"), []byte("profiles: {"))
	f.Add([]byte("a: &a [1]\nservers: [*a, *a]\n"), []byte("profiles:\n - name: x\n   image: y\n"))
	f.Fuzz(func(t *testing.T, servers, profiles []byte) {
		if len(servers) > 1<<16 || len(profiles) > 1<<16 {
			return
		}
		fsys := fstest.MapFS{ServersFile: {Data: servers}, ProfilesFile: {Data: profiles}}
		res, err := Load(fsys, Limits{MaxFileBytes: 1 << 16})
		var verr *ValidationError
		switch {
		case err == nil:
			if res.Inventory == nil || res.Inventory.Digest == "" {
				t.Fatal("valid result without inventory or digest")
			}
		case errors.As(err, &verr):
			for _, e := range verr.Errors {
				if e.File == "" || e.Msg == "" {
					t.Fatalf("problem without file or message: %+v", e)
				}
			}
		default:
			t.Fatalf("unexpected error type: %v", err)
		}
	})
}

// TestEveryFileReportedAtOnce: a schema error in servers.yaml does not hide
// a cross-file error between profiles.yaml and images.yaml (every problem
// at once), and checks that need the broken file are skipped rather than
// reporting false alarms (the profile's zone has servers; they just did not
// decode).
func TestEveryFileReportedAtOnce(t *testing.T) {
	fsys := fstest.MapFS{
		ServersFile: {Data: []byte(`servers:
  - name: n01
    zone: z
    bootMAC: "52:54:00:00:00:zz"
    bmc: {driver: ipmi, address: "10.0.0.1", credentials: c}
`)},
		ProfilesFile: {Data: []byte(`profiles:
  - name: hv
    image: no-such-image
    zone: z
    count: 1
`)},
		ImagesFile: {Data: []byte(`images:
  - {name: debian-12, catalog: debian-12}
`)},
	}
	_, err := Load(fsys, Limits{})
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("Load = %v, want a ValidationError", err)
	}
	var got []string
	for _, e := range ve.Errors {
		got = append(got, e.File+" "+e.Path)
	}
	want := []string{ServersFile + " servers[0].bootMAC", ProfilesFile + " profiles[0].image"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("errors at %v, want %v:\n%v", got, want, ve)
	}
}

// TestDuplicateKeyHidesNothing: a duplicate key in one server does not hide
// the file's other problems (an unquoted MAC in another server, a bad
// field); every one is reported in the same run.
func TestDuplicateKeyHidesNothing(t *testing.T) {
	fsys := fstest.MapFS{
		ServersFile: {Data: []byte(`servers:
  - name: n01
    zone: z
    bootMode: uefi
    bootMode: bios
    bootMAC: "52:54:00:00:00:01"
    bmc: {driver: ipmi, address: "10.0.0.1", credentials: c}
  - name: n02
    zone: z
    bootMAC: 52:54:00:00:00:02
    bmc: {driver: ipmi, address: "10.0.0.2", credentials: c}
  - name: n03
    zone: z
    bootMAC: "52:54:00:00:00:zz"
    bmc: {driver: ipmi, address: "10.0.0.3", credentials: c}
`)},
		ProfilesFile: {Data: []byte("profiles: []\n")},
		ImagesFile:   {Data: []byte("images: []\n")},
	}
	_, err := Load(fsys, Limits{})
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("Load = %v, want a ValidationError", err)
	}
	var got []string
	for _, e := range ve.Errors {
		got = append(got, fmt.Sprintf("%d %s", e.Line, e.Msg))
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{`5 duplicate key "bootMode"`, "10 ", "14 "} {
		if !strings.Contains(all, want) {
			t.Errorf("errors lack line %q:\n%s", want, all)
		}
	}
}
