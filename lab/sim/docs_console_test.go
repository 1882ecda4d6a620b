package sim_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/machina-metal/machina/internal/peertest"
)

// docCommand is one `$ ` line of a runnable console block, the output lines
// the page shows under it, and the exit status the page shows for it
// (a following `$ echo $?`), 0 when it shows none.
type docCommand struct {
	file string
	line int
	cmd  string
	out  []string
	exit int
}

// runnableBlocks returns the commands of every fenced block opened with
// "```console runnable" in the README and docs/*.md: the blocks a reader
// can paste into the `make demo` banner's shell, in the lab's working
// clone, with the banner's MACHINA_API and MACHINA_TOKEN.
func runnableBlocks(t *testing.T, root string) []docCommand {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	var cmds []docCommand
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		in := false
		for i, line := range strings.Split(string(data), "\n") {
			switch {
			case !in && strings.TrimSpace(line) == "```console runnable":
				in = true
			case in && strings.HasPrefix(line, "```"):
				in = false
			case in && line == "$ echo $?":
				// the next line is the previous command's status
				cmds = append(cmds, docCommand{file: rel, line: i + 1, cmd: "echo $?"})
			case in && strings.HasPrefix(line, "$ "):
				cmds = append(cmds, docCommand{file: rel, line: i + 1, cmd: strings.TrimPrefix(line, "$ ")})
			case in && len(cmds) > 0:
				c := &cmds[len(cmds)-1]
				if c.cmd == "echo $?" {
					n, err := strconv.Atoi(strings.TrimSpace(line))
					if err != nil || len(cmds) < 2 {
						t.Fatalf("%s:%d: `$ echo $?` must follow a command and show a number, got %q", rel, i+1, line)
					}
					cmds[len(cmds)-2].exit = n
					cmds = cmds[:len(cmds)-1]
					continue
				}
				if strings.TrimSpace(line) != "" {
					c.out = append(c.out, line)
				}
			}
		}
	}
	return cmds
}

var (
	docHexRe    = regexp.MustCompile(`[0-9a-f]{7,64}`)
	docServerRe = regexp.MustCompile(`r[0-9]+-n[0-9]+`)
)

// docLinePattern turns a line the page shows into a pattern for the line
// the command prints: commit and digest hex (7 or more digits) matches
// any, runs of spaces match any run of spaces, and "…" matches anything;
// the rest (counts, words) must be as shown. Server names (r1-n04) match any
// server name: which servers a run allocates depends on the order machines
// finish commissioning.
func docLinePattern(shown string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString(`^\s*`)
	for i, part := range strings.Split(strings.TrimSpace(shown), "…") {
		if i > 0 {
			b.WriteString(`.*`)
		}
		for j, word := range strings.Fields(part) {
			if j > 0 {
				b.WriteString(`\s+`)
			}
			q := regexp.QuoteMeta(word)
			q = docHexRe.ReplaceAllString(q, `[0-9a-f]+`)
			q = docServerRe.ReplaceAllString(q, `r[0-9]+-n[0-9]+`)
			b.WriteString(q)
		}
		if strings.HasSuffix(part, " ") {
			b.WriteString(`\s+`)
		}
	}
	b.WriteString(`\s*$`)
	return regexp.MustCompile(b.String())
}

// TestRunnableDocBlocks runs every command of the docs' runnable console
// blocks against the simulated lab with a real controller, as a reader of
// the page would after `make demo`: in the lab's working clone, with the
// built machinactl first on PATH and an admin token. Each command must exit
// with the status the page shows (0 unless a `$ echo $?` says otherwise) and
// print every output line the page shows (hashes may differ, and "…" stands
// for anything).
func TestRunnableDocBlocks(t *testing.T) {
	root := filepath.Join("..", "..")
	cmds := runnableBlocks(t, root)
	if len(cmds) < 3 {
		t.Fatalf("found %d commands in runnable console blocks of README.md and docs/*.md; want the plan walk-through at least", len(cmds))
	}
	bin := t.TempDir()
	goBin := peertest.Command(t, "go")
	build := exec.Command(goBin, "build", "-o", filepath.Join(bin, "machinactl"), "./cmd/machinactl")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build machinactl: %v\n%s", err, out)
	}
	r := startRig(t, rigOptions{})
	r.steady()
	tok, _, err := r.run.Store.CreateAdminToken("docs-console", "test")
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"MACHINA_API="+r.run.URL, "MACHINA_TOKEN="+tok,
		"GIT_AUTHOR_NAME=Docs Reader", "GIT_AUTHOR_EMAIL=reader@example.org",
		"GIT_COMMITTER_NAME=Docs Reader", "GIT_COMMITTER_EMAIL=reader@example.org")
	for _, c := range cmds {
		cmd := exec.Command("sh", "-c", c.cmd)
		cmd.Dir, cmd.Env = r.lab.Clone, env
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%s:%d: %s: %v", c.file, c.line, c.cmd, err)
		}
		if code != c.exit {
			t.Errorf("%s:%d: `%s` exited %d, the page shows %d; output:\n%s", c.file, c.line, c.cmd, code, c.exit, out)
			continue
		}
		got := strings.Split(string(out), "\n")
		for _, shown := range c.out {
			re := docLinePattern(shown)
			found := false
			for _, g := range got {
				if re.MatchString(g) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s:%d: `%s` did not print a line like %q; output:\n%s", c.file, c.line, c.cmd, shown, out)
			}
		}
	}
}

// TestDocLinePattern pins the loose match of shown and printed lines.
func TestDocLinePattern(t *testing.T) {
	for _, c := range []struct {
		shown, printed string
		want           bool
	}{
		{"  allocate       r1-n04           profile hypervisor count 3, 2 held", "  allocate  r1-n04  profile hypervisor count 3, 2 held", true},
		{"Plan for inventory 2be4aadd8c93 at ed099102eb29 merged … 2 steps.", "Plan for inventory 0123abcd4567 at 89abcdef0123 merged into x against 12 servers: 2 steps.", true},
		{"  allocate       r1-n04", "  allocate       r1-n05", true},
		{"count 3, 2 held", "count 3, 1 held", false},
		{"deploy r1-n04", "release r1-n04", false},
	} {
		if got := docLinePattern(c.shown).MatchString(c.printed); got != c.want {
			t.Errorf("docLinePattern(%q) on %q = %v, want %v", c.shown, c.printed, got, c.want)
		}
	}
}
