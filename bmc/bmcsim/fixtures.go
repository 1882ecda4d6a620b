package bmcsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
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

// WriteSharedChassisTree copies the tree in src to dst (a new folder) and
// adds a second ComputerSystem, "<first system>-2", in the first system's
// chassis: the chassis' Links.ComputerSystems lists both, and the chassis
// gains a Sensor and a Thermal entry both named "CPU Temp" (78 °C) whose
// RelatedItem is the second system's CPU. Blade and multi-node chassis
// behave so (Supermicro TwinPro and BigTwin, Dell PowerEdge C6520 and
// MX7000 sleds, HPE Apollo 2000 and Synergy): one chassis, several
// systems, sensors tied to one node by RelatedItem. The second system has
// only Links.Chassis, the Reset action and the Boot override.
func WriteSharedChassisTree(src, dst string) error {
	if err := copyTree(src, dst); err != nil {
		return fmt.Errorf("bmcsim: shared chassis tree: copy: %w", err)
	}
	t := treeDir(dst)
	coll, err := t.read("/redfish/v1/Systems")
	if err != nil {
		return fmt.Errorf("bmcsim: shared chassis tree: %w", err)
	}
	ids := memberIDs(coll)
	if len(ids) == 0 {
		return errors.New("bmcsim: shared chassis tree: no system")
	}
	s1, err := t.read(ids[0])
	if err != nil {
		return fmt.Errorf("bmcsim: shared chassis tree: %w", err)
	}
	links, _ := obj(s1, "Links")["Chassis"].([]any)
	if len(links) == 0 {
		return errors.New("bmcsim: shared chassis tree: the first system links no chassis")
	}
	chID := odataID(links[0])
	s2ID := strings.TrimRight(ids[0], "/") + "-2"
	if err := t.write(s2ID, secondSystem(s1, s2ID, chID)); err != nil {
		return err
	}
	coll["Members"] = append(anySlice(coll["Members"]), map[string]any{"@odata.id": s2ID})
	coll["Members@odata.count"] = len(anySlice(coll["Members"]))
	if err := t.write("/redfish/v1/Systems", coll); err != nil {
		return err
	}
	ch, err := t.read(chID)
	if err != nil {
		return fmt.Errorf("bmcsim: shared chassis tree: %w", err)
	}
	cl, _ := ch["Links"].(map[string]any)
	if cl == nil {
		cl = map[string]any{}
		ch["Links"] = cl
	}
	cl["ComputerSystems"] = []any{map[string]any{"@odata.id": ids[0]}, map[string]any{"@odata.id": s2ID}}
	if err := t.write(chID, ch); err != nil {
		return err
	}
	return t.addNodeSensors(ch, s2ID)
}

// copyTree copies the folder src to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, de os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		if de.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(out, b, 0o644)
	})
}

// treeDir is a Redfish tree on disk: one index.json per @odata.id.
type treeDir string

func (t treeDir) file(id string) string {
	return filepath.Join(string(t), filepath.FromSlash(strings.TrimPrefix(id, "/")), "index.json")
}

func (t treeDir) read(id string) (map[string]any, error) {
	var m map[string]any
	b, err := os.ReadFile(t.file(id))
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	return m, err
}

func (t treeDir) write(id string, m map[string]any) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(t.file(id)), 0o755); err != nil {
		return err
	}
	return os.WriteFile(t.file(id), b, 0o644)
}

// secondSystem is the second node of s1's chassis chID: only
// Links.Chassis, the Reset action and a copy of s1's Boot override.
func secondSystem(s1 map[string]any, s2ID, chID string) map[string]any {
	return map[string]any{
		"@odata.id": s2ID, "@odata.type": s1["@odata.type"], "Id": path.Base(s2ID), "Name": "Second node",
		"Manufacturer": s1["Manufacturer"], "Model": s1["Model"], "SerialNumber": "NODE2", "PowerState": "On",
		"Status": map[string]any{"State": "Enabled", "Health": "OK", "HealthRollup": "OK"},
		"Boot":   deepCopy(s1["Boot"]),
		"Links":  map[string]any{"Chassis": []any{map[string]any{"@odata.id": chID}}},
		"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{
			"target":                            s2ID + "/Actions/ComputerSystem.Reset",
			"ResetType@Redfish.AllowableValues": []any{"On", "ForceOff", "ForceRestart", "GracefulShutdown"},
		}},
	}
}

// addNodeSensors adds to chassis ch a Sensor and a Thermal entry named
// "CPU Temp" (78 °C) whose RelatedItem is the second system's CPU.
func (t treeDir) addNodeSensors(ch map[string]any, s2ID string) error {
	related := []any{map[string]any{"@odata.id": s2ID + "/Processors/CPU1"}}
	if sid := odataID(ch["Sensors"]); sid != "" {
		sc, err := t.read(sid)
		if err == nil {
			snID := strings.TrimRight(sid, "/") + "/Node2CPUTemp"
			sn := map[string]any{"@odata.id": snID, "@odata.type": "#Sensor.v1_7_0.Sensor", "Id": "Node2CPUTemp", "Name": "CPU Temp",
				"ReadingType": "Temperature", "ReadingUnits": "Cel", "Reading": 78, "Status": map[string]any{"State": "Enabled", "Health": "OK"},
				"RelatedItem": related}
			if err := t.write(snID, sn); err != nil {
				return err
			}
			sc["Members"] = append(anySlice(sc["Members"]), map[string]any{"@odata.id": snID})
			sc["Members@odata.count"] = len(anySlice(sc["Members"]))
			if err := t.write(sid, sc); err != nil {
				return err
			}
		}
	}
	if tid := odataID(ch["Thermal"]); tid != "" {
		th, err := t.read(tid)
		if err == nil {
			th["Temperatures"] = append(anySlice(th["Temperatures"]), map[string]any{"Name": "CPU Temp", "ReadingCelsius": 78,
				"Status": map[string]any{"State": "Enabled", "Health": "OK"}, "RelatedItem": related})
			if err := t.write(tid, th); err != nil {
				return err
			}
		}
	}
	return nil
}
