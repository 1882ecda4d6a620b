package bmcsim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
)

// FixturesDir returns the folder holding the `redfish/<tree>` fixture trees:
// $MACHINA_FIXTURES when set, else the first `testdata/fixtures` found in
// the working directory or one of its parents (the repo's copy made by
// scripts/sync-fixtures.sh).
func FixturesDir() (string, error) {
	if d := os.Getenv("MACHINA_FIXTURES"); d != "" {
		return d, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("bmcsim: fixtures dir: %w", err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		cand := filepath.Join(d, "testdata", "fixtures")
		if st, err := os.Stat(filepath.Join(cand, "redfish")); err == nil && st.IsDir() {
			return cand, nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("bmcsim: fixtures dir: no testdata/fixtures/redfish above the working directory and MACHINA_FIXTURES unset")
		}
	}
}

var treeName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,99}$`)

// TreeDir returns the folder of the Redfish tree called name (e.g.
// "dell-poweredge-r750-idrac9") under fixtures (or [FixturesDir] when
// fixtures is ""). name must be a plain folder name.
func TreeDir(fixtures, name string) (string, error) {
	if !treeName.MatchString(name) || name == ".." {
		return "", fmt.Errorf("bmcsim: tree name %q is not a plain folder name", name)
	}
	if fixtures == "" {
		var err error
		if fixtures, err = FixturesDir(); err != nil {
			return "", err
		}
	}
	dir := filepath.Join(fixtures, "redfish", name)
	if _, err := os.Stat(filepath.Join(dir, "redfish", "v1", "index.json")); err != nil {
		return "", fmt.Errorf("bmcsim: tree %q: %w", name, err)
	}
	return dir, nil
}

// Trees caches parsed trees by folder so many emulators share one copy.
// The zero value is ready; safe for concurrent use.
type Trees struct {
	mu sync.Mutex
	m  map[string]*Tree
}

// Load returns the parsed tree in dir, parsing it on first use.
func (c *Trees) Load(dir string) (*Tree, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("bmcsim: load tree %s: %w", dir, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.m[abs]; ok {
		return t, nil
	}
	t, err := LoadTree(abs)
	if err != nil {
		return nil, err
	}
	if c.m == nil {
		c.m = map[string]*Tree{}
	}
	c.m[abs] = t
	return t, nil
}

// New returns an emulator serving the tree in dir, parsed once and shared
// with every other emulator made through c; cfg.Tree is overwritten.
func (c *Trees) New(dir string, cfg Config) (*Server, error) {
	t, err := c.Load(dir)
	if err != nil {
		return nil, err
	}
	cfg.Tree = t
	return New(cfg)
}
