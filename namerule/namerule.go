// Package namerule is the one definition of each name rule Machina checks
// at more than one boundary: the inventory schema (schema/*.json: the
// "format" of a $defs entry is checked with the rule here, and the
// "pattern" beside it is a copy for other JSON Schema tools, kept equal by
// a test), the inventory's cross-file checks, and the join path (join/spec,
// at token issue, at join and on the node before anything reaches netlink
// or an lvm2 command line).
//
// namerule is a leaf: it imports the standard library only
// (docs/architecture.md), so the node agent links it.
package namerule

import (
	"fmt"
	"regexp"
	"strings"
)

// Rule is one name rule: a pattern (RE2 and ECMA-262 alike, so the schema
// copy means the same to every validator), a length bound in bytes, and
// for some rules reserved prefixes that a pattern cannot say (RE2 has no
// lookahead).
type Rule struct {
	// Name is the rule's name and the JSON Schema "format" that checks it.
	Name string
	// Pattern is the whole-string regular expression.
	Pattern string
	// What says in words what the rule allows, for error messages.
	What string
	// ReservedPrefixes are refused although the pattern matches.
	ReservedPrefixes []string

	re *regexp.Regexp
}

func rule(name, pattern, what string) *Rule {
	return &Rule{Name: name, Pattern: pattern, What: what, re: regexp.MustCompile(pattern)}
}

// The rules.
var (
	// Label is an RFC 1123 label (RFC 1123 §2.1, as Kubernetes' DNS label):
	// 1-63 lower-case letters, digits and '-', starting and ending with a
	// letter or digit. Server, profile, zone, site, rack and network names,
	// and host names (the joined host is named after its server).
	Label = rule("machina-label", `^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`,
		"an RFC 1123 label (1-63 lower-case letters, digits and '-', starting and ending with a letter or digit)")
	// Ifname is a Linux interface name: at most IFNAMSIZ-1 = 15 bytes, no
	// '/', ':' or whitespace (net/core/dev.c dev_valid_name); Machina also
	// refuses a leading '-' or '.' so that a name is never read as an
	// option or a hidden file. Bridges and NICs.
	Ifname = rule("ifname", `^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$`,
		"a Linux interface name (1-15 letters, digits, '_', '.' and '-', not starting with '-' or '.')")
	// Tag is a host tag or a storage pool name: 1-63 letters, digits, '_',
	// '.' and '-', starting with a letter or digit.
	Tag = rule("tag", `^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`,
		"a tag (1-63 letters, digits, '_', '.' and '-', starting with a letter or digit)")
	// VolumeGroup is an LVM pool's name: a Tag that lvm(8) "VALID NAMES"
	// also accepts as a volume group (its reserved prefixes refused).
	VolumeGroup = &Rule{Name: "lvm-vg", Pattern: Tag.Pattern, re: Tag.re,
		What:             "an LVM volume group name (a tag not starting with snapshot or pvmove)",
		ReservedPrefixes: []string{"snapshot", "pvmove"}}
	// LabelValue is a label value (Kubernetes' label value): empty, or 1-63
	// letters, digits, '-', '_' and '.', starting and ending with a letter
	// or digit. A label key's name part is a non-empty LabelValue.
	LabelValue = rule("label-value", `^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$`,
		"a label value (at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit)")
	// LabelKey is a label key: an optional DNS subdomain prefix (at most
	// 253 bytes) and '/', then a name that is a non-empty LabelValue.
	LabelKey = rule("label-key", `^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$`,
		"a label key (an optional DNS subdomain prefix and '/', then 1-63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit)")
)

// maxLabelKeyPrefix bounds a label key's DNS subdomain prefix (RFC 1123).
const maxLabelKeyPrefix = 253

// All lists every rule, for the schema's formats and the agreement tests.
func All() []*Rule { return []*Rule{Label, Ifname, Tag, VolumeGroup, LabelValue, LabelKey} }

// Valid reports whether s satisfies r.
func (r *Rule) Valid(s string) bool { return r.Check(s) == nil }

// Check returns nil when s satisfies r, else an error quoting s and saying
// what r allows.
func (r *Rule) Check(s string) error {
	ok := r.re.MatchString(s)
	if ok && r == LabelKey {
		if i := strings.LastIndexByte(s, '/'); i > maxLabelKeyPrefix {
			ok = false
		}
	}
	for _, p := range r.ReservedPrefixes {
		ok = ok && !strings.HasPrefix(s, p)
	}
	if !ok {
		return fmt.Errorf("%q is not %s", s, r.What)
	}
	return nil
}
