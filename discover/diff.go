package discover

import (
	"fmt"
	"strings"
)

// Diff returns a unified diff (one hunk, no context lines) of the single
// changed region between old and new, as `git diff` would show an append
// or one replaced block; "" when they are equal. name is the file's path.
func Diff(name string, old, new []byte) string {
	if string(old) == string(new) {
		return ""
	}
	a, b := splitLines(string(old)), splitLines(string(new))
	p := 0
	for p < len(a) && p < len(b) && a[p] == b[p] {
		p++
	}
	s := 0
	for s < len(a)-p && s < len(b)-p && a[len(a)-1-s] == b[len(b)-1-s] {
		s++
	}
	del, add := a[p:len(a)-s], b[p:len(b)-s]
	var w strings.Builder
	fmt.Fprintf(&w, "--- a/%s\n+++ b/%s\n@@ -%s +%s @@\n", name, name, hunkRange(p, len(del)), hunkRange(p, len(add)))
	for _, l := range del {
		w.WriteString("-" + lineOut(l))
	}
	for _, l := range add {
		w.WriteString("+" + lineOut(l))
	}
	return w.String()
}

// hunkRange is "start,count" with start 1-based, or the line before an
// empty range (unified diff format).
func hunkRange(p, n int) string {
	if n == 0 {
		return fmt.Sprintf("%d,0", p)
	}
	return fmt.Sprintf("%d,%d", p+1, n)
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	ls := strings.SplitAfter(s, "\n")
	if ls[len(ls)-1] == "" {
		ls = ls[:len(ls)-1]
	}
	return ls
}

func lineOut(l string) string {
	if strings.HasSuffix(l, "\n") {
		return l
	}
	return l + "\n\\ No newline at end of file\n"
}
