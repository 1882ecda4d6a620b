package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Reference renders the inventory files' reference page (docs/reference/
// inventory.md) from the embedded schemas: per file its title and
// description, then every field reachable from the root as a dotted path
// (`servers[].bmc.driver`) with its type, whether it is required, its
// default, its allowed values and the schema's description, in the order the
// schema declares them. `$ref`s into `$defs` are followed (a definition
// already on the path is named, not expanded again). The page is generated:
// edit the schemas, then `make docs`; `go test ./schema` fails when the page
// is stale. Errors are a broken embedded schema (a build defect).
func Reference() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("# Inventory reference\n\n")
	b.WriteString("Generated from the JSON Schemas in `schema/` (`make docs`); `go test ./schema` fails when this\n")
	b.WriteString("page is stale. Do not edit by hand. Cross-file rules (references between files, uniqueness,\n")
	b.WriteString("capacity) are not in the schemas: `machinactl validate` checks them too; see docs/inventory.md.\n")
	for _, k := range Kinds {
		data, err := files.ReadFile(k.FileName())
		if err != nil {
			return nil, fmt.Errorf("schema reference: %w", err)
		}
		root, err := decodeOrdered(data)
		if err != nil {
			return nil, fmt.Errorf("schema reference: %s: %w", k.FileName(), err)
		}
		r := refWriter{w: &b, defs: root.obj("$defs")}
		fmt.Fprintf(&b, "\n## %s.yaml\n\n", k)
		if d := root.str("description"); d != "" {
			fmt.Fprintf(&b, "%s\n\n", d)
		}
		fmt.Fprintf(&b, "Schema: `schema/%s` (`$id` %s).\n\n", k.FileName(), root.str("$id"))
		b.WriteString("| field | type | required | default | description |\n|---|---|---|---|---|\n")
		r.fields("", root, nil)
	}
	return b.Bytes(), nil
}

// refWriter writes the rows of one schema file.
type refWriter struct {
	w    io.Writer
	defs *node
}

// fields writes a row per property of n (an object schema), then recurses
// into object and array properties. seen holds the $defs on the path.
func (r refWriter) fields(prefix string, n *node, seen []string) {
	props := n.obj("properties")
	if props == nil {
		return
	}
	req := map[string]bool{}
	for _, v := range n.arr("required") {
		if s, ok := v.val.(string); ok {
			req[s] = true
		}
	}
	for _, key := range props.keys {
		p, path := props.m[key], prefix+key
		target, defName := r.resolve(p)
		typ := r.typeOf(p, target, defName)
		yes := ""
		if req[key] {
			yes = "yes"
		}
		fmt.Fprintf(r.w, "| `%s` | %s | %s | %s | %s |\n", path, typ, yes, defaultOf(p, target), describe(p, target))
		r.descend(path, target, defName, seen)
	}
}

// descend writes the fields of an object property, or of an array's items.
func (r refWriter) descend(path string, target *node, defName string, seen []string) {
	if defName != "" {
		for _, s := range seen {
			if s == defName {
				return
			}
		}
		seen = append(append([]string(nil), seen...), defName)
	}
	if target.obj("properties") != nil {
		r.fields(path+".", target, seen)
		return
	}
	if items := target.obj("items"); items != nil {
		it, itDef := r.resolve(items)
		if it.obj("properties") != nil {
			r.descend(path+"[]", it, itDef, seen)
		}
	}
	for _, alt := range append(target.arr("oneOf"), target.arr("anyOf")...) {
		if alt.m == nil {
			continue
		}
		a, aDef := r.resolve(alt)
		if a.obj("properties") != nil {
			r.descend(path, a, aDef, seen)
		}
	}
}

// resolve follows a local $ref ("#/$defs/NAME"), returning the target and
// NAME ("" when n has no $ref).
func (r refWriter) resolve(n *node) (*node, string) {
	ref := n.str("$ref")
	name, ok := strings.CutPrefix(ref, "#/$defs/")
	if !ok || r.defs == nil || r.defs.m[name] == nil {
		return n, ""
	}
	return r.defs.m[name], name
}

// typeOf names the JSON type of a property: "object", "string", "list of
// server", "label (string)".
func (r refWriter) typeOf(p, target *node, defName string) string {
	t := target.str("type")
	if t == "" {
		for _, v := range target.arr("type") {
			if s, ok := v.val.(string); ok {
				t += "|" + s
			}
		}
		t = strings.TrimPrefix(t, "|")
	}
	if t == "array" {
		if items := target.obj("items"); items != nil {
			it, itDef := r.resolve(items)
			return "list of " + r.typeOf(items, it, itDef)
		}
	}
	if t == "" && (target.arr("enum") != nil || target.m["const"] != nil) {
		t = "enum"
	}
	if t == "" && (target.arr("oneOf") != nil || target.arr("anyOf") != nil) {
		t = "one of several shapes"
	}
	if defName != "" {
		if t == "" {
			return "`" + defName + "`"
		}
		return "`" + defName + "` (" + t + ")"
	}
	return t
}

// defaultOf renders the property's default, from the property or its target.
func defaultOf(p, target *node) string {
	for _, n := range []*node{p, target} {
		if d, ok := n.m["default"]; ok {
			b, _ := json.Marshal(d.plain())
			return "`" + string(b) + "`"
		}
	}
	return ""
}

// describe joins the descriptions of the property and its target, and the
// allowed values when the schema lists them.
func describe(p, target *node) string {
	parts := []string{}
	for _, n := range []*node{p, target} {
		if d := n.str("description"); d != "" && (len(parts) == 0 || parts[0] != d) {
			parts = append(parts, d)
		}
	}
	if enum := target.arr("enum"); enum != nil {
		vals := make([]string, 0, len(enum))
		for _, v := range enum {
			b, _ := json.Marshal(v.plain())
			vals = append(vals, "`"+string(b)+"`")
		}
		parts = append(parts, "One of "+strings.Join(vals, ", ")+".")
	}
	if ex := target.arr("examples"); ex != nil {
		b, _ := json.Marshal(ex[0].plain())
		parts = append(parts, "Example: `"+string(b)+"`.")
	}
	s := strings.Join(parts, " ")
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

// node is a JSON value that keeps its object keys in document order.
type node struct {
	keys []string
	m    map[string]*node
	list []*node
	val  any // string, float64, bool or nil for scalars
	isA  bool
}

func (n *node) obj(key string) *node {
	if n == nil || n.m == nil {
		return nil
	}
	if c := n.m[key]; c != nil && c.m != nil {
		return c
	}
	return nil
}

func (n *node) arr(key string) []*node {
	if n == nil || n.m == nil || n.m[key] == nil || !n.m[key].isA {
		return nil
	}
	return n.m[key].list
}

func (n *node) str(key string) string {
	if n == nil || n.m == nil || n.m[key] == nil {
		return ""
	}
	s, _ := n.m[key].val.(string)
	return s
}

// plain converts back to Go values (maps with sorted keys when marshalled).
func (n *node) plain() any {
	switch {
	case n.m != nil:
		out := make(map[string]any, len(n.m))
		for k, v := range n.m {
			out[k] = v.plain()
		}
		return out
	case n.isA:
		out := make([]any, len(n.list))
		for i, v := range n.list {
			out[i] = v.plain()
		}
		return out
	}
	return n.val
}

// decodeOrdered parses JSON keeping object key order.
func decodeOrdered(data []byte) (*node, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	n, err := decodeNode(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("data after the top-level value")
	}
	return n, nil
}

func decodeNode(dec *json.Decoder) (*node, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			n := &node{m: map[string]*node{}}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := decodeNode(dec)
				if err != nil {
					return nil, err
				}
				if _, dup := n.m[k]; !dup {
					n.keys = append(n.keys, k)
				}
				n.m[k] = v
			}
			_, err := dec.Token()
			return n, err
		case '[':
			n := &node{isA: true}
			for dec.More() {
				v, err := decodeNode(dec)
				if err != nil {
					return nil, err
				}
				n.list = append(n.list, v)
			}
			_, err := dec.Token()
			return n, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return &node{val: t}, nil
	}
}
