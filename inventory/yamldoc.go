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

// doc is one parsed inventory file with the position of every value and
// of every mapping key, looked up by RFC 6901 JSON pointer.
type doc struct {
	file string
	data []byte
	root *yamlv3.Node
	// tree mirrors the node tree's mappings and lists with positions only,
	// so it outlives the node tree (which is dropped after conversion) at a
	// fraction of its size, and a lookup walks the pointer's segments
	// instead of hashing a string per value of the file.
	tree pnode
}

// pnode is one value of a parsed file: where it is, where the key naming it
// is (zero for a list item or the root), and its children: a mapping's in
// document order with their keys (the first of duplicate keys only; merge
// keys and non-scalar keys are left out), a list's by index. An alias has
// no children: its target is indexed where the anchor is.
type pnode struct {
	pos, key position32
	name     string // the key naming this value in its mapping
	mapping  bool
	kids     []pnode
}

// position32 is a position stored in half the space.
type position32 struct{ line, col int32 }

func pos32(line, col int) position32 { return position32{int32(line), int32(col)} }

func (p position32) pos() position { return position{int(p.line), int(p.col)} }

// find returns the deepest indexed value along pointer and whether it is
// the value at pointer itself.
func (d *doc) find(pointer string) (*pnode, bool) {
	n := &d.tree
	for pointer != "" {
		pointer = pointer[1:]
		seg := pointer
		if i := strings.IndexByte(pointer, '/'); i >= 0 {
			seg, pointer = pointer[:i], pointer[i:]
		} else {
			pointer = ""
		}
		next := n.child(seg)
		if next == nil {
			return n, false
		}
		n = next
	}
	return n, true
}

// child returns the child named by the escaped pointer segment seg, or nil.
func (n *pnode) child(seg string) *pnode {
	if n.mapping {
		if strings.IndexByte(seg, '~') >= 0 {
			seg = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
		}
		for i := range n.kids {
			if n.kids[i].name == seg {
				return &n.kids[i]
			}
		}
		return nil
	}
	i, err := strconv.Atoi(seg)
	if err != nil || i < 0 || i >= len(n.kids) || strconv.Itoa(i) != seg {
		return nil
	}
	return &n.kids[i]
}

// at returns the position of pointer, or of its nearest ancestor that has one.
func (d *doc) at(pointer string) position {
	n, _ := d.find(pointer)
	return n.pos.pos()
}

// keyAt returns the position of the key whose value is at pointer, falling
// back to the value's position.
func (d *doc) keyAt(pointer string) position {
	n, exact := d.find(pointer)
	if exact && n.key.line != 0 {
		return n.key.pos()
	}
	return n.pos.pos()
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
	d := &doc{file: file, data: data, root: root}
	x := &indexer{d: d}
	x.index(root, &d.tree)
	return d, x.errs
}

// indexer builds a doc's position tree and reports duplicate keys.
type indexer struct {
	d    *doc
	errs []FieldError
	// path holds the segments down to the value being indexed (a key, or
	// an index when key is unset), so a pointer is built only for an error.
	path []segment
}

type segment struct {
	key   string
	index int
	isKey bool
}

func (x *indexer) pointer() string {
	var b strings.Builder
	for _, s := range x.path {
		b.WriteByte('/')
		if s.isKey {
			b.WriteString(escapePointer(s.key))
		} else {
			b.WriteString(strconv.Itoa(s.index))
		}
	}
	return b.String()
}

// index records the positions of n and its children into pn. Aliases are
// not followed: their targets were indexed where the anchor is.
func (x *indexer) index(n *yamlv3.Node, pn *pnode) {
	pn.pos = pos32(n.Line, n.Column)
	switch n.Kind {
	case yamlv3.MappingNode:
		pn.mapping = true
		pn.kids = make([]pnode, 0, len(n.Content)/2)
		// A mapping of the inventory has a few dozen keys at most: a
		// linear search of the keys so far beats a map until it grows.
		var seen map[string]int
		if len(n.Content) > 64 {
			seen = make(map[string]int, len(n.Content)/2)
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yamlv3.ScalarNode {
				x.errs = append(x.errs, x.d.errAt(position{k.Line, k.Column}, x.pointer(), "mapping keys must be plain strings"))
				continue
			}
			if k.Value == "<<" && k.Tag == "!!merge" {
				continue
			}
			first := -1
			if seen != nil {
				if j, ok := seen[k.Value]; ok {
					first = j
				}
			} else {
				for j := range pn.kids {
					if pn.kids[j].name == k.Value {
						first = j
						break
					}
				}
			}
			if first >= 0 {
				x.errs = append(x.errs, x.d.errAt(position{k.Line, k.Column}, x.pointer()+"/"+escapePointer(k.Value),
					fmt.Sprintf("duplicate key %q (first at line %d); YAML parsers keep only one of them", k.Value, pn.kids[first].key.line)))
				continue
			}
			if seen != nil {
				seen[k.Value] = len(pn.kids)
			}
			pn.kids = append(pn.kids, pnode{name: k.Value, key: pos32(k.Line, k.Column)})
			x.path = append(x.path, segment{key: k.Value, isKey: true})
			x.index(v, &pn.kids[len(pn.kids)-1])
			x.path = x.path[:len(x.path)-1]
		}
	case yamlv3.SequenceNode:
		pn.kids = make([]pnode, len(n.Content))
		for i, c := range n.Content {
			x.path = append(x.path, segment{index: i})
			x.index(c, &pn.kids[i])
			x.path = x.path[:len(x.path)-1]
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
