package inventory

import (
	"errors"
	"strings"
	"testing"
	"testing/fstest"
)

func TestLabelKeyAndValueRules(t *testing.T) {
	for _, tc := range []struct {
		key  string
		good bool
	}{
		{"rack-row", true}, {"machina.io/room", true}, {"a", true}, {"A_b.c-D", true}, {"example.com/x", true},
		{"", false}, {"-x", false}, {"x-", false}, {"Bad.Prefix/x", false}, {"/x", false}, {"a/", false},
		{strings.Repeat("a", 63), true}, {strings.Repeat("a", 64), false}, {"a b", false},
	} {
		if err := CheckLabelKey(tc.key); (err == nil) != tc.good {
			t.Errorf("CheckLabelKey(%q) = %v, want good=%v", tc.key, err, tc.good)
		}
	}
	for _, tc := range []struct {
		v    string
		good bool
	}{{"", true}, {"x", true}, {"1.2_3-4", true}, {strings.Repeat("v", 63), true}, {strings.Repeat("v", 64), false}, {"-v", false}, {"a/b", false}} {
		if err := CheckLabelValue(tc.v); (err == nil) != tc.good {
			t.Errorf("CheckLabelValue(%q) = %v, want good=%v", tc.v, err, tc.good)
		}
	}
}

func TestSelectorMatchesAndExplains(t *testing.T) {
	labels := map[string]string{"gpu.vendor": "nvidia", "memory.gib": "512", "tag.nvme": "true", "room": "b"}
	for _, tc := range []struct {
		name string
		sel  *Selector
		ok   bool
		why  string
	}{
		{"nil", nil, true, ""},
		{"matchLabels", &Selector{MatchLabels: map[string]string{"gpu.vendor": "nvidia", "room": "b"}}, true, ""},
		{"matchLabels miss", &Selector{MatchLabels: map[string]string{"room": "a"}}, false, `room In (a): has "b"`},
		{"In", &Selector{MatchExpressions: []Requirement{{Key: "gpu.vendor", Operator: OpIn, Values: []string{"amd", "nvidia"}}}}, true, ""},
		{"NotIn", &Selector{MatchExpressions: []Requirement{{Key: "gpu.vendor", Operator: OpNotIn, Values: []string{"nvidia"}}}}, false, `gpu.vendor NotIn (nvidia): has "nvidia"`},
		{"NotIn absent", &Selector{MatchExpressions: []Requirement{{Key: "cpu.vendor", Operator: OpNotIn, Values: []string{"amd"}}}}, true, ""},
		{"Exists", &Selector{MatchExpressions: []Requirement{{Key: "tag.nvme", Operator: OpExists}}}, true, ""},
		{"DoesNotExist", &Selector{MatchExpressions: []Requirement{{Key: "tag.nvme", Operator: OpDoesNotExist}}}, false, `tag.nvme DoesNotExist: has "true"`},
		{"Gt", &Selector{MatchExpressions: []Requirement{{Key: "memory.gib", Operator: OpGt, Values: []string{"256"}}}}, true, ""},
		{"Lt", &Selector{MatchExpressions: []Requirement{{Key: "memory.gib", Operator: OpLt, Values: []string{"256"}}}}, false, `memory.gib Lt 256: has "512"`},
		{"Gt absent", &Selector{MatchExpressions: []Requirement{{Key: "nic.speed.max", Operator: OpGt, Values: []string{"1"}}}}, false, "nic.speed.max Gt 1: has none"},
		{"Gt not integer", &Selector{MatchExpressions: []Requirement{{Key: "room", Operator: OpGt, Values: []string{"1"}}}}, false, `room Gt 1: has "b" (not an integer)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, why := tc.sel.Explain(labels)
			if ok != tc.ok || why != tc.why {
				t.Errorf("Explain = %v, %q; want %v, %q", ok, why, tc.ok, tc.why)
			}
		})
	}
}

const labelServers = `servers:
  - name: n01
    zone: z
    bootMAC: "52:54:00:00:00:01"
    tags: [nvme]
    labels: {room: b, machina.io/owner: team-a}
    bmc: {driver: ipmi, address: "10.0.0.1", credentials: c}
    fence: {driver: ipmi, address: "10.0.1.1", credentials: pdu}
  - name: n02
    zone: z
    bootMAC: "52:54:00:00:00:02"
    labels: {room: a}
    bmc: {driver: ipmi, address: "10.0.0.2", credentials: c}
`

func loadWithProfile(t *testing.T, servers, profile string) (*Result, error) {
	t.Helper()
	return Load(fstest.MapFS{
		ServersFile:  {Data: []byte(servers)},
		ImagesFile:   {Data: []byte("images:\n  - name: img\n    url: http://mirror.lan/x.raw\n    checksum: sha256:" + strings.Repeat("a", 64) + "\n")},
		ProfilesFile: {Data: []byte("profiles:\n  - name: p\n    image: img\n    deploy: autoinstall\n" + profile)},
	}, Limits{})
}

// TestSelectorValidation: a selector that stated labels (tags included)
// can match, or that names derived labels, is valid; one no server's
// stated labels can ever match is refused naming the file, line and a
// server's missing label; bad syntax is refused per field.
func TestSelectorValidation(t *testing.T) {
	for _, tc := range []struct {
		name, profile, wantErr string
	}{
		{"stated", "    selector: {matchLabels: {room: b}}\n", ""},
		{"tag", "    selector: {matchExpressions: [{key: tag.nvme, operator: Exists}]}\n", ""},
		{"derived", "    selector: {matchLabels: {gpu.vendor: nvidia}}\n    fence: auto\n", ""},
		{"never", "    selector: {matchLabels: {room: c}}\n", `profiles.yaml:5:15: profiles[0].selector: no server in servers.yaml can ever match this selector: 2 servers in zone any, none with the stated labels (first, n01: room In (c): has "b")`},
		{"gt values", "    selector: {matchExpressions: [{key: memory.gib, operator: Gt, values: [lots]}]}\n", `Gt needs an integer, not "lots"`},
		{"exists values", "    selector: {matchExpressions: [{key: room, operator: Exists, values: [a]}]}\n", "Exists takes no values"},
		{"in empty", "    selector: {matchExpressions: [{key: room, operator: In}]}\n", "In needs at least one value"},
		{"bad operator", "    selector: {matchExpressions: [{key: room, operator: Near, values: [a]}]}\n", "operator"},
		{"bad key", "    selector: {matchLabels: {-room: a}}\n", "-room"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadWithProfile(t, labelServers, tc.profile)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Load = %v, want valid", err)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Load = %v, want a validation error", err)
			}
			for _, fe := range verr.Errors {
				if strings.Contains(fe.Error(), tc.wantErr) {
					return
				}
			}
			t.Fatalf("Load = %v, want an error containing %q", verr.Errors, tc.wantErr)
		})
	}
}

// TestStatedLabelRules: stated labels may not use derived keys or the tag
// prefix, and follow the label rules; tags map to tag.NAME: "true".
func TestStatedLabelRules(t *testing.T) {
	res, err := loadWithProfile(t, labelServers, "")
	if err != nil {
		t.Fatal(err)
	}
	got := StatedLabels(res.Inventory.Server("n01"))
	if got["tag.nvme"] != "true" || got["room"] != "b" || got["machina.io/owner"] != "team-a" || len(got) != 3 {
		t.Errorf("StatedLabels(n01) = %v", got)
	}
	if f := res.Inventory.Server("n01").Fence; f == nil || f.Credentials != "pdu" || f.Driver != DriverIPMI {
		t.Errorf("n01 fence = %+v, want the ipmi fencing device", f)
	}
	for _, tc := range []struct{ labels, want string }{
		{"{cpu.vendor: intel}", `label "cpu.vendor" is derived from the commissioning report`},
		{"{tag.x: \"true\"}", `label keys starting "tag." are the tags`},
		{"{room: \"a b\"}", "servers[1].labels.room: \"a b\" has an invalid format"},
	} {
		bad := strings.Replace(labelServers, "{room: a}", tc.labels, 1)
		_, err := loadWithProfile(t, bad, "")
		var verr *ValidationError
		if !errors.As(err, &verr) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("labels %s: Load = %v, want %q", tc.labels, err, tc.want)
		}
	}
}
