package inventory

import "testing"

// TestDocPositions pins what at and keyAt answer: the value's (or key's)
// line and column, the nearest ancestor for a pointer that leads nowhere,
// the first of duplicate keys, escaped keys (RFC 6901 §4), and no descent
// into an alias.
func TestDocPositions(t *testing.T) {
	src := "servers:\n" + // 1
		"  - name: a\n" + // 2
		"    labels:\n" + // 3
		"      rack/row: r1\n" + // 4
		"      ti~lde: x\n" + // 5
		"      dup: first\n" + // 6
		"      dup: second\n" + // 7
		"  - &b\n" + // 8
		"    name: b\n" + // 9
		"  - *b\n" // 10
	d, errs := parseYAML("servers.yaml", []byte(src), Limits{}.withDefaults())
	if d == nil {
		t.Fatalf("parse: %v", errs)
	}
	if len(errs) != 1 || errs[0].Line != 7 || errs[0].Path != "servers[0].labels.dup" {
		t.Fatalf("errors = %v, want the duplicate key at line 7", errs)
	}
	for _, tc := range []struct {
		pointer string
		at, key position
	}{
		{"", position{1, 1}, position{1, 1}},
		{"/servers", position{2, 3}, position{1, 1}},
		{"/servers/0/name", position{2, 11}, position{2, 5}},
		{"/servers/0/labels/rack~1row", position{4, 17}, position{4, 7}},
		{"/servers/0/labels/ti~0lde", position{5, 15}, position{5, 7}},
		{"/servers/0/labels/dup", position{6, 12}, position{6, 7}},
		{"/servers/0/labels/missing", position{4, 7}, position{4, 7}},
		{"/servers/00", position{2, 3}, position{2, 3}},
		{"/servers/3", position{2, 3}, position{2, 3}},
		{"/servers/1/name", position{9, 11}, position{9, 5}},
		{"/servers/2/name", position{10, 5}, position{10, 5}},
	} {
		if got := d.at(tc.pointer); got != tc.at {
			t.Errorf("at(%q) = %v, want %v", tc.pointer, got, tc.at)
		}
		if got := d.keyAt(tc.pointer); got != tc.key {
			t.Errorf("keyAt(%q) = %v, want %v", tc.pointer, got, tc.key)
		}
	}
}
