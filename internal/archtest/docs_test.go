package archtest

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/machina-metal/machina/internal/peertest"
)

// markdownFiles lists the repository's own Markdown files, relative to the
// module root: build output (out/), vendored npm modules, fixtures copied
// from elsewhere (testdata/) and .git are not ours to keep.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "out", "node_modules", "testdata", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// mdDoc is one Markdown file's headings (as GitHub anchors) and its links
// with their line numbers; fenced code blocks and inline code spans are left
// out of both.
type mdDoc struct {
	anchors map[string]bool
	links   []mdLink
}

type mdLink struct {
	line   int
	target string
}

var (
	mdLinkRe    = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	mdCodeRe    = regexp.MustCompile("`[^`]*`")
	mdHeadLink  = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	mdHTMLAnchr = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// githubAnchor is the fragment GitHub gives a heading: the text lower-cased,
// link targets and formatting dropped, every character that is not a
// letter, digit, space, hyphen or underscore removed, spaces made hyphens.
// Repeated headings get -1, -2, ... in order (the caller counts).
func githubAnchor(heading string) string {
	h := mdHeadLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

func parseMarkdown(data string) mdDoc {
	doc := mdDoc{anchors: map[string]bool{}}
	seen := map[string]int{}
	fence := ""
	for i, line := range strings.Split(data, "\n") {
		trim := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trim, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trim, "```") || strings.HasPrefix(trim, "~~~") {
			fence = trim[:3]
			continue
		}
		for _, m := range mdHTMLAnchr.FindAllStringSubmatch(line, -1) {
			doc.anchors[m[1]] = true
		}
		if strings.HasPrefix(line, "#") {
			text := strings.TrimSpace(strings.TrimLeft(line, "#"))
			a := githubAnchor(text)
			if n := seen[a]; n > 0 {
				doc.anchors[fmt.Sprintf("%s-%d", a, n)] = true
			} else {
				doc.anchors[a] = true
			}
			seen[a]++
		}
		for _, m := range mdLinkRe.FindAllStringSubmatch(mdCodeRe.ReplaceAllString(line, ""), -1) {
			doc.links = append(doc.links, mdLink{line: i + 1, target: m[1]})
		}
	}
	return doc
}

// TestMarkdownLinksResolve fails on a relative link in the repository's
// Markdown that names a missing file, or an anchor (#section) that no
// heading of the target page makes. Links to other sites are not fetched.
func TestMarkdownLinksResolve(t *testing.T) {
	root, err := ModuleRoot(peertest.Command(t, "go"))
	if err != nil {
		t.Fatal(err)
	}
	files := markdownFiles(t, root)
	if len(files) < 10 {
		t.Fatalf("found %d Markdown files under %s; want the README and docs/", len(files), root)
	}
	docs := map[string]mdDoc{}
	load := func(rel string) (mdDoc, bool) {
		if d, ok := docs[rel]; ok {
			return d, true
		}
		data, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return mdDoc{}, false
		}
		d := parseMarkdown(string(data))
		docs[rel] = d
		return d, true
	}
	checked := 0
	for _, f := range files {
		d, _ := load(f)
		for _, l := range d.links {
			tgt := l.target
			if strings.Contains(tgt, "://") || strings.HasPrefix(tgt, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(tgt, "#")
			rel := f
			if path != "" {
				rel = filepath.Clean(filepath.Join(filepath.Dir(f), path))
				if _, err := os.Stat(filepath.Join(root, rel)); err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", f, l.line, tgt, rel)
					continue
				}
			}
			checked++
			if frag == "" || !strings.HasSuffix(rel, ".md") {
				continue
			}
			td, _ := load(rel)
			if !td.anchors[frag] {
				t.Errorf("%s:%d: link %q: no heading in %s makes the anchor #%s", f, l.line, tgt, rel, frag)
			}
		}
	}
	if checked < 20 {
		t.Errorf("checked %d relative links; the README alone has more", checked)
	}
}

// TestGitHubAnchor pins the anchor rule on headings the docs use.
func TestGitHubAnchor(t *testing.T) {
	for in, want := range map[string]string{
		"Two commands (fresh Debian 12 with Go 1.26 and git installed)": "two-commands-fresh-debian-12-with-go-126-and-git-installed",
		"What a change will do: `machinactl plan`":                      "what-a-change-will-do-machinactl-plan",
		"Firmware in profiles":                                          "firmware-in-profiles",
		"See [the plan](plan-example.md)":                               "see-the-plan",
	} {
		if got := githubAnchor(in); got != want {
			t.Errorf("githubAnchor(%q) = %q, want %q", in, got, want)
		}
	}
	d := parseMarkdown("# A\n## A\n```\n# not a heading\n[x](nowhere.md)\n```\n[y](#a-1)\n")
	if !d.anchors["a"] || !d.anchors["a-1"] || d.anchors["not-a-heading"] || len(d.links) != 1 || d.links[0].target != "#a-1" {
		t.Errorf("parseMarkdown: %+v", d)
	}
}
