package inventory

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"

	yamlv3 "gopkg.in/yaml.v3"

	"github.com/machina-metal/machina/schema"
)

// YAML 1.1 (go.yaml.in/yaml/v2 under sigs.k8s.io/yaml, PyYAML, many CI
// tools) resolves plain scalars differently from YAML 1.2: `no` is false,
// `0123` is octal 83, `52:54:00:00:01:01` is a base-60 integer. The
// inventory must mean the same thing to every tool, so a plain scalar that
// YAML 1.1 would read as another type than the schema expects is an error
// that says how to write it. Regexps from the YAML 1.1 type repository
// (yaml.org/type/bool.html, int.html, float.html, null.html); the float
// rule takes a single dot as PyYAML and go-yaml do, so 10.0.0.1 stays a string.
var (
	yaml11Bool  = regexp.MustCompile(`^(y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$`)
	yaml11Null  = regexp.MustCompile(`^(~|null|Null|NULL)$`)
	yaml11Int   = regexp.MustCompile(`^([-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(:[0-5]?[0-9])+)$`)
	yaml11Float = regexp.MustCompile(`^([-+]?([0-9][0-9_]*)?\.[0-9_]*([eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN))$`)
	leadingZero = regexp.MustCompile(`^[-+]?0[0-9_]+$`)
)

// yaml11Type names the type YAML 1.1 gives an unquoted scalar, or "" for string.
func yaml11Type(v string) string {
	if v == "" {
		return ""
	}
	// Every pattern below starts with one of these bytes: most strings
	// (names, addresses) are answered without running a regexp.
	if strings.IndexByte("yYnNtTfFoO~+-.0123456789", v[0]) < 0 {
		return ""
	}
	switch {
	case yaml11Bool.MatchString(v):
		return "a boolean"
	case yaml11Null.MatchString(v):
		return "null"
	case yaml11Int.MatchString(v), leadingZero.MatchString(v):
		return "a number"
	case yaml11Float.MatchString(v):
		return "a number"
	}
	return ""
}

// schemaNode is a decoded JSON Schema object.
type schemaNode = map[string]any

var (
	rawSchemasOnce sync.Once
	rawSchemas     map[schema.Kind]schemaNode
)

func loadRawSchemas() map[schema.Kind]schemaNode {
	rawSchemasOnce.Do(func() {
		rawSchemas = map[schema.Kind]schemaNode{}
		for _, k := range schema.Kinds {
			f, err := schema.Files().Open(k.FileName())
			if err != nil {
				panic("inventory: embedded schema missing: " + err.Error()) // build defect
			}
			var n schemaNode
			if err := json.NewDecoder(f).Decode(&n); err != nil {
				panic("inventory: embedded schema broken: " + err.Error())
			}
			f.Close()
			rawSchemas[k] = n
		}
	})
	return rawSchemas
}

// expected is what the schema says about the value at a pointer.
type expected struct {
	typ   string   // JSON type, "" if unknown
	def   string   // innermost $defs name, "" if none
	props []string // property names when the value is an object
}

// expectAt walks the schema of kind along pointer's segments through
// properties, items and $ref. It returns the zero value where the schema has
// no rule (an unknown field, reported separately).
func expectAt(kind schema.Kind, pointer string) expected {
	root := loadRawSchemas()[kind]
	defs, _ := root["$defs"].(schemaNode)
	node, def := root, ""
	resolve := func() {
		for {
			ref, ok := node["$ref"].(string)
			if !ok {
				return
			}
			name := strings.TrimPrefix(ref, "#/$defs/")
			next, ok := defs[name].(schemaNode)
			if !ok {
				return
			}
			node, def = next, name
		}
	}
	resolve()
	if pointer != "" {
		for _, seg := range strings.Split(pointer[1:], "/") {
			if props, ok := node["properties"].(schemaNode); ok {
				if p, ok := props[seg].(schemaNode); ok {
					node, def = p, ""
					resolve()
					continue
				}
			}
			if items, ok := node["items"].(schemaNode); ok {
				if _, err := strconv.Atoi(seg); err == nil {
					node, def = items, ""
					resolve()
					continue
				}
			}
			return expected{}
		}
	}
	e := expected{def: def}
	switch t := node["type"].(type) {
	case string:
		e.typ = t
	default:
		if enum, ok := node["enum"].([]any); ok && len(enum) > 0 {
			if _, ok := enum[0].(string); ok {
				e.typ = "string"
			}
		}
	}
	if props, ok := node["properties"].(schemaNode); ok {
		for p := range props {
			e.props = append(e.props, p)
		}
	}
	return e
}

// checkYAML11 reports plain scalars that YAML 1.1 and 1.2 parsers read
// differently from what the schema expects. It returns the pointers it
// flagged, so the schema's own type error there is not reported twice.
func (d *doc) checkYAML11(kind schema.Kind) ([]FieldError, map[string]bool) {
	var errs []FieldError
	flagged := map[string]bool{}
	// The schema rule depends only on the pointer's shape (indexes as "*"),
	// so look each shape up once per file.
	cache := map[string]expected{}
	expect := func(pointer string) expected {
		shape := shapeOf(pointer)
		e, ok := cache[shape]
		if !ok {
			e = expectAt(kind, pointer)
			cache[shape] = e
		}
		return e
	}
	var walk func(n *yamlv3.Node, pointer string)
	walk = func(n *yamlv3.Node, pointer string) {
		switch n.Kind {
		case yamlv3.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				walk(n.Content[i+1], pointer+"/"+escapePointer(n.Content[i].Value))
			}
			return
		case yamlv3.SequenceNode:
			for i, c := range n.Content {
				walk(c, pointer+"/"+strconv.Itoa(i))
			}
			return
		case yamlv3.ScalarNode:
		default:
			return
		}
		if n.Style&(yamlv3.DoubleQuotedStyle|yamlv3.SingleQuotedStyle|yamlv3.LiteralStyle|yamlv3.FoldedStyle|yamlv3.TaggedStyle) != 0 {
			return
		}
		e := expect(pointer)
		msg := ""
		switch e.typ {
		case "string":
			switch {
			case e.def == "mac":
				msg = fmt.Sprintf("MAC addresses must be quoted (%q): YAML 1.1 parsers read some unquoted MACs, such as 52:54:00:00:01:01, as base-60 numbers", n.Value)
			case n.Value == "":
				return // an empty value is null to everyone; the schema reports it
			default:
				if t := yaml11Type(n.Value); t != "" {
					shown := fmt.Sprintf("%q", n.Value)
					if sensitivePointer(pointer) {
						shown = "this value"
					}
					msg = fmt.Sprintf("unquoted %s is read as %s by YAML 1.1 parsers; quote it if you mean a string", shown, t)
				}
			}
		case "integer":
			if leadingZero.MatchString(n.Value) {
				msg = fmt.Sprintf("%s has a leading zero, which YAML 1.1 parsers read as an octal number; write it without the zero", n.Value)
			}
		case "boolean":
			if yaml11Bool.MatchString(n.Value) && n.Value != "true" && n.Value != "false" {
				msg = fmt.Sprintf("write true or false, not %s: YAML 1.1 reads %s as a boolean but YAML 1.2 as a string", n.Value, n.Value)
			}
		}
		if msg != "" {
			errs = append(errs, d.errAt(position{n.Line, n.Column}, pointer, msg))
			flagged[pointer] = true
		}
	}
	walk(d.root, "")
	return errs, flagged
}

// sensitivePointer reports whether the value at pointer may hold a secret
// someone pasted by mistake, so messages must not repeat it.
func sensitivePointer(pointer string) bool {
	return strings.HasSuffix(pointer, "/credentials") || strings.Contains(pointer, "/sshKeys/")
}

// shapeOf replaces the array indexes of a pointer with "*".
func shapeOf(pointer string) string {
	b := []byte(pointer)
	out := b[:0]
	for i := 0; i < len(b); i++ {
		if b[i] >= '0' && b[i] <= '9' && i > 0 && b[i-1] == '/' {
			j := i
			for j < len(b) && b[j] >= '0' && b[j] <= '9' {
				j++
			}
			if j == len(b) || b[j] == '/' {
				out = append(out, '*')
				i = j - 1
				continue
			}
		}
		out = append(out, b[i])
	}
	return string(out)
}
