package namerule_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"testing/fstest"

	"sigs.k8s.io/yaml"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/join/spec"
	"github.com/machina-metal/machina/namerule"
	"github.com/machina-metal/machina/schema"
)

// names is the table every rule is walked over: good and bad names of
// every kind the rules tell apart (leading '-' or '.', trailing '-',
// too long by one, upper case, '_', unicode, whitespace, control
// characters, path and option look-alikes, reserved LVM prefixes, empty).
var names = []string{
	"a", "0", "eth0", "br0", "lan", "storage-1", "enp3s0f1", "eth0.100", "_x", "a-b_c.d", "Tag_1", "X",
	strings.Repeat("a", 15), strings.Repeat("a", 16), strings.Repeat("a", 63), strings.Repeat("a", 64),
	"-eth0", ".eth0", "-", ".", "..", "lan-", "lan.", "l.an", "a..b", "LAN",
	"eth 0", "eth/0", "eth:0", "eth0\n", "eth\x000", "é0", "ｅｔｈ0", "eth\u202e0",
	"snapshot1", "pvmove0", "snap", "+vg", "vg+",
	"example.com/role", "Example.com/role", "a/b/c", "/role", "role/", strings.Repeat("a", 254) + "/x",
	"",
}

// site is one place a rule is checked: a field of servers.yaml or
// profiles.yaml, and what the join path is given for it.
type site struct {
	name string
	rule *namerule.Rule
	// servers and profiles fill the inventory around the value (JSON
	// quoted, valid YAML).
	servers, profiles func(q string) string
	// join is what the planner hands the join path for the value (nil:
	// the value never reaches it).
	join func(v string) v1.EnrolmentRequest
	// optional: the join path reads "" as the field left out (the schema
	// says the same by omission, so "" is not compared there).
	optional bool
	// host: the value is also the joining host's name, which the join
	// handler checks (spec.Hostname) besides the token's fields.
	host bool
	// inventoryOnly: the schema leaves this to the inventory's Go check
	// (label keys: a mapping's keys, reported with their own file and line).
	inventoryOnly bool
}

const baseServer = `servers:
  - name: n01
    zone: zone-a
    bootMAC: "52:54:00:00:00:01"
    bmc: {driver: redfish, address: https://10.0.0.1, credentials: bmc-default}
`

const sshKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1"

func profileJoin(join string) string {
	return fmt.Sprintf("profiles:\n  - name: p\n    image: ubuntu-24.04\n    sshKeys: [%q]\n    join: %s\n", sshKey, join)
}

func noProfiles(string) string  { return "profiles: []\n" }
func baseServers(string) string { return baseServer }

func sites() []site {
	return []site{
		{name: "servers.yaml name (the joined host's name)", rule: namerule.Label,
			servers: func(q string) string {
				return strings.Replace(baseServer, "name: n01", "name: "+q, 1)
			},
			profiles: noProfiles, host: true,
			join: func(v string) v1.EnrolmentRequest { return v1.EnrolmentRequest{Host: v, Server: v} }},
		{name: "profiles.yaml join.site", rule: namerule.Label, servers: baseServers, optional: true,
			profiles: func(q string) string { return profileJoin("{site: " + q + "}") },
			join:     func(v string) v1.EnrolmentRequest { return v1.EnrolmentRequest{Site: v} }},
		{name: "profiles.yaml join.networks[].name", rule: namerule.Label, servers: baseServers,
			profiles: func(q string) string { return profileJoin("{networks: [{name: " + q + ", bridge: br0, nic: eth0}]}") },
			join: func(v string) v1.EnrolmentRequest {
				return v1.EnrolmentRequest{Networks: []v1.JoinNetwork{{Name: v, Bridge: "br0", NIC: "eth0"}}}
			}},
		{name: "profiles.yaml join.networks[].bridge", rule: namerule.Ifname, servers: baseServers,
			profiles: func(q string) string { return profileJoin("{networks: [{name: lan, bridge: " + q + ", nic: ethY}]}") },
			join: func(v string) v1.EnrolmentRequest {
				return v1.EnrolmentRequest{Networks: []v1.JoinNetwork{{Name: "lan", Bridge: v, NIC: "ethY"}}}
			}},
		{name: "profiles.yaml join.networks[].nic", rule: namerule.Ifname, servers: baseServers,
			profiles: func(q string) string { return profileJoin("{networks: [{name: lan, bridge: brX, nic: " + q + "}]}") },
			join: func(v string) v1.EnrolmentRequest {
				return v1.EnrolmentRequest{Networks: []v1.JoinNetwork{{Name: "lan", Bridge: "brX", NIC: v}}}
			}},
		{name: "profiles.yaml join.tags[]", rule: namerule.Tag, servers: baseServers,
			profiles: func(q string) string { return profileJoin("{tags: [" + q + "]}") },
			join:     func(v string) v1.EnrolmentRequest { return v1.EnrolmentRequest{Tags: []string{v}} }},
		{name: "profiles.yaml join.storagePools[].name (dir)", rule: namerule.Tag, servers: baseServers,
			profiles: func(q string) string {
				return profileJoin("{storagePools: [{name: " + q + ", type: dir, path: /srv/pool}]}")
			},
			join: func(v string) v1.EnrolmentRequest {
				return v1.EnrolmentRequest{Pools: []v1.JoinPool{{Name: v, Type: v1.PoolDir, Path: "/srv/pool"}}}
			}},
		{name: "profiles.yaml join.storagePools[].name (lvm)", rule: namerule.VolumeGroup, servers: baseServers,
			profiles: func(q string) string {
				return profileJoin("{storagePools: [{name: " + q + ", type: lvm, disks: [/dev/disk/by-id/ata-disk1]}]}")
			},
			join: func(v string) v1.EnrolmentRequest {
				return v1.EnrolmentRequest{Pools: []v1.JoinPool{{Name: v, Type: v1.PoolLVM, Disks: []string{"/dev/disk/by-id/ata-disk1"}}}}
			}},
		{name: "servers.yaml labels value", rule: namerule.LabelValue, profiles: noProfiles,
			servers: func(q string) string {
				return baseServer + "    labels: {room: " + q + "}\n"
			}},
		{name: "servers.yaml labels key", rule: namerule.LabelKey, profiles: noProfiles, inventoryOnly: true,
			servers: func(q string) string {
				return baseServer + "    labels: {" + q + ": x}\n"
			}},
	}
}

const images = "images:\n  - {name: ubuntu-24.04, catalog: ubuntu-24.04}\n"

// TestRulesAgree walks every name rule over the table: at each place the
// rule is checked, the schema (the file alone), the inventory (schema and
// cross-file checks over the three files) and the join path (what the
// planner hands it for the value) all give the rule's verdict (for a
// label key the schema is not consulted: it leaves a mapping's keys to
// the inventory, which names the key's file and line and still runs its
// cross-file checks). A name the
// schema accepted and the join path refused made every deploy of that
// profile fail at plan time ("-eth0" and ".eth0"; before this
// test also the LVM pool "snapshot1", and the host tag and dir pool name
// "Tag_1" refused by the schema but taken by the join path).
func TestRulesAgree(t *testing.T) {
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sites() {
		// The base inventory is valid.
		if err := load(s.servers(`"lan"`), s.profiles(`"lan"`)); err != nil {
			t.Fatalf("%s: the base inventory is invalid: %v", s.name, err)
		}
		for _, n := range names {
			q, _ := json.Marshal(n)
			want := s.rule.Valid(n)
			srv, prof := s.servers(string(q)), s.profiles(string(q))
			schemaOK := validates(t, v, schema.Servers, srv) && validates(t, v, schema.Profiles, prof)
			invOK := load(srv, prof) == nil
			if schemaOK != want && !(s.inventoryOnly && schemaOK) || invOK != want {
				t.Errorf("%s %q: rule %s valid %v, schema %v, inventory %v", s.name, n, s.rule.Name, want, schemaOK, invOK)
			}
			if s.join != nil && !(s.optional && n == "") {
				err := spec.Enrolment(s.join(n))
				if s.host && err == nil {
					err = spec.Hostname(n)
				}
				if joinOK := err == nil; joinOK != want {
					t.Errorf("%s %q: rule %s valid %v, join path %v (%v)", s.name, n, s.rule.Name, want, joinOK, err)
				}
			}
		}
	}
}

// TestVLANAgrees: the VLAN ID's bounds are the same in the schema, the
// inventory and the join path (0, untagged, is said by leaving vlan out
// of profiles.yaml; the join path reads a missing one as 0).
func TestVLANAgrees(t *testing.T) {
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []int{-1, 1, 2, 100, 4094, 4095, 5000} {
		prof := profileJoin(fmt.Sprintf("{networks: [{name: lan, bridge: br0, nic: eth0, vlan: %d}]}", id))
		want := id >= 1 && id <= 4094
		schemaOK := validates(t, v, schema.Profiles, prof)
		invOK := load(baseServer, prof) == nil
		joinOK := spec.Enrolment(v1.EnrolmentRequest{Networks: []v1.JoinNetwork{{Name: "lan", Bridge: "br0", NIC: "eth0", VLAN: id}}}) == nil
		if schemaOK != want || invOK != want || joinOK != want {
			t.Errorf("vlan %d: want %v, schema %v, inventory %v, join path %v", id, want, schemaOK, invOK, joinOK)
		}
	}
}

// TestPatternsCopyNameRules: every $defs entry that names a rule by its
// "format" carries that rule's pattern, character for character (the
// pattern is the copy other JSON Schema tools, ajv and editors, read);
// and every rule is used by the schema somewhere.
func TestPatternsCopyNameRules(t *testing.T) {
	used := map[string]bool{}
	for _, f := range []string{"../schema/servers.schema.json", "../schema/profiles.schema.json", "../schema/images.schema.json"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Defs map[string]struct {
				Pattern string `json:"pattern"`
				Format  string `json:"format"`
			} `json:"$defs"`
		}
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		for name, d := range doc.Defs {
			for _, r := range namerule.All() {
				if d.Format != r.Name {
					continue
				}
				used[r.Name] = true
				if d.Pattern != r.Pattern {
					t.Errorf("%s $defs/%s: pattern %q, but rule %s is %q", f, name, d.Pattern, r.Name, r.Pattern)
				}
			}
		}
	}
	for _, r := range namerule.All() {
		if !used[r.Name] {
			t.Errorf("rule %s is the format of no $defs entry", r.Name)
		}
	}
}

func validates(t *testing.T, v *schema.Validator, kind schema.Kind, y string) bool {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		return false // not even YAML: refused
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	var d any
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	return len(v.Validate(kind, d)) == 0
}

func load(servers, profiles string) error {
	_, err := inventory.Load(fstest.MapFS{
		"servers.yaml":  {Data: []byte(servers)},
		"profiles.yaml": {Data: []byte(profiles)},
		"images.yaml":   {Data: []byte(images)},
	}, inventory.Limits{})
	return err
}
