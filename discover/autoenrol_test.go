package discover

import (
	"strings"
	"testing"

	"github.com/machina-metal/machina/inventory"
)

// TestAutoEnrolEntry: an auto-enrolled machine's entry has no bmc block and
// carries its hardware facts as comments (sanitised: a hostile DMI string
// cannot break out of its comment). It loads with the no-BMC warning; after
// SetBMC adds a block it loads without it.
func TestAutoEnrolEntry(t *testing.T) {
	ex := exampleFiles(t)
	e := Entry{Name: "auto-525400aa0001", Zone: "zone-a", Tags: []string{"auto-enrolled"}, BootMAC: "52:54:00:aa:00:01", BootMode: "uefi",
		Comment: []string{"auto-enrolled 2026-11-29T21:00:00Z (ipxe)", "hardware: Evil\nservers: []\r\x00 " + strings.Repeat("x", 300)}}
	out, err := AppendEntries(ex[inventory.ServersFile], []Entry{e})
	if err != nil {
		t.Fatal(err)
	}
	added := strings.TrimPrefix(string(out), string(ex[inventory.ServersFile]))
	want := "  # auto-enrolled 2026-11-29T21:00:00Z (ipxe)\n  # hardware: Evil?servers: []?? " + strings.Repeat("x", 160-len("hardware: Evil?servers: []?? ")) + "\n" +
		"  - name: \"auto-525400aa0001\"\n    zone: \"zone-a\"\n    tags: [\"auto-enrolled\"]\n    bootMAC: \"52:54:00:aa:00:01\"\n    bootMode: \"uefi\"\n"
	if added != want {
		t.Fatalf("appended:\n%s\nwant:\n%s", added, want)
	}
	load := func(servers []byte) *inventory.Result {
		t.Helper()
		files := map[string][]byte{}
		for k, v := range ex {
			files[k] = v
		}
		files[inventory.ServersFile] = servers
		res, err := inventory.Load(mapFS(files), inventory.Limits{})
		if err != nil {
			t.Fatalf("Load: %v\n%s", err, servers)
		}
		return res
	}
	noBMC := func(res *inventory.Result) int {
		n := 0
		for _, w := range res.Warnings {
			if strings.Contains(w.Msg, "no BMC") {
				n++
			}
		}
		return n
	}
	res := load(out)
	if s := res.Inventory.Server(e.Name); s == nil || !s.BMC.IsZero() || s.Zone != "zone-a" {
		t.Fatalf("entry = %+v", s)
	}
	if n := noBMC(res); n != 1 {
		t.Errorf("no-BMC warnings = %d, want 1", n)
	}
	nb := inventory.BMC{Driver: inventory.DriverIPMI, Address: "10.10.9.20", Credentials: "bmc-ipmi"}
	withBMC, err := SetBMC(out, e.Name, nb)
	if err != nil {
		t.Fatal(err)
	}
	res = load(withBMC)
	if s := res.Inventory.Server(e.Name); s == nil || s.BMC != nb {
		t.Fatalf("after SetBMC = %+v", s)
	}
	if n := noBMC(res); n != 0 {
		t.Errorf("no-BMC warnings after SetBMC = %d, want 0", n)
	}
	if !strings.HasSuffix(string(withBMC), "    bootMode: \"uefi\"\n    bmc:\n      driver: \"ipmi\"\n      address: \"10.10.9.20\"\n      credentials: \"bmc-ipmi\"\n") {
		t.Errorf("SetBMC output ends:\n%s", withBMC[len(withBMC)-200:])
	}
}

// FuzzEntryComment: whatever a machine reports as its hardware facts, the
// comment lines of its entry never change the parsed inventory: the
// servers.yaml with comments loads to the same servers as without.
func FuzzEntryComment(f *testing.F) {
	for _, s := range []string{"QEMU Standard PC", "x\nservers: []", "a\r\n- name: evil", "\x00\x85\u2028# b", "\"'{}[]&*!|>%@`"} {
		f.Add(s)
	}
	base := []byte("servers:\n  - name: a\n    zone: z\n    bootMAC: \"52:54:00:00:00:01\"\n")
	e := Entry{Name: "auto-525400aa0001", Zone: "z", BootMAC: "52:54:00:aa:00:01", BootMode: "uefi"}
	plain, err := AppendEntries(base, []Entry{e})
	if err != nil {
		f.Fatal(err)
	}
	want, err := inventory.Load(mapFS(map[string][]byte{inventory.ServersFile: plain}), inventory.Limits{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, fact string) {
		if len(fact) > 4096 {
			return
		}
		c := e
		c.Comment = []string{"hardware: " + fact, fact}
		out, err := AppendEntries(base, []Entry{c})
		if err != nil {
			t.Fatal(err)
		}
		got, err := inventory.Load(mapFS(map[string][]byte{inventory.ServersFile: out}), inventory.Limits{})
		if err != nil {
			t.Fatalf("comment %q broke servers.yaml: %v\n%s", fact, err, out)
		}
		if got.Inventory.Digest != want.Inventory.Digest {
			t.Fatalf("comment %q changed the inventory:\n%s", fact, out)
		}
	})
}
