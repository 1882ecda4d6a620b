package discover

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/macaddr"
)

// Entry is one new servers.yaml entry, in file form (the fields
// inventory.Server carries on input).
type Entry struct {
	Name     string
	Zone     string
	Site     string
	Rack     string
	Tags     []string
	BootMAC  string
	BootMode string
	// BMC is the server's BMC; the zero BMC renders no bmc block (an
	// auto-enrolled machine's entry, attached later with SetBMC).
	BMC inventory.BMC
	// Comment lines are written as YAML comments above the entry (the
	// hardware facts of an auto-enrolled machine, for the reviewer). Every
	// character outside printable ASCII is replaced by '?', and a line is
	// cut at 160 characters, so no value can leave its comment.
	Comment []string
}

// commentLine makes s safe inside a YAML comment: printable ASCII only
// (no line breaks), at most 160 characters.
func commentLine(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	if len(b) > 160 {
		b = b[:160]
	}
	return strings.TrimRight(string(b), " ")
}

// yq quotes s as a YAML double-quoted scalar (a JSON string is one), so no
// value can break out of its field.
func yq(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// render writes e as a list item indented by indent.
func (e Entry) render(b *bytes.Buffer, indent string) {
	in := indent + "  "
	for _, c := range e.Comment {
		fmt.Fprintf(b, "%s# %s\n", indent, commentLine(c))
	}
	fmt.Fprintf(b, "%s- name: %s\n", indent, yq(e.Name))
	fmt.Fprintf(b, "%szone: %s\n", in, yq(e.Zone))
	if e.Site != "" {
		fmt.Fprintf(b, "%ssite: %s\n", in, yq(e.Site))
	}
	if e.Rack != "" {
		fmt.Fprintf(b, "%srack: %s\n", in, yq(e.Rack))
	}
	if len(e.Tags) > 0 {
		q := make([]string, len(e.Tags))
		for i, t := range e.Tags {
			q[i] = yq(t)
		}
		fmt.Fprintf(b, "%stags: [%s]\n", in, strings.Join(q, ", "))
	}
	fmt.Fprintf(b, "%sbootMAC: %s\n", in, yq(e.BootMAC))
	if e.BootMode != "" {
		fmt.Fprintf(b, "%sbootMode: %s\n", in, yq(e.BootMode))
	}
	if !e.BMC.IsZero() {
		e.renderBMC(b, in)
	}
}

var (
	itemIndent = regexp.MustCompile(`(?m)^([ \t]*)- `)
	emptyList  = regexp.MustCompile(`(?m)^servers:[ \t]*\[\][ \t]*(#.*)?$`)
	serversKey = regexp.MustCompile(`(?m)^servers:[ \t]*(#.*)?$`)
)

// AppendEntries returns servers.yaml with es appended to the end of its
// top-level servers list, keeping every existing byte (comments,
// formatting) and the list's indentation. The list must be the file's last
// top-level key, as Machina's servers.yaml has only that one; an empty
// file or `servers: []` gets a fresh list.
func AppendEntries(servers []byte, es []Entry) ([]byte, error) {
	if len(es) == 0 {
		return servers, nil
	}
	out := bytes.Clone(servers)
	switch {
	case len(bytes.TrimSpace(out)) == 0:
		out = append(out, "servers:\n"...)
	case emptyList.Match(out):
		out = emptyList.ReplaceAll(out, []byte("servers:"))
	case !serversKey.Match(out):
		return nil, fmt.Errorf("discover: servers.yaml has no block `servers:` list to append to")
	}
	loc := serversKey.FindIndex(out)
	if loc != nil {
		// Nothing but list items, deeper lines and comments may follow.
		for _, line := range strings.Split(string(out[loc[1]:]), "\n") {
			t := strings.TrimSpace(line)
			if t != "" && !strings.HasPrefix(t, "#") && line[0] != ' ' && line[0] != '\t' && line[0] != '-' {
				return nil, fmt.Errorf("discover: servers.yaml has a top-level key after the servers list (%q)", t)
			}
		}
	}
	indent := "  "
	if loc != nil {
		if m := itemIndent.FindSubmatch(out[loc[1]:]); m != nil {
			indent = string(m[1])
		}
	}
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	var b bytes.Buffer
	for _, e := range es {
		e.render(&b, indent)
	}
	return append(out, b.Bytes()...), nil
}

// index holds the identifiers already in use, normalised.
type index struct {
	names, macs, bmcs map[string]string // identifier -> owning server
}

func newIndex(inv *inventory.Inventory) *index {
	ix := &index{names: map[string]string{}, macs: map[string]string{}, bmcs: map[string]string{}}
	if inv != nil {
		for _, s := range inv.Servers {
			ix.add(s.Name, s.BootMAC, s.BMC.Driver, s.BMC.Address)
		}
	}
	return ix
}

func (ix *index) add(name, mac string, driver inventory.BMCDriver, addr string) {
	ix.names[name] = name
	if m, err := macaddr.Normalize(strings.TrimSpace(mac)); err == nil {
		ix.macs[m] = name
	}
	if addr != "" {
		ix.bmcs[inventory.NormalizeBMCAddress(driver, addr)] = name
	}
}

// clash names why an entry duplicates an existing server, or "".
func (ix *index) clash(name, mac string, driver inventory.BMCDriver, addr string) string {
	if o, ok := ix.names[name]; ok {
		return "name " + name + " exists (" + o + ")"
	}
	if m, err := macaddr.Normalize(strings.TrimSpace(mac)); err == nil {
		if o, ok := ix.macs[m]; ok {
			return "boot MAC " + m + " belongs to " + o
		}
	}
	if addr != "" {
		if o, ok := ix.bmcs[inventory.NormalizeBMCAddress(driver, addr)]; ok {
			return "BMC address " + addr + " belongs to " + o
		}
	}
	return ""
}
