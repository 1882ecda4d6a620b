// Package agenttest holds test helpers for the ramdisk agent: a writer for
// recorded sysfs/procfs trees and a reference controller that implements the
// machine-facing endpoints of api/v1 (report, plan, image, done, payload) in
// memory. The production server lives in package api; this one exists so the
// agent and the qemu test have a real HTTP peer without importing it.
package agenttest

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// WriteTree materialises a recorded machine tree into dir. The archive is
// text: lines before the first header are comments; "-- path --" starts a
// file whose content is the following lines; "-- path (hex) --" a file whose
// content is the following hex digits (whitespace ignored); "-- path ->
// target --" a symlink. Paths are relative and may not contain "..".
func WriteTree(dir string, archive []byte) error {
	type entry struct {
		path, target string
		hex          bool
		body         bytes.Buffer
	}
	var ents []*entry
	var cur *entry
	sc := bufio.NewScanner(bytes.NewReader(archive))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "-- ") && strings.HasSuffix(line, " --") {
			h := strings.TrimSuffix(strings.TrimPrefix(line, "-- "), " --")
			cur = &entry{}
			if p, t, ok := strings.Cut(h, " -> "); ok {
				cur.path, cur.target = p, t
			} else if p, ok := strings.CutSuffix(h, " (hex)"); ok {
				cur.path, cur.hex = p, true
			} else {
				cur.path = h
			}
			if filepath.IsAbs(cur.path) || strings.Contains(cur.path, "..") {
				return fmt.Errorf("write tree: bad path %q", cur.path)
			}
			ents = append(ents, cur)
			continue
		}
		if cur == nil {
			continue
		}
		cur.body.WriteString(line)
		cur.body.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("write tree: %w", err)
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("write tree: %w", err)
		}
		switch {
		case e.target != "":
			if err := os.Symlink(e.target, p); err != nil {
				return fmt.Errorf("write tree: %w", err)
			}
		case e.hex:
			b, err := hex.DecodeString(strings.Join(strings.Fields(e.body.String()), ""))
			if err != nil {
				return fmt.Errorf("write tree %s: %w", e.path, err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				return fmt.Errorf("write tree: %w", err)
			}
		default:
			if err := os.WriteFile(p, e.body.Bytes(), 0o644); err != nil {
				return fmt.Errorf("write tree: %w", err)
			}
		}
	}
	return nil
}
