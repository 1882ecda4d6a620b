package bmcsim

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
)

// Tree is one parsed Redfish mockup: every `index.json` below
// `<dir>/redfish/...`, keyed by its URL path. A Tree is immutable once loaded
// and safe to share between any number of [Server]s, which keep their own
// copy-on-write overlays on top of it.
type Tree struct {
	// Name is the tree's folder name, e.g. "dell-poweredge-r750-idrac9".
	Name string
	// Manufacturer is the first System's Manufacturer, "" if absent.
	Manufacturer string
	nodes        map[string]*node // key: lower-case URL path without trailing '/'
}

// node is one resource as loaded. body must never be mutated.
type node struct {
	path string // URL path with the tree's own case
	raw  []byte
	body map[string]any
	etag string // ETag header value: the body's @odata.etag or a hash

	// withPower caches raw with PowerState replaced, per PowerState value;
	// nodes are immutable, so the cache is valid for every Server sharing it.
	mu        sync.Mutex
	withPower map[string][]byte
}

// rawWithPower returns the body with PowerState set to ps.
func (n *node) rawWithPower(ps string) []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	if b, ok := n.withPower[ps]; ok {
		return b
	}
	m := maps.Clone(n.body)
	m["PowerState"] = ps
	b, _ := json.Marshal(m)
	if n.withPower == nil {
		n.withPower = map[string][]byte{}
	}
	n.withPower[ps] = b
	return b
}

// LoadTree reads a mockup folder laid out as `<dir>/redfish/v1/.../index.json`
// (the fixtures' layout; the URL /redfish/v1/Systems/1 maps to
// redfish/v1/Systems/1/index.json). Files that are not valid JSON objects are
// an error naming the file. Paths are matched without regard to case, as the
// HPE iLO tree links to `/redfish/v1/systems/1/bios` but stores `Systems/1/Bios`.
func LoadTree(dir string) (*Tree, error) {
	t := &Tree{Name: filepath.Base(filepath.Clean(dir)), nodes: map[string]*node{}}
	root := filepath.Join(dir, "redfish")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || d.Name() != "index.json" {
			return nil
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var body map[string]any
		if err := json.Unmarshal(raw, &body); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		rel, err := filepath.Rel(dir, filepath.Dir(p))
		if err != nil {
			return err
		}
		urlPath := "/" + filepath.ToSlash(rel)
		t.nodes[strings.ToLower(urlPath)] = newNode(urlPath, raw, body)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bmcsim: load tree %s: %w", dir, err)
	}
	if _, ok := t.nodes["/redfish/v1"]; !ok {
		return nil, fmt.Errorf("bmcsim: load tree %s: no redfish/v1/index.json", dir)
	}
	if _, ok := t.nodes["/redfish"]; !ok {
		body := map[string]any{"v1": "/redfish/v1/"}
		raw, _ := json.Marshal(body)
		t.nodes["/redfish"] = newNode("/redfish", raw, body)
	}
	if sys := t.firstMember("/redfish/v1/systems"); sys != nil {
		t.Manufacturer, _ = sys.body["Manufacturer"].(string)
	}
	return t, nil
}

func newNode(path string, raw []byte, body map[string]any) *node {
	n := &node{path: path, raw: raw, body: body}
	if e, ok := body["@odata.etag"].(string); ok && e != "" {
		n.etag = e
	} else {
		n.etag = hashETag(raw)
	}
	return n
}

func hashETag(b []byte) string {
	h := fnv.New64a()
	h.Write(b)
	return fmt.Sprintf("\"%016x\"", h.Sum64())
}

// Paths returns the number of resources in the tree.
func (t *Tree) Paths() int { return len(t.nodes) }

func (t *Tree) lookup(p string) *node { return t.nodes[normPath(p)] }

// SystemIDs returns the Id (last path segment) of every member of the
// Systems collection, in collection order.
func (t *Tree) SystemIDs() []string {
	var out []string
	if c := t.lookup("/redfish/v1/Systems"); c != nil {
		for _, id := range memberIDs(c.body) {
			out = append(out, path.Base(strings.TrimRight(id, "/")))
		}
	}
	return out
}

func (t *Tree) firstMember(coll string) *node {
	c := t.lookup(coll)
	if c == nil {
		return nil
	}
	for _, id := range memberIDs(c.body) {
		if n := t.lookup(id); n != nil {
			return n
		}
	}
	return nil
}

// normPath lower-cases p and drops the query, fragment and trailing '/'.
func normPath(p string) string {
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		p = p[:i]
	}
	p = strings.TrimRight(p, "/")
	if p == "" {
		p = "/"
	}
	return strings.ToLower(p)
}

func memberIDs(body map[string]any) []string {
	ms, _ := body["Members"].([]any)
	var out []string
	for _, m := range ms {
		if mm, ok := m.(map[string]any); ok {
			if id, ok := mm["@odata.id"].(string); ok {
				out = append(out, id)
			}
		}
	}
	return out
}

func odataID(v any) string {
	if m, ok := v.(map[string]any); ok {
		s, _ := m["@odata.id"].(string)
		return s
	}
	return ""
}

// deepCopy copies a decoded JSON value.
func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = deepCopy(e)
		}
		return s
	default:
		return v
	}
}
