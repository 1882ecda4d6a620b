package discover

import (
	"bytes"
	"strings"
	"testing"
)

// TestWriteTableNeutralisesControlCharacters: everything in a table cell
// comes from whatever answered in the range, so an escape sequence, a
// carriage return or a tab in a BMC's Manufacturer, Model or SerialNumber
// must not reach the operator's terminal.
func TestWriteTableNeutralisesControlCharacters(t *testing.T) {
	rep := &Report{Range: "10.0.0.0/30", Probed: 2, Results: []Result{{
		Address: "https://10.0.0.1", Status: StatusAuthenticated, Credentials: "bmc-a",
		Manufacturer: "Evil\x1b]0;pwned\x07 Inc.", Model: "R1\r\nfake line", Serial: "S\tN\x9b2J",
		MACs: []string{"52:54:00:00:00:01"}, Error: "bad\xffutf8",
	}, {
		Address: "https://10.0.0.2", Status: StatusNotRedfish, Error: "GET /redfish/v1/ answered 404 without a Redfish service root",
	}}}
	var b bytes.Buffer
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, bad := range []string{"\x1b", "\x07", "\r", "\t", "\x9b", "\xff"} {
		if strings.Contains(out, bad) {
			t.Errorf("table carries %q:\n%q", bad, out)
		}
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 4 { // header, two rows, summary
		t.Fatalf("want 4 lines, got %d:\n%s", len(lines), out)
	}
	if !strings.Contains(lines[1], "Evil?]0;pwned? Inc.") || !strings.Contains(lines[1], "R1??fake line") || !strings.Contains(lines[1], "S?N?2J") {
		t.Errorf("row 1: %q", lines[1])
	}
	if !strings.Contains(lines[2], "not-redfish") || !strings.Contains(lines[2], "answered 404") {
		t.Errorf("row 2: %q", lines[2])
	}
	if lines[3] != "10.0.0.0/30: 2 probed, 2 answered, 1 authenticated, 0 refused every credential, 1 not Redfish, 0 errors" {
		t.Errorf("summary: %q", lines[3])
	}
}

func TestWriteTableSaysIncomplete(t *testing.T) {
	var b bytes.Buffer
	if err := WriteTable(&b, &Report{Range: "10.0.0.0/24", Probed: 254, Incomplete: "the scan was stopped before it finished: context deadline exceeded"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "INCOMPLETE: the scan was stopped before it finished: context deadline exceeded\n10.0.0.0/24: 254 probed") {
		t.Errorf("table:\n%s", b.String())
	}
}
