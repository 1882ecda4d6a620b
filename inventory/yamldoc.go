package inventory

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	yamlv3 "gopkg.in/yaml.v3"
)

// position is a 1-based line and column.
type position struct{ line, col int }

// doc is one parsed inventory file with the position of every value (by RFC
// 6901 JSON pointer) and of every mapping key (by the pointer of its value).
type doc struct {
	file   string
	data   []byte
	root   *yamlv3.Node
	pos    map[string]position
	keyPos map[string]position
}

// at returns the position of pointer, or of its nearest ancestor that has one.
func (d *doc) at(pointer string) position {
	for {
		if p, ok := d.pos[pointer]; ok {
			return p
		}
		i := strings.LastIndexByte(pointer, '/')
		if i < 0 {
			return position{1, 1}
		}
		pointer = pointer[:i]
	}
}

// keyAt returns the position of the key whose value is at pointer, falling
// back to the value's position.
func (d *doc) keyAt(pointer string) position {
	if p, ok := d.keyPos[pointer]; ok {
		return p
	}
	return d.at(pointer)
}

func (d *doc) errAt(p position, pointer, msg string) FieldError {
	return FieldError{File: d.file, Line: p.line, Col: p.col, Path: pathOf(pointer), Msg: msg, Severity: SeverityError}
}

var lineRE = regexp.MustCompile(`^yaml: line (\d+): `)

// parseYAML runs the checks that need the raw bytes or the YAML node tree:
// size, UTF-8, empty file, tabs in indentation, syntax, several documents, a
// JSON document, alias expansion and duplicate keys. It returns the document
// when none of them failed.
func parseYAML(file string, data []byte, lim Limits) (*doc, []FieldError) {
	fail := func(line, col int, msg string) []FieldError {
		return []FieldError{{File: file, Line: line, Col: col, Msg: msg, Severity: SeverityError}}
	}
	if int64(len(data)) > lim.MaxFileBytes {
		return nil, fail(0, 0, fmt.Sprintf("file is %d bytes, over the limit of %d bytes; split the inventory or raise --max-file-size", len(data), lim.MaxFileBytes))
	}
	if !utf8.Valid(data) {
		off := invalidUTF8Offset(data)
		line, col := lineCol(data, off)
		return nil, fail(line, col, fmt.Sprintf("invalid UTF-8 at byte offset %d; save the file as UTF-8", off))
	}
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	if isBlank(data) {
		return nil, fail(1, 1, "file is empty; it must hold a mapping with a top-level key")
	}
	if errs := tabIndents(file, data); len(errs) > 0 {
		return nil, errs
	}
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	var top yamlv3.Node
	if err := dec.Decode(&top); err != nil {
		return nil, syntaxError(file, err)
	}
	var second yamlv3.Node
	switch err := dec.Decode(&second); {
	case err == nil:
		return nil, fail(second.Line, second.Column, "file holds several YAML documents; keep exactly one document per file")
	case errors.Is(err, io.EOF):
	default:
		return nil, syntaxError(file, err)
	}
	if top.Kind != yamlv3.DocumentNode || len(top.Content) != 1 {
		return nil, fail(1, 1, "file holds no YAML document")
	}
	root := top.Content[0]
	if root.Kind != yamlv3.MappingNode {
		return nil, fail(root.Line, root.Column, "the document must be a mapping with a top-level key, not a "+kindName(root))
	}
	if root.Style&yamlv3.FlowStyle != 0 {
		return nil, fail(root.Line, root.Column, "file holds a JSON (flow-style) document; write the inventory in YAML block style so reviews show one field per line")
	}
	nodes, expanded := countNodes(root)
	if budget := max(lim.MinAliasBudget, nodes); expanded-nodes > budget {
		return nil, fail(root.Line, root.Column, fmt.Sprintf("YAML aliases expand the document to over %d nodes (from %d written); refusing a possible alias bomb", nodes+budget, nodes))
	}
	d := &doc{file: file, data: data, root: root, pos: map[string]position{}, keyPos: map[string]position{}}
	var errs []FieldError
	d.walk(root, "", &errs)
	return d, errs
}

// walk records positions and reports duplicate keys. Aliases are not
// followed: their targets were walked where the anchor is.
func (d *doc) walk(n *yamlv3.Node, pointer string, errs *[]FieldError) {
	d.pos[pointer] = position{n.Line, n.Column}
	switch n.Kind {
	case yamlv3.MappingNode:
		seen := map[string]*yamlv3.Node{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yamlv3.ScalarNode {
				*errs = append(*errs, d.errAt(position{k.Line, k.Column}, pointer, "mapping keys must be plain strings"))
				continue
			}
			if k.Value == "<<" && k.Tag == "!!merge" {
				continue
			}
			if first, dup := seen[k.Value]; dup {
				*errs = append(*errs, d.errAt(position{k.Line, k.Column}, pointer+"/"+escapePointer(k.Value),
					fmt.Sprintf("duplicate key %q (first at line %d); YAML parsers keep only one of them", k.Value, first.Line)))
				continue
			}
			seen[k.Value] = k
			child := pointer + "/" + escapePointer(k.Value)
			d.keyPos[child] = position{k.Line, k.Column}
			d.walk(v, child, errs)
		}
	case yamlv3.SequenceNode:
		for i, c := range n.Content {
			d.walk(c, pointer+"/"+strconv.Itoa(i), errs)
		}
	}
}

// countNodes returns the nodes written in the tree and the nodes it has once
// every alias is expanded, memoised per anchor so a bomb is measured in time
// linear in its text.
func countNodes(root *yamlv3.Node) (written, expanded int) {
	memo := map[*yamlv3.Node]int{}
	var size func(n *yamlv3.Node, depth int) int
	size = func(n *yamlv3.Node, depth int) int {
		if depth > 10000 {
			return 1 << 40
		}
		if n.Kind == yamlv3.AliasNode {
			if n.Alias == nil {
				return 1
			}
			if s, ok := memo[n.Alias]; ok {
				return s
			}
			s := size(n.Alias, depth+1)
			memo[n.Alias] = s
			return s
		}
		s := 1
		for _, c := range n.Content {
			s += size(c, depth+1)
			if s > 1<<40 {
				return s
			}
		}
		return s
	}
	var count func(n *yamlv3.Node) int
	count = func(n *yamlv3.Node) int {
		s := 1
		for _, c := range n.Content {
			if c.Kind != yamlv3.AliasNode {
				s += count(c)
			} else {
				s++
			}
		}
		return s
	}
	return count(root), size(root, 0)
}

func syntaxError(file string, err error) []FieldError {
	msg := err.Error()
	line := 0
	if m := lineRE.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	return []FieldError{{File: file, Line: line, Msg: "YAML syntax: " + msg, Severity: SeverityError}}
}

// tabIndents reports lines whose indentation contains a tab: YAML forbids
// tabs there, and editors show them as spaces, so the parser's own message
// ("found character that cannot start any token") confuses people.
func tabIndents(file string, data []byte) []FieldError {
	var errs []FieldError
	for i, line := range bytes.Split(data, []byte("\n")) {
		for col, c := range line {
			if c == ' ' {
				continue
			}
			if c == '\t' && len(bytes.TrimSpace(line)) > 0 {
				errs = append(errs, FieldError{File: file, Line: i + 1, Col: col + 1, Msg: "tab in indentation; YAML allows only spaces there", Severity: SeverityError})
			}
			break
		}
		if len(errs) >= 10 {
			break
		}
	}
	return errs
}

func isBlank(data []byte) bool {
	for _, line := range bytes.Split(data, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if len(t) == 0 || t[0] == '#' || string(t) == "---" || string(t) == "..." {
			continue
		}
		return false
	}
	return true
}

func invalidUTF8Offset(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}

func lineCol(b []byte, off int) (int, int) {
	line := 1 + bytes.Count(b[:off], []byte("\n"))
	col := off - bytes.LastIndexByte(b[:off], '\n')
	return line, col
}

func kindName(n *yamlv3.Node) string {
	switch n.Kind {
	case yamlv3.SequenceNode:
		return "list"
	case yamlv3.ScalarNode:
		return "scalar"
	case yamlv3.AliasNode:
		return "alias"
	}
	return "node"
}

// escapePointer escapes a key for a JSON pointer (RFC 6901 §3).
func escapePointer(s string) string {
	if !strings.ContainsAny(s, "~/") {
		return s
	}
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// pathOf turns "/servers/2/bootMAC" into "servers[2].bootMAC".
func pathOf(pointer string) string {
	if pointer == "" {
		return ""
	}
	var b strings.Builder
	for _, seg := range strings.Split(pointer[1:], "/") {
		seg = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
		if _, err := strconv.Atoi(seg); err == nil {
			b.WriteString("[" + seg + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(seg)
	}
	return b.String()
}
