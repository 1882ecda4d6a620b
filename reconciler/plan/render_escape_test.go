package plan

import (
	"strings"
	"testing"
)

// TestPlanMarkdownNeutralisesMachineText: a plan comment (machinactl plan
// --format markdown, posted on pull requests) quoting a machine's text (a
// wipe's failure reason in WipeFailed) escapes it like status/README.md:
// no emphasis, link, image, HTML or control character survives. Before,
// only pipes, newlines and angle brackets were escaped, so
// [click](javascript:...) rendered as a link and **x** as bold.
func TestPlanMarkdownNeutralisesMachineText(t *testing.T) {
	evil := "**bold** [click](javascript:alert(1)) ![i](http://x/i.png) <script>x</script> `c` _em_ \x1b[2J\u202e|"
	r := Result{Conditions: []Condition{{Subject: "server/r1-n01", Type: "WipeFailed", Reason: "ReleaseWipeFailed",
		Message: "release wipe failed 1 times (last: " + evil + ")"}}}
	md := strings.Join(r.Markdown(0), "")
	for _, bad := range []string{"**bold**", "[click](", "![i](", "<script>", "`c`", " _em_", "\x1b", "\u202e"} {
		if strings.Contains(md, bad) {
			t.Errorf("plan markdown keeps %q:\n%s", bad, md)
		}
	}
	if !strings.Contains(md, `\*\*bold\*\* \[click\](javascript:alert(1)) !\[i\](http://x/i.png) &lt;script&gt;x&lt;/script&gt; 'c' \_em\_ `+"\uFFFD\\[2J\uFFFD"+`\|`) {
		t.Errorf("plan markdown does not show the escaped text:\n%s", md)
	}
}
