package main

import (
	"strings"
	"unicode"
)

// termSafe neutralises text a machine or BMC supplied (a failed test's
// reason, a BMC log message, an image error) before machinactl prints it
// for a person: C0 and C1 control characters (ESC and CSI start terminal
// escape sequences), DEL, and the Unicode bidirectional overrides and
// isolates (which reorder what a terminal shows) are each replaced by
// U+FFFD; tabs and newlines become spaces. JSON output is not passed
// through it: encoding/json escapes control characters itself and the
// text stays as the machine sent it.
func termSafe(s string) string {
	clean := true
	for _, r := range s {
		if unsafeRune(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		switch {
		case r == '\t' || r == '\n' || r == '\r':
			b.WriteByte(' ')
		case unsafeRune(r):
			b.WriteRune(unicode.ReplacementChar)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func unsafeRune(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x200e, r == 0x200f, r == 0x061c:
		return true
	}
	return false
}

// termSafeLines is termSafe for multi-line output (a rendered plan): each
// line is neutralised and the newlines between them are kept.
func termSafeLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = termSafe(l)
	}
	return strings.Join(lines, "\n")
}
