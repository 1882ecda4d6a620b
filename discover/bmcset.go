package discover

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	yamlv3 "gopkg.in/yaml.v3"

	"github.com/machina-metal/machina/inventory"
)

// ErrNoServer reports a server name that servers.yaml does not hold.
var ErrNoServer = errors.New("discover: no such server")

// SetBMC returns servers.yaml with the bmc block of server name replaced by
// b (inserted when the server has none), every other line kept byte for
// byte. The caller validates the result ([Commit] does).
func SetBMC(servers []byte, name string, b inventory.BMC) ([]byte, error) {
	return setBlock(servers, name, "bmc", func(blk *bytes.Buffer, indent string) { Entry{BMC: b}.renderBMC(blk, indent) })
}

// SetTPM returns servers.yaml with the tpm block of server name set to
// pin the EK fingerprint ek (inserted when the server has none), every
// other line kept byte for byte. The caller validates the result.
func SetTPM(servers []byte, name, ek string) ([]byte, error) {
	return setBlock(servers, name, "tpm", func(blk *bytes.Buffer, indent string) {
		fmt.Fprintf(blk, "%stpm:\n%s  ek: %s\n", indent, indent, yq(ek))
	})
}

// setBlock replaces the block under key of server name with what render
// writes at the key's indent, or inserts it after the server's last line.
func setBlock(servers []byte, name, blockKey string, render func(b *bytes.Buffer, indent string)) ([]byte, error) {
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(servers, &doc); err != nil {
		return nil, fmt.Errorf("discover: parse servers.yaml: %w", err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yamlv3.MappingNode {
		return nil, fmt.Errorf("discover: servers.yaml is not a mapping")
	}
	list := value(doc.Content[0], "servers")
	if list == nil || list.Kind != yamlv3.SequenceNode {
		return nil, fmt.Errorf("discover: servers.yaml has no servers list")
	}
	for _, item := range list.Content {
		if item.Kind != yamlv3.MappingNode || item.Style&yamlv3.FlowStyle != 0 {
			continue
		}
		if n := value(item, "name"); n == nil || n.Value != name {
			continue
		}
		lines := strings.SplitAfter(string(servers), "\n")
		nameKey := key(item, "name")
		indent := strings.Repeat(" ", nameKey.Column-1)
		var blk bytes.Buffer
		render(&blk, indent)
		start, end := lastLine(item)+1, lastLine(item) // insert after the item
		if k := key(item, blockKey); k != nil {
			start, end = k.Line, lastLine(value(item, blockKey))
			indent = strings.Repeat(" ", k.Column-1)
			blk.Reset()
			render(&blk, indent)
		}
		var out bytes.Buffer
		for i := 1; i < start && i <= len(lines); i++ {
			out.WriteString(lines[i-1])
		}
		if start > 1 && start-1 <= len(lines) && !strings.HasSuffix(lines[start-2], "\n") {
			out.WriteString("\n")
		}
		out.Write(blk.Bytes())
		for i := end + 1; i <= len(lines); i++ {
			out.WriteString(lines[i-1])
		}
		return out.Bytes(), nil
	}
	return nil, fmt.Errorf("%w: %s", ErrNoServer, name)
}

func key(m *yamlv3.Node, k string) *yamlv3.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == k {
			return m.Content[i]
		}
	}
	return nil
}

func value(m *yamlv3.Node, k string) *yamlv3.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == k {
			return m.Content[i+1]
		}
	}
	return nil
}

// lastLine is the last line any part of n starts on.
func lastLine(n *yamlv3.Node) int {
	l := n.Line
	for _, c := range n.Content {
		l = max(l, lastLine(c))
	}
	return l
}

// renderBMC writes "bmc:" and its fields at indent.
func (e Entry) renderBMC(b *bytes.Buffer, indent string) {
	fmt.Fprintf(b, "%sbmc:\n", indent)
	fmt.Fprintf(b, "%s  driver: %s\n", indent, yq(string(e.BMC.Driver)))
	fmt.Fprintf(b, "%s  address: %s\n", indent, yq(e.BMC.Address))
	fmt.Fprintf(b, "%s  credentials: %s\n", indent, yq(e.BMC.Credentials))
	if e.BMC.SystemID != "" {
		fmt.Fprintf(b, "%s  systemID: %s\n", indent, yq(e.BMC.SystemID))
	}
	if e.BMC.InsecureTLS {
		fmt.Fprintf(b, "%s  insecureTLS: true\n", indent)
	}
}
