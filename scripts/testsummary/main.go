// Command testsummary runs `go test -json ARGS...` and prints what a human
// reads from plain `go test` (one ok/FAIL line per package, the full output
// of every failed test, one line per skipped test with its reason) followed
// by, for each failed test, its own messages again (its t.Log, t.Error
// and t.Fatal lines, not the logs of the code it ran: on a long failure
// those are what the tail of a CI log shows), and one summary line
// computed from the JSON events:
//
//	make test: 61 packages (0 failed), tests passed 1650, failed 0, skipped 0 (subtests included), 612s
//
// It exits non-zero when go test fails, when a package fails to build, or
// when any test skipped (unless -allow-skip: the quick mode). -json FILE
// keeps the raw event stream; -summary FILE also writes the summary line
// there (make test prints it again at the very end).
//
// Usage: go run ./scripts/testsummary [-allow-skip] [-json FILE] [-summary FILE] -- GO-TEST-ARGS...
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json): Action is start,
// run, pause, cont, pass, bench, fail, output, skip, or (Go 1.24+)
// build-output and build-fail.
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	ImportPath  string
	FailedBuild string
}

// counts is the outcome of one run.
type counts struct {
	packages, pkgFailed     int
	passed, failed, skipped int
	skips, fails            []string
	// messages holds, by failed test (as in fails), the last
	// maxMessages of its own messages (testMessages).
	messages map[string][]string
}

// maxMessages bounds how many of a failed test's own message lines are
// printed again at the end.
const maxMessages = 40

func main() {
	allowSkip := flag.Bool("allow-skip", false, "do not fail on skipped tests (the quick mode)")
	jsonOut := flag.String("json", "", "also write the raw go test -json stream to this file")
	summaryOut := flag.String("summary", "", "also write the summary line to this file")
	label := flag.String("label", "make test", "prefix of the summary line")
	flag.Parse()
	start := time.Now()
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	cmd := exec.Command(goBin, append([]string{"test", "-json"}, flag.Args()...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fatal(err)
	}
	if err := cmd.Start(); err != nil {
		fatal(err)
	}
	var in io.Reader = stdout
	if *jsonOut != "" {
		f, err := os.Create(*jsonOut)
		if err != nil {
			fatal(err)
		}
		defer f.Close()
		in = io.TeeReader(stdout, f)
	}
	c := report(in, os.Stdout)
	waitErr := cmd.Wait()
	line := fmt.Sprintf("%s: %d packages (%d failed), tests passed %d, failed %d, skipped %d (subtests included), %s",
		*label, c.packages, c.pkgFailed, c.passed, c.failed, c.skipped, time.Since(start).Round(time.Second))
	fmt.Println()
	for _, s := range c.skips {
		fmt.Println("skipped:", s)
	}
	for _, s := range c.fails {
		fmt.Println("failed:", s)
		for _, l := range c.messages[s] {
			fmt.Print("  ", l)
		}
	}
	fmt.Println(line)
	if *summaryOut != "" {
		if err := os.WriteFile(*summaryOut, []byte(line+"\n"), 0o644); err != nil {
			fatal(err)
		}
	}
	var ee *exec.ExitError
	switch {
	case waitErr != nil && !errors.As(waitErr, &ee):
		fatal(waitErr)
	case waitErr != nil:
		os.Exit(1)
	case c.failed > 0 || c.pkgFailed > 0:
		os.Exit(1)
	case c.skipped > 0 && !*allowSkip:
		fmt.Printf("%s: %d tests skipped; a full run skips none (a missing peer must fail: install it with scripts/deps.sh)\n", *label, c.skipped)
		os.Exit(1)
	}
}

// report reads events from r, writes the human-readable output to w and
// returns the counts.
func report(r io.Reader, w io.Writer) counts {
	c := counts{messages: map[string][]string{}}
	out := map[string][]string{} // package + "\x00" + test → its output lines
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// Not an event (go test prints some errors as text): pass it on.
			fmt.Fprintln(w, sc.Text())
			continue
		}
		key := e.Package + "\x00" + e.Test
		switch e.Action {
		case "build-output":
			fmt.Fprint(w, e.Output)
		case "output":
			if e.Test == "" {
				// Package-level lines: "ok  pkg 1.2s", "FAIL pkg", "--- FAIL" of TestMain, panics.
				if !strings.HasPrefix(e.Output, "=== ") && e.Output != "PASS\n" {
					fmt.Fprint(w, e.Output)
				}
				continue
			}
			out[key] = append(out[key], e.Output)
		case "pass", "fail", "skip":
			if e.Test == "" {
				c.packages++
				if e.Action == "fail" {
					c.pkgFailed++
				}
				continue
			}
			switch e.Action {
			case "pass":
				c.passed++
			case "fail":
				c.failed++
				c.fails = append(c.fails, e.Package+" "+e.Test)
				c.messages[e.Package+" "+e.Test] = testMessages(out[key], maxMessages)
				for _, l := range out[key] {
					fmt.Fprint(w, l)
				}
			case "skip":
				c.skipped++
				c.skips = append(c.skips, e.Package+" "+e.Test+": "+skipReason(out[key]))
			}
			delete(out, key)
		}
	}
	sort.Strings(c.skips)
	return c
}

// testMessages returns the last max of a test's own message lines among
// its output lines: those testing prints for t.Log, t.Error and t.Fatal
// ("    file_test.go:12: text", indented by subtest depth) and the
// continuation lines of a multi-line message (indented deeper). Lines the
// code under test logged (slog's "time=... level=..." written to the
// test's output, with or without a file prefix) are left out.
func testMessages(lines []string, max int) []string {
	var msgs []string
	inMsg := false
	for _, l := range lines {
		trim := strings.TrimLeft(l, " ")
		indent := len(l) - len(trim)
		file, rest, found := strings.Cut(trim, ": ")
		switch {
		case indent >= 4 && found && isFileLine(file) && !strings.HasPrefix(rest, "time="):
			msgs, inMsg = append(msgs, l), true
		case inMsg && indent >= 8 && !strings.HasPrefix(trim, "time="):
			msgs = append(msgs, l)
		default:
			inMsg = false
		}
	}
	if len(msgs) > max {
		msgs = msgs[len(msgs)-max:]
	}
	return msgs
}

// isFileLine reports whether s is testing's "name.go:LINE" prefix.
func isFileLine(s string) bool {
	name, line, ok := strings.Cut(s, ".go:")
	if !ok || name == "" || line == "" || strings.ContainsAny(name, " =") {
		return false
	}
	for _, r := range line {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// skipReason is the t.Skip message among a skipped test's output lines.
func skipReason(lines []string) string {
	var msg []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		msg = append(msg, l)
	}
	if len(msg) == 0 {
		return "(no reason given)"
	}
	return strings.Join(msg, " ")
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "testsummary:", err)
	os.Exit(2)
}
