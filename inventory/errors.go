package inventory

import (
	"fmt"
	"sort"
	"strings"
)

// Severity of a problem.
type Severity string

// Severities. Warnings do not make a revision invalid; `machinactl validate
// --strict` fails on them too.
const (
	SeverityError   Severity = "error"
	SeverityWarning Severity = "warning"
)

// FieldError is one problem in an inventory file, located by file, line and
// column (1-based; 0 when unknown) and by the field's path in the document
// (servers[2].bootMAC). Msg never repeats a secret-looking value.
type FieldError struct {
	File     string   `json:"file"`
	Line     int      `json:"line"`
	Col      int      `json:"column"`
	Path     string   `json:"path,omitempty"`
	Msg      string   `json:"message"`
	Severity Severity `json:"severity"`
}

// Error renders "servers.yaml:14:7: servers[2].bootMAC: msg".
func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Col > 0 {
			fmt.Fprintf(&b, ":%d", e.Col)
		}
	}
	b.WriteString(": ")
	if e.Severity == SeverityWarning {
		b.WriteString("warning: ")
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ValidationError is a rejected revision: every error and warning found,
// sorted by file, line, column, path and message.
type ValidationError struct {
	Errors   []FieldError
	Warnings []FieldError
}

func (v *ValidationError) Error() string {
	if len(v.Errors) == 0 {
		return "inventory: invalid"
	}
	s := v.Errors[0].Error()
	if n := len(v.Errors) - 1; n > 0 {
		s += fmt.Sprintf(" (and %d more)", n)
	}
	return "inventory: " + s
}

// Unwrap exposes each problem to errors.As.
func (v *ValidationError) Unwrap() []error {
	out := make([]error, len(v.Errors))
	for i := range v.Errors {
		out[i] = &v.Errors[i]
	}
	return out
}

// sortProblems orders problems by file, line, column, path and message,
// removing exact duplicates.
func sortProblems(p []FieldError) []FieldError {
	sort.SliceStable(p, func(i, j int) bool {
		a, b := p[i], p[j]
		if a.File != b.File {
			return fileRank(a.File) < fileRank(b.File)
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Col != b.Col {
			return a.Col < b.Col
		}
		if a.Path != b.Path {
			return a.Path < b.Path
		}
		return a.Msg < b.Msg
	})
	out := p[:0]
	for i, e := range p {
		if i > 0 && e == p[i-1] {
			continue
		}
		out = append(out, e)
	}
	return out
}

// fileRank keeps servers, profiles, images and networks in that order, then others by name.
func fileRank(f string) string {
	switch f {
	case ServersFile:
		return "0"
	case ProfilesFile:
		return "1"
	case ImagesFile:
		return "2"
	case NetworksFile:
		return "3"
	}
	return "4" + f
}
