package inventory

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	yamlv3 "gopkg.in/yaml.v3"
)

// converter turns a parsed document into the JSON value the schema checks
// (objects as map[string]any, numbers as json.Number, as encoding/json
// decodes with UseNumber) and into JSON text for the strict decode into the
// Go types, in one pass over the node tree, so a file is parsed once.
//
// It gives the values sigs.k8s.io/yaml's YAMLToJSON gives (go.yaml.in/yaml/v2
// underneath: YAML 1.1 booleans such as yes and off are booleans; integers
// and floats as yaml.v3 resolves them, which is the same code), for the
// documents an inventory holds: block mappings and lists of untagged
// scalars with string keys. A document using anything else (an explicit
// tag, an anchor or alias, a merge key, a key that YAML 1.1 reads as a
// number, boolean or null, a timestamp, an infinite or NaN float) makes it
// give up, and the caller converts the file with YAMLToJSON as before, so
// those keep their exact meaning and messages.
type converter struct {
	js []byte
}

// giveUp is the panic value with which the converter gives up on a
// document, recovered by convert.
type giveUp struct{}

// convert returns the JSON value and text of the document rooted at root,
// or ok false when the document needs the general conversion.
func convert(root *yamlv3.Node) (v any, js []byte, ok bool) {
	c := converter{js: make([]byte, 0, 1<<16)}
	defer func() {
		if r := recover(); r != nil {
			if _, give := r.(giveUp); !give {
				panic(r)
			}
			v, js, ok = nil, nil, false
		}
	}()
	v = c.value(root)
	return v, c.js, true
}

func (c *converter) value(n *yamlv3.Node) any {
	if n.Anchor != "" || n.Style&yamlv3.TaggedStyle != 0 {
		panic(giveUp{})
	}
	switch n.Kind {
	case yamlv3.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		c.js = append(c.js, '{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yamlv3.ScalarNode || k.Anchor != "" || k.Style&yamlv3.TaggedStyle != 0 {
				panic(giveUp{})
			}
			if k.Style&(yamlv3.DoubleQuotedStyle|yamlv3.SingleQuotedStyle) == 0 && (k.Tag != "!!str" || yaml11Bools[k.Value]) {
				// A plain key YAML reads as a number, boolean, null or merge
				// key: sigs.k8s.io/yaml turns it into a string its own way.
				panic(giveUp{})
			}
			if i > 0 {
				c.js = append(c.js, ',')
			}
			c.str(k.Value)
			c.js = append(c.js, ':')
			m[k.Value] = c.value(n.Content[i+1])
		}
		c.js = append(c.js, '}')
		return m
	case yamlv3.SequenceNode:
		l := make([]any, len(n.Content))
		c.js = append(c.js, '[')
		for i, e := range n.Content {
			if i > 0 {
				c.js = append(c.js, ',')
			}
			l[i] = c.value(e)
		}
		c.js = append(c.js, ']')
		return l
	case yamlv3.ScalarNode:
		return c.scalar(n)
	}
	panic(giveUp{}) // an alias, or a document node where a value belongs
}

// yaml11Bools are the booleans of YAML 1.1 (yaml.org/type/bool.html) that
// YAML 1.2 reads as strings, with their value.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": true, "N": true, "no": true, "No": true, "NO": true, "off": true, "Off": true, "OFF": true,
}

var yaml11True = map[string]bool{"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true}

func (c *converter) scalar(n *yamlv3.Node) any {
	if n.Style&(yamlv3.DoubleQuotedStyle|yamlv3.SingleQuotedStyle|yamlv3.LiteralStyle|yamlv3.FoldedStyle) != 0 {
		if n.Style&yamlv3.DoubleQuotedStyle != 0 && !utf8.ValidString(n.Value) {
			panic(giveUp{}) // a \x escape: let encoding/json decide what it becomes
		}
		c.str(n.Value)
		return n.Value
	}
	if yaml11Bools[n.Value] {
		b := yaml11True[n.Value]
		c.js = strconv.AppendBool(c.js, b)
		return b
	}
	switch n.Tag {
	case "!!str":
		c.str(n.Value)
		return n.Value
	case "!!null":
		c.js = append(c.js, "null"...)
		return nil
	case "!!bool":
		b := n.Value == "true" || n.Value == "True" || n.Value == "TRUE"
		c.js = strconv.AppendBool(c.js, b)
		return b
	case "!!int":
		plain := strings.ReplaceAll(n.Value, "_", "")
		start := len(c.js)
		if i, err := strconv.ParseInt(plain, 0, 64); err == nil {
			c.js = strconv.AppendInt(c.js, i, 10)
		} else if u, err := strconv.ParseUint(plain, 0, 64); err == nil {
			c.js = strconv.AppendUint(c.js, u, 10)
		} else {
			panic(giveUp{})
		}
		return json.Number(c.js[start:])
	case "!!float":
		f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			panic(giveUp{})
		}
		b, err := json.Marshal(f)
		if err != nil {
			panic(giveUp{})
		}
		c.js = append(c.js, b...)
		return json.Number(b)
	}
	panic(giveUp{}) // a timestamp, or a tag this converter does not know
}

// str appends s as a JSON string.
func (c *converter) str(s string) {
	const hex = "0123456789abcdef"
	c.js = append(c.js, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b >= 0x20 && b != '"' && b != '\\' {
			continue
		}
		c.js = append(c.js, s[start:i]...)
		switch b {
		case '"', '\\':
			c.js = append(c.js, '\\', b)
		case '\n':
			c.js = append(c.js, '\\', 'n')
		case '\t':
			c.js = append(c.js, '\\', 't')
		case '\r':
			c.js = append(c.js, '\\', 'r')
		default:
			c.js = append(c.js, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
		}
		start = i + 1
	}
	c.js = append(c.js, s[start:]...)
	c.js = append(c.js, '"')
}
