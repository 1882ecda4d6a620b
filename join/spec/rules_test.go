package spec_test

import (
	"encoding/json"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join/spec"
	"github.com/machina-metal/machina/schema"
)

// TestSchemaAgreesWithJoinRules walks the name rules a profile's join
// networks pass through (network name, bridge and NIC interface names)
// and checks that what the schema accepts the join path accepts too, and
// the other way round: a name valid in profiles.yaml that the join path
// refuses made every deploy of that profile fail at plan time (a past bug:
// "-eth0" passed the schema's ^[A-Za-z0-9_.-]{1,15}$).
func TestSchemaAgreesWithJoinRules(t *testing.T) {
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	doc := func(name, bridge, nic string) any {
		b, _ := json.Marshal(map[string]any{"profiles": []any{map[string]any{"name": "p", "image": "img",
			"join": map[string]any{"networks": []any{map[string]any{"name": name, "bridge": bridge, "nic": nic}}}}}})
		var d any
		_ = json.Unmarshal(b, &d)
		return d
	}
	if vs := v.Validate(schema.Profiles, doc("lan", "br0", "eth0")); vs != nil {
		t.Fatalf("base document invalid: %+v", vs)
	}
	ifnames := []string{"eth0", "br0", "enp3s0f1", "_x", "eth0.100", "a-b_c.d", strings.Repeat("a", 15), strings.Repeat("a", 16),
		"-eth0", ".eth0", "eth 0", "eth/0", "eth:0", "", "é0", "0"}
	for _, n := range ifnames {
		for _, field := range []string{"bridge", "nic"} {
			var d any
			if field == "bridge" {
				d = doc("lan", n, "ethY")
			} else {
				d = doc("lan", "brX", n)
			}
			schemaOK := v.Validate(schema.Profiles, d) == nil
			joinOK := spec.Ifname(field, n) == nil
			if schemaOK != joinOK {
				t.Errorf("%s %q: schema valid %v, join path valid %v", field, n, schemaOK, joinOK)
			}
		}
	}
	for _, n := range []string{"lan", "storage-1", "a", "-lan", "lan-", "LAN", "l.an", strings.Repeat("a", 63), strings.Repeat("a", 64), ""} {
		schemaOK := v.Validate(schema.Profiles, doc(n, "br0", "eth0")) == nil
		joinOK := spec.Network(0, v1.JoinNetwork{Name: n, Bridge: "br0", NIC: "eth0"}) == nil
		if schemaOK != joinOK {
			t.Errorf("network name %q: schema valid %v, join path valid %v", n, schemaOK, joinOK)
		}
	}
}

// TestSchemaBoundsSayTheBound: an impossible minimum (the issue's
// memoryGiB 8589934592, which admitted every server) is refused with a
// message stating the bound.
func TestSchemaBoundsSayTheBound(t *testing.T) {
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	for field, tc := range map[string]struct {
		val   int64
		bound string
	}{"memoryGiB": {8589934592, "65536"}, "cores": {100000, "4096"}, "diskGiB": {1 << 40, "524288"}} {
		var d any
		b, _ := json.Marshal(map[string]any{"profiles": []any{map[string]any{"name": "p", "image": "img", "min": map[string]any{field: tc.val}}}})
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.UseNumber() // as the inventory loader decodes
		_ = dec.Decode(&d)
		vs := v.Validate(schema.Profiles, d)
		if len(vs) == 0 || !strings.Contains(vs[0].Detail, tc.bound) {
			t.Errorf("min.%s %d: %+v, want a violation stating %s", field, tc.val, vs, tc.bound)
		}
	}
}

// TestSchemaBoundsRootDeviceMinSize: rootDevice.minSizeGiB is shifted
// into bytes (<< 30) for the deploy plan, so 8589934592 (2^33) GiB wrapped
// to a negative minimum that every disk meets. The schema bounds it like
// min.diskGiB and the message states the bound.
func TestSchemaBoundsRootDeviceMinSize(t *testing.T) {
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		val  int64
		want bool // a violation at minSizeGiB stating 524288
	}{{8589934592, true}, {524289, true}, {524288, false}, {1, false}} {
		b, _ := json.Marshal(map[string]any{"servers": []any{map[string]any{"name": "s1", "rootDevice": map[string]any{"minSizeGiB": tc.val}}}})
		var d any
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.UseNumber() // as the inventory loader decodes
		if err := dec.Decode(&d); err != nil {
			t.Fatal(err)
		}
		got := false
		for _, vi := range v.Validate(schema.Servers, d) {
			if strings.HasSuffix(vi.Pointer, "/rootDevice/minSizeGiB") && strings.Contains(vi.Detail, "524288") {
				got = true
			}
		}
		if got != tc.want {
			t.Errorf("rootDevice.minSizeGiB %d: violation stating 524288 %v, want %v", tc.val, got, tc.want)
		}
	}
}
