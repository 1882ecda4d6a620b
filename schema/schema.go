// Package schema owns the JSON Schema files (draft 2020-12) of the inventory
// files servers.yaml, profiles.yaml, images.yaml and networks.yaml and of the commissioning
// report machines send, and validates decoded documents against them.
//
// The files are embedded with go:embed and exported unchanged by
// [Files] and `machinactl schema export`, so editors (yaml-language-server
// modeline) and any standard validator use the same rules as Machina.
//
// schema is a leaf: it holds no Go types of the inventory and imports no
// Machina package. Turning violations into file:line messages is the job of
// package inventory.
package schema

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v5"

	"github.com/machina-metal/machina/macaddr"
	"github.com/machina-metal/machina/namerule"
)

//go:embed *.schema.json
var files embed.FS

// Kind names one inventory file.
type Kind string

// The inventory files, each with its own schema.
const (
	Servers  Kind = "servers"
	Profiles Kind = "profiles"
	Images   Kind = "images"
	// Networks is networks.yaml, the site's subnets (optional).
	Networks Kind = "networks"
)

// Kinds lists every Kind in a stable order.
var Kinds = []Kind{Servers, Profiles, Images, Networks}

// AgentReport is the schema of the commissioning report the ramdisk agent
// posts (api/v1.AgentReport, agent-report.schema.json): the machine
// endpoint checks every report body against it before the report's token
// is used. Not an inventory file, so not in Kinds.
const AgentReport Kind = "agent-report"

// MachineKinds lists the schemas of machine-sent documents.
var MachineKinds = []Kind{AgentReport}

// FileName is the schema's file name, e.g. "servers.schema.json": the stable
// path under schema/ in the repository and in `machinactl schema export`.
func (k Kind) FileName() string { return string(k) + ".schema.json" }

// Files returns the embedded schema files (name → bytes). The returned FS is
// read-only and safe for concurrent use.
func Files() fs.FS { return files }

// Violation is one schema rule a document breaks.
type Violation struct {
	// Pointer is the RFC 6901 JSON pointer of the offending value in the
	// document, "" for the root.
	Pointer string
	// Keyword is the JSON Schema keyword that failed: "type", "pattern",
	// "required", "additionalProperties", "enum", "oneOf", ...
	Keyword string
	// Def is the name of the $defs entry whose rule failed ("mac", "label"),
	// or "" when the rule sits outside $defs.
	Def string
	// Detail describes the failure without repeating the offending value,
	// so a caller may print it even when the value is a secret.
	Detail string
	// Fields holds the property names for "required" (the missing ones) and
	// "additionalProperties" (the unknown ones); nil otherwise.
	Fields []string
}

// Validator validates documents against the embedded schemas. Safe for
// concurrent use; build one with [New] and reuse it.
type Validator struct {
	schemas map[Kind]*jsonschema.Schema
}

var (
	defaultOnce sync.Once
	defaultV    *Validator
	defaultErr  error
)

// Default returns a shared Validator, compiled once.
func Default() (*Validator, error) {
	defaultOnce.Do(func() { defaultV, defaultErr = New() })
	return defaultV, defaultErr
}

// New compiles every embedded schema with format assertion turned on (draft
// 2020-12 only annotates "format" unless asked), the "mac" format and one
// format per namerule rule registered. An error means the embedded files are broken: a build defect.
func New() (*Validator, error) {
	c := jsonschema.NewCompiler()
	c.Draft = jsonschema.Draft2020
	c.AssertFormat = true
	c.Formats["mac"] = isMAC
	for _, r := range namerule.All() {
		// The one definition of each name rule; the "pattern" beside each
		// "format" is its copy for other JSON Schema tools (kept equal by
		// TestPatternsCopyNameRules).
		c.Formats[r.Name] = func(v any) bool {
			s, ok := v.(string)
			return !ok || r.Valid(s)
		}
	}
	v := &Validator{schemas: map[Kind]*jsonschema.Schema{}}
	for _, k := range append(slices.Clone(Kinds), MachineKinds...) {
		b, err := files.ReadFile(k.FileName())
		if err != nil {
			return nil, fmt.Errorf("schema: read %s: %w", k.FileName(), err)
		}
		url := "file:///schema/" + k.FileName()
		if err := c.AddResource(url, bytes.NewReader(b)); err != nil {
			return nil, fmt.Errorf("schema: load %s: %w", k.FileName(), err)
		}
		s, err := c.Compile(url)
		if err != nil {
			return nil, fmt.Errorf("schema: compile %s: %w", k.FileName(), err)
		}
		v.schemas[k] = s
	}
	return v, nil
}

// isMAC is the "mac" format: a 48-bit MAC address in any notation
// [macaddr.Parse] accepts. Non-strings pass (the type keyword reports them).
func isMAC(v any) bool {
	s, ok := v.(string)
	if !ok {
		return true
	}
	_, err := macaddr.Parse(s)
	return err == nil
}

// Validate checks doc, a value decoded by encoding/json with UseNumber (or
// plain float64 numbers), against the schema of kind. It returns every
// violation, sorted by pointer then keyword; nil when doc is valid.
func (v *Validator) Validate(kind Kind, doc any) []Violation {
	s, ok := v.schemas[kind]
	if !ok {
		return []Violation{{Keyword: "kind", Detail: fmt.Sprintf("unknown inventory kind %q", kind)}}
	}
	err := s.Validate(doc)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return []Violation{{Keyword: "schema", Detail: err.Error()}}
	}
	var out []Violation
	collect(ve, &out)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Pointer != out[j].Pointer {
			return out[i].Pointer < out[j].Pointer
		}
		return out[i].Keyword < out[j].Keyword
	})
	return dedupe(out)
}

// ValidateJSON is Validate for raw JSON bytes.
func (v *Validator) ValidateJSON(kind Kind, data []byte) ([]Violation, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("schema: decode %s document: %w", kind, err)
	}
	return v.Validate(kind, doc), nil
}

// collect flattens the error tree into leaf violations. A failed oneOf or
// anyOf is reported once, at its own location, with the schema's summary,
// because its branches' errors contradict each other and help nobody.
func collect(ve *jsonschema.ValidationError, out *[]Violation) {
	kw := lastSegment(ve.KeywordLocation)
	if kw == "oneOf" || kw == "anyOf" || len(ve.Causes) == 0 {
		*out = append(*out, violation(ve, kw))
		return
	}
	for _, c := range ve.Causes {
		collect(c, out)
	}
}

func violation(ve *jsonschema.ValidationError, kw string) Violation {
	v := Violation{Pointer: ve.InstanceLocation, Keyword: kw, Def: defName(ve.AbsoluteKeywordLocation)}
	switch kw {
	case "required":
		v.Fields = quotedNames(strings.TrimPrefix(ve.Message, "missing properties: "))
		v.Detail = "missing required field " + joinQuoted(v.Fields)
	case "additionalProperties":
		v.Fields = quotedNames(ve.Message)
		v.Detail = "unknown field " + joinQuoted(v.Fields)
	case "pattern", "format", "not":
		if d, ok := defDetails[v.Def]; ok {
			v.Detail = d
		} else {
			v.Detail = "has an invalid format"
		}
	case "oneOf", "anyOf":
		if d, ok := choiceDetails[v.Def]; ok {
			v.Detail = d
		} else {
			v.Detail = "matches none of the allowed forms"
		}
	default:
		v.Detail = ve.Message
	}
	return v
}

// defDetails says what a value failing a $defs rule's pattern or format is
// not. It never repeats the value.
var defDetails = map[string]string{
	"label":          "is not an RFC 1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)",
	"mac":            "is not a MAC address",
	"credentialName": "must name a credential in the controller's secret store (lower-case letters, digits, '.', '_', '-'), not hold a secret",
	"httpURL":        "is not an http(s) URL without user information",
	"hostPort":       "is not a host[:port] address",
	"imageName":      "is not an image name (lower-case letters, digits, '.' and '-')",
	"sshKey":         "is not an OpenSSH public key (ssh-ed25519, ecdsa-sha2-nistp256/384/521 or ssh-rsa, then the base64 key)",
	"ifname":         "is not a Linux interface name (1 to 15 letters, digits, '.', '_', '-', not starting with '-' or '.')",
	"tag":            "is not a tag (1 to 63 letters, digits, '_', '.', '-', starting with a letter or digit)",
	"volumeGroup":    "is not an LVM volume group name (a tag not starting with snapshot or pvmove)",
	"cidr":           "is not a CIDR prefix such as 10.20.0.0/24",
	"ipv4CIDR":       "is not an IPv4 CIDR prefix such as 10.20.0.0/24",
	"ipv6CIDR":       "is not an IPv6 CIDR prefix such as fd00:20::/64",
	"ipv4":           "is not an IPv4 address",
	"ipv6":           "is not an IPv6 address",
	"ipAddr":         "is not an IPv4 or IPv6 address",
	"dnsName":        "is not a DNS domain name",
	"checksum":       "is not a checksum (sha256: and 64 hex digits, or sha512: and 128 hex digits; MD5 and SHA-1 are refused)",
	"absPath":        "is not an absolute path of plain segments",
	"diskPath":       "is not a stable disk name (/dev/disk/by-id/... or /dev/disk/by-path/...)",
	"diskSerial":     "is not a disk serial number",
	"wwn":            "is not a World Wide Name (0x and 8 to 32 hex digits)",
	"byPath":         "is not a /dev/disk/by-path name",
	"systemID":       "is not a Redfish resource Id",
	"ipmiOnly":       "applies to IPMI BMCs only (driver ipmi)",
}

var choiceDetails = map[string]string{
	"image":  "an image needs either catalog (and no url, checksum or checksumURL), or url with exactly one of checksum and checksumURL",
	"subnet": "a subnet needs an IPv4 prefix (cidr), an IPv6 prefix (cidr6) or both",
}

// defName returns the $defs entry named in an absolute keyword location such
// as "file:///schema/servers.schema.json#/$defs/mac/pattern", the innermost
// one when several nest.
func defName(abs string) string {
	i := strings.LastIndex(abs, "/$defs/")
	if i < 0 {
		return ""
	}
	rest := abs[i+len("/$defs/"):]
	if j := strings.IndexByte(rest, '/'); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

func lastSegment(loc string) string {
	if i := strings.LastIndexByte(loc, '/'); i >= 0 {
		return loc[i+1:]
	}
	return loc
}

var quotedRE = regexp.MustCompile(`'((?:[^'\\]|\\.)*)'`)

// quotedNames extracts the property names the validator quotes as 'name'.
func quotedNames(msg string) []string {
	var names []string
	for _, m := range quotedRE.FindAllStringSubmatch(msg, -1) {
		names = append(names, strings.ReplaceAll(m[1], `\'`, `'`))
	}
	sort.Strings(names)
	return names
}

func joinQuoted(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}

func dedupe(in []Violation) []Violation {
	out := in[:0]
	seen := map[string]bool{}
	for _, v := range in {
		k := v.Pointer + "\x00" + v.Detail // pattern and format may both fail
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, v)
	}
	return out
}
