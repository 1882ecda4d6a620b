package schema

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestValidate(t *testing.T) {
	v, err := New()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		kind Kind
		doc  string
		want []Violation
	}{
		{"valid server", Servers, `{"servers":[{"name":"r1-n01","zone":"zone-a","bootMAC":"52:54:00:00:01:01","bmc":{"driver":"redfish","address":"https://10.0.0.1","credentials":"bmc-default"}}]}`, nil},
		{"server without bmc (auto-enrolled entry)", Servers, `{"servers":[{"name":"auto-525400aa0001","zone":"discovered","tags":["auto-enrolled"],"bootMAC":"52:54:00:aa:00:01","bootMode":"uefi"}]}`, nil},
		{"bare and dot MACs", Servers, `{"servers":[{"name":"a","zone":"z","bootMAC":"525400000101","bmc":{"driver":"ipmi","address":"10.0.0.1:623","credentials":"c"}},{"name":"b","zone":"z","bootMAC":"5254.0000.0102","bmc":{"driver":"ipmi","address":"bmc-b","credentials":"c"}}]}`, nil},
		{"bad mac", Servers, `{"servers":[{"name":"a","zone":"z","bootMAC":"52:54:00:zz:00:01","bmc":{"driver":"ipmi","address":"h","credentials":"c"}}]}`,
			[]Violation{{Pointer: "/servers/0/bootMAC", Keyword: "format", Def: "mac", Detail: "is not a MAC address"}}},
		{"unknown field and missing", Servers, `{"servers":[{"name":"a","zone":"z","bootMac":"x","bmc":{"driver":"ipmi","address":"h","credentials":"c"}}]}`,
			[]Violation{
				{Pointer: "/servers/0", Keyword: "additionalProperties", Def: "server", Detail: `unknown field "bootMac"`, Fields: []string{"bootMac"}},
				{Pointer: "/servers/0", Keyword: "required", Def: "server", Detail: `missing required field "bootMAC"`, Fields: []string{"bootMAC"}},
			}},
		{"ipmi address must be host:port", Servers, `{"servers":[{"name":"a","zone":"z","bootMAC":"525400000101","bmc":{"driver":"ipmi","address":"https://x","credentials":"c"}}]}`,
			[]Violation{{Pointer: "/servers/0/bmc/address", Keyword: "pattern", Def: "hostPort", Detail: "is not a host[:port] address"}}},
		// bmc.minCipherSuite: IPMI only, 3 or 17.
		{"ipmi minCipherSuite 17", Servers, `{"servers":[{"name":"a","zone":"z","bootMAC":"525400000101","bmc":{"driver":"ipmi","address":"h","credentials":"c","minCipherSuite":17}}]}`, nil},
		{"ipmi minCipherSuite 2", Servers, `{"servers":[{"name":"a","zone":"z","bootMAC":"525400000101","bmc":{"driver":"ipmi","address":"h","credentials":"c","minCipherSuite":2}}]}`,
			[]Violation{{Pointer: "/servers/0/bmc/minCipherSuite", Keyword: "enum", Def: "bmc", Detail: `value must be one of "3", "17"`}}},
		{"redfish minCipherSuite", Servers, `{"servers":[{"name":"a","zone":"z","bootMAC":"525400000101","bmc":{"driver":"redfish","address":"https://h","credentials":"c","minCipherSuite":3}}]}`,
			[]Violation{{Pointer: "/servers/0/bmc/minCipherSuite", Keyword: "not", Def: "ipmiOnly", Detail: "applies to IPMI BMCs only (driver ipmi)"}}},
		// cpu.smbiosArch: a GOARCH name from a fixed list, no other type or value.
		{"report with smbiosArch", AgentReport, agentReportWithCPU(`"arch":"386","smbiosArch":"amd64"`), nil},
		{"report smbiosArch not a string", AgentReport, agentReportWithCPU(`"smbiosArch":5`),
			[]Violation{{Pointer: "/facts/cpu/smbiosArch", Keyword: "type", Def: "facts", Detail: "expected string, but got number"}}},
		{"report smbiosArch not a GOARCH", AgentReport, agentReportWithCPU(`"smbiosArch":"x86_64"`),
			[]Violation{{Pointer: "/facts/cpu/smbiosArch", Keyword: "enum", Def: "facts", Detail: `value must be one of "386", "amd64", "arm", "arm64", "riscv64", "loong64"`}}},
		{"image needs one source", Images, `{"images":[{"name":"x","catalog":"debian-12","url":"http://m/x.img"}]}`,
			[]Violation{{Pointer: "/images/0", Keyword: "oneOf", Def: "image", Detail: choiceDetails["image"]}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := v.ValidateJSON(tt.kind, []byte(tt.doc))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Validate(%s) mismatch (-want +got):\n%s", tt.doc, diff)
			}
		})
	}
}

// TestFilesAreValidJSONWithDescriptions checks that every property in every
// schema carries a description, as editors show them on hover.
func TestFilesAreValidJSONWithDescriptions(t *testing.T) {
	for _, k := range Kinds {
		b, err := files.ReadFile(k.FileName())
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", k.FileName(), err)
		}
		if doc["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
			t.Errorf("%s: $schema = %v, want draft 2020-12", k.FileName(), doc["$schema"])
		}
		checkDescriptions(t, k.FileName(), "", doc)
	}
}

func checkDescriptions(t *testing.T, file, path string, node map[string]any) {
	t.Helper()
	if obj, ok := node["properties"].(map[string]any); ok {
		if node["additionalProperties"] != false {
			t.Errorf("%s %s: object without additionalProperties: false", file, path)
		}
		for name, p := range obj {
			pm := p.(map[string]any)
			_, hasDesc := pm["description"]
			ref, hasRef := pm["$ref"].(string)
			if !hasDesc && !(hasRef && refHasDescription(file, ref)) {
				t.Errorf("%s %s/properties/%s: no description", file, path, name)
			}
			checkDescriptions(t, file, path+"/properties/"+name, pm)
		}
	}
	if defs, ok := node["$defs"].(map[string]any); ok {
		for name, d := range defs {
			checkDescriptions(t, file, path+"/$defs/"+name, d.(map[string]any))
		}
	}
}

func refHasDescription(file, ref string) bool {
	b, _ := files.ReadFile(file)
	var doc map[string]any
	_ = json.Unmarshal(b, &doc)
	defs := doc["$defs"].(map[string]any)
	d, ok := defs[ref[len("#/$defs/"):]].(map[string]any)
	if !ok {
		return false
	}
	_, has := d["description"]
	return has
}

// TestIsMAC: the "mac" format admits the notations inventory normalises and
// refuses the rest (the list inventory's NormalizeMAC test refused).
func TestIsMAC(t *testing.T) {
	for _, in := range []string{"52:54:00:AA:bb:01", "52-54-00-aa-BB-01", "5254.00aa.bb01", "525400AABB01"} {
		if !isMAC(in) {
			t.Errorf("isMAC(%q) = false", in)
		}
	}
	for _, in := range []string{"", "52:54:00:aa:bb", "52:54:00:aa:bb:01:02:03", "zz:54:00:aa:bb:01", "52545400aabb01", " 52:54:00:aa:bb:01"} {
		if isMAC(in) {
			t.Errorf("isMAC(%q) = true", in)
		}
	}
}

// agentReportWithCPU is a minimal commissioning report (agent-report.schema.json)
// whose facts.cpu holds cores and the fields in extra (JSON members).
func agentReportWithCPU(extra string) string {
	return `{"bootMAC":"52:54:00:00:00:07","facts":{"cpu":{"cores":8,` + extra + `},"memory":{"totalBytes":34359738368}},` +
		`"tests":[{"name":"cpu","passed":true},{"name":"memory","passed":true},{"name":"disk","passed":false},{"name":"network","passed":true}]}`
}
