package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	yamlv3 "gopkg.in/yaml.v3"
)

// maxConfigBytes bounds a --config file.
const maxConfigBytes = 1 << 20

// envName is the environment variable of a flag: MACHINA_ and the flag's
// name upper-cased with "-" as "_" (--join-listen: MACHINA_JOIN_LISTEN).
func envName(flag string) string {
	return "MACHINA_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// configEntry is one top-level key of a config file.
type configEntry struct {
	line   int
	values []string // one for a scalar, each item for a sequence
	seq    bool
}

// parseConfig reads a serve config file: a YAML mapping whose keys are
// serve's flag names and whose values are scalars or, for repeatable
// flags, sequences of scalars. Errors name the file and line.
func parseConfig(path string) (map[string]configEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(raw) > maxConfigBytes {
		return nil, fmt.Errorf("config %s: larger than %d bytes", path, maxConfigBytes)
	}
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	out := map[string]configEntry{}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return out, nil // empty file
	}
	root := doc.Content[0]
	if root.Kind == yamlv3.ScalarNode && root.Tag == "!!null" {
		return out, nil
	}
	if root.Kind != yamlv3.MappingNode {
		return nil, fmt.Errorf("%s:%d: want a mapping of serve flag names to values", path, root.Line)
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yamlv3.ScalarNode {
			return nil, fmt.Errorf("%s:%d: a key must be a flag name", path, k.Line)
		}
		if prev, dup := out[k.Value]; dup {
			return nil, fmt.Errorf("%s:%d: key %q repeats line %d", path, k.Line, k.Value, prev.line)
		}
		e := configEntry{line: k.Line}
		switch v.Kind {
		case yamlv3.ScalarNode:
			if v.Tag == "!!null" {
				return nil, fmt.Errorf("%s:%d: key %q has no value", path, k.Line, k.Value)
			}
			e.values = []string{v.Value}
		case yamlv3.SequenceNode:
			e.seq = true
			for _, it := range v.Content {
				if it.Kind != yamlv3.ScalarNode {
					return nil, fmt.Errorf("%s:%d: key %q: want a list of scalars", path, it.Line, k.Value)
				}
				e.values = append(e.values, it.Value)
			}
		default:
			return nil, fmt.Errorf("%s:%d: key %q: want a scalar or a list, not a mapping", path, v.Line, k.Value)
		}
		out[k.Value] = e
	}
	return out, nil
}

// applySources fills every flag of fs not given on the command line from
// its environment variable (envName), else from the config file at path
// (if any), else leaves its default: precedence flag, env, file, default.
// A key in the file that is not a flag of fs (or is one of skip) is an
// error naming the file, line and key; so is a value the flag refuses.
func applySources(fs *pflag.FlagSet, path string, getenv func(string) string, skip ...string) error {
	var cfg map[string]configEntry
	if path != "" {
		var err error
		if cfg, err = parseConfig(path); err != nil {
			return err
		}
	}
	skipped := map[string]bool{"help": true}
	for _, s := range skip {
		skipped[s] = true
	}
	var errs []error
	keys := make([]string, 0, len(cfg))
	for k := range cfg {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return cfg[keys[i]].line < cfg[keys[j]].line })
	for _, k := range keys {
		if fs.Lookup(k) == nil || skipped[k] {
			errs = append(errs, fmt.Errorf("%s:%d: unknown key %q: the keys are machina serve's flag names (machina serve --help)", path, cfg[k].line, k))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || skipped[f.Name] {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
			}
			return
		}
		e, ok := cfg[f.Name]
		if !ok {
			return
		}
		_, repeatable := f.Value.(pflag.SliceValue)
		if e.seq && !repeatable {
			errs = append(errs, fmt.Errorf("%s:%d: key %q takes one value, not a list", path, e.line, f.Name))
			return
		}
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			if err := sv.Replace(e.values); err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: key %q: %w", path, e.line, f.Name, err))
			}
			return
		}
		for _, v := range e.values {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: key %q: %w", path, e.line, f.Name, err))
			}
		}
	})
	return errors.Join(errs...)
}

// effectiveConfig renders fs's flags (but skip) as a config file that
// applySources reads back to the same values: each key with its help as a
// comment; a flag with an empty value is a commented-out key.
func effectiveConfig(fs *pflag.FlagSet, skip ...string) string {
	skipped := map[string]bool{"help": true}
	for _, s := range skip {
		skipped[s] = true
	}
	var sb strings.Builder
	sb.WriteString("# machina serve configuration (machina serve --print-config). Keys are serve's flag names;\n")
	sb.WriteString("# precedence: flag, MACHINA_<FLAG>, this file, default. An unknown key is an error.\n")
	fs.VisitAll(func(f *pflag.Flag) {
		if skipped[f.Name] {
			return
		}
		fmt.Fprintf(&sb, "\n# %s\n", strings.ReplaceAll(f.Usage, "\n", "\n# "))
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			items := sv.GetSlice()
			if len(items) == 0 {
				fmt.Fprintf(&sb, "# %s: []\n", f.Name)
				return
			}
			fmt.Fprintf(&sb, "%s:\n", f.Name)
			for _, it := range items {
				fmt.Fprintf(&sb, "  - %s\n", strconv.Quote(it))
			}
			return
		}
		v := f.Value.String()
		if v == "" {
			fmt.Fprintf(&sb, "# %s: \"\"\n", f.Name)
			return
		}
		fmt.Fprintf(&sb, "%s: %s\n", f.Name, strconv.Quote(v))
	})
	return sb.String()
}
