package plan

import "strings"

var mdReplacer = strings.NewReplacer("|", `\|`, "\n", " ", "\r", " ", "\t", " ", "<", "&lt;", ">", "&gt;", "&", "&amp;", "`", "'",
	`\`, `\\`, "*", `\*`, "[", `\[`, "]", `\]`, "~", `\~`)

// MarkdownText makes s safe inside a Markdown table cell or a paragraph
// (status/README.md, plan comments): one line; pipes, emphasis (* _ ~), link brackets and
// backslashes escaped; HTML (< > &) as entities; backticks made quotes;
// other control characters and the bidi overrides replaced by U+FFFD. A
// machine's text (a failed test's reason) then reads as the text it is,
// never as a link, an image, emphasis or markup.
func MarkdownText(s string) string {
	if s == "" {
		return ""
	}
	return mdUnderscores(mdReplacer.Replace(strings.Map(func(r rune) rune {
		switch {
		case r == '\t' || r == '\n' || r == '\r':
			return r // the replacer makes them spaces
		case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			return '\uFFFD'
		}
		return r
	}, s)))
}

// mdUnderscores escapes the underscores that could open or close emphasis:
// those not between two letters or digits (GFM never emphasises inside a
// word, so powered_off stays as it is).
func mdUnderscores(s string) string {
	if !strings.Contains(s, "_") {
		return s
	}
	alnum := func(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '_' && (i == 0 || i == len(s)-1 || !alnum(s[i-1]) || !alnum(s[i+1])) {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
