package plan

import (
	"fmt"
	"strings"
)

// Text renders a plan for a terminal or a golden file: one line per step,
// then held steps and conditions. Deterministic.
func (r Result) Text() string {
	var b strings.Builder
	if len(r.Steps) == 0 && len(r.Held) == 0 && len(r.Firmware) == 0 {
		b.WriteString("no changes\n")
	}
	for _, s := range r.Steps {
		fmt.Fprintf(&b, "  %-14s %-16s %s\n", s.Action, s.Server, stepDetail(s))
	}
	if r.Brake != "" {
		fmt.Fprintf(&b, "HELD: %s\n", r.Brake)
		for _, s := range r.Held {
			fmt.Fprintf(&b, "  %-14s %-16s %s\n", s.Action, s.Server, stepDetail(s))
		}
	}
	for _, f := range r.Firmware {
		fmt.Fprintf(&b, "  %s\n", f)
	}
	for _, c := range r.Conditions {
		fmt.Fprintf(&b, "! %s %s (%s): %s\n", c.Subject, c.Type, c.Reason, c.Message)
	}
	for _, s := range r.Selections {
		fmt.Fprintf(&b, "profile %s selector %s matches %d: %s\n", s.Profile, s.Selector, len(s.Matches), orNone(strings.Join(s.Matches, ", ")))
		for _, x := range s.Rejected {
			fmt.Fprintf(&b, "  not %-16s %s\n", x.Server, x.Why)
		}
	}
	return b.String()
}

// Markdown renders a plan as a pull-request comment. Comments over maxBytes
// (GitHub allows 65,536 characters) are split into several, each under the
// limit; zero means 60,000.
func (r Result) Markdown(maxBytes int) []string {
	if maxBytes <= 0 {
		maxBytes = 60000
	}
	var parts []string
	header := "### Machina plan\n\n"
	var cur strings.Builder
	flush := func() {
		if cur.Len() > 0 {
			parts = append(parts, cur.String())
			cur.Reset()
		}
	}
	write := func(line string) {
		if cur.Len()+len(line) > maxBytes {
			flush()
		}
		if cur.Len() == 0 {
			cur.WriteString(header)
			if len(parts) > 0 {
				cur.WriteString(fmt.Sprintf("_(continued, part %d)_\n\n", len(parts)+1))
			}
			cur.WriteString("| action | server | detail |\n|---|---|---|\n")
		}
		cur.WriteString(line)
	}
	if len(r.Steps) == 0 && len(r.Held) == 0 && len(r.Firmware) == 0 {
		write("| - | - | no changes |\n")
	}
	for _, s := range r.Steps {
		write(fmt.Sprintf("| %s | `%s` | %s |\n", s.Action, s.Server, mdEscape(stepDetail(s))))
	}
	for _, s := range r.Held {
		write(fmt.Sprintf("| **held** %s | `%s` | %s |\n", s.Action, s.Server, mdEscape(stepDetail(s))))
	}
	for _, f := range r.Firmware {
		held := ""
		if f.Held {
			held = "**held** "
		}
		write(fmt.Sprintf("| %s%s | `%s` | %s |\n", held, f.Kind, f.Server, mdEscape(strings.TrimPrefix(f.String(), f.Kind+" "+f.Server+" "))))
	}
	for _, c := range r.Conditions {
		write(fmt.Sprintf("| %s | %s | %s: %s |\n", c.Type, c.Subject, c.Reason, mdEscape(c.Message)))
	}
	for _, s := range r.Selections {
		write(fmt.Sprintf("| selector | profile/%s | %s matches %s |\n", s.Profile, mdEscape(s.Selector), mdEscape(orNone(strings.Join(s.Matches, ", ")))))
		for _, x := range s.Rejected {
			write(fmt.Sprintf("| not selected | `%s` | profile %s: %s |\n", x.Server, s.Profile, mdEscape(x.Why)))
		}
	}
	if r.Brake != "" {
		write(fmt.Sprintf("\n> **Safety brake:** %s\n", mdEscape(r.Brake)))
	}
	flush()
	return parts
}

func stepDetail(s Step) string {
	d := s.Why
	if s.Profile != "" && !strings.Contains(s.Why, s.Profile) {
		d = s.Profile + ": " + s.Why
	}
	if len(s.Addresses) > 0 {
		as := make([]string, len(s.Addresses))
		for i, a := range s.Addresses {
			as[i] = a.String()
		}
		d += "; addresses " + strings.Join(as, ", ")
	}
	return d
}

// mdEscape is MarkdownText: a plan comment quotes machine text too (a
// wipe's failure reason in WipeFailed), escaped like status/README.md.
func mdEscape(s string) string { return MarkdownText(s) }

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
