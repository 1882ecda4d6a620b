package inventory

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/machina-metal/machina/namerule"
)

// Labels are key/value pairs that profiles select servers by,
// with the syntax and limits of Kubernetes labels (Kubernetes "Labels and
// Selectors": an optional DNS-subdomain prefix of at most 253 characters
// and "/", a name of at most 63 characters of letters, digits, '-', '_'
// and '.', starting and ending with a letter or digit; a value empty or
// the same form as a name, at most 63 characters).
//
// A server's labels come from three places:
//   - stated: servers.yaml `labels`;
//   - tags: each `tags` entry NAME is the label TagLabelPrefix+NAME with
//     the value "true" (tags stay a compatible alias, nothing to migrate);
//   - derived: written from the commissioning report (DerivedLabelKeys),
//     known only once a server has been commissioned.
//
// Stated labels may use neither a derived key nor the tag prefix, so the
// three never collide.

// TagLabelPrefix is the key prefix a tag maps to: tag "nvme" is the label
// "tag.nvme": "true".
const TagLabelPrefix = "tag."

// Derived label keys, written from the commissioning report (see
// state.Hardware.Labels, which computes them).
const (
	LabelCPUVendor     = "cpu.vendor"      // intel, amd, arm, or the lower-cased vendor_id
	LabelCPUArch       = "cpu.arch"        // amd64, arm64, ... (GOARCH names)
	LabelMemoryGiB     = "memory.gib"      // installed memory in GiB (DIMM total, else MemTotal rounded)
	LabelDiskNVMeCount = "disk.nvme.count" // number of NVMe disks
	LabelNICSpeedMax   = "nic.speed.max"   // fastest NIC link speed in Mbps
	LabelGPUVendor     = "gpu.vendor"      // nvidia, amd, intel; absent when the machine has no GPU
)

// DerivedLabelKeys lists the derived label keys, sorted.
var DerivedLabelKeys = []string{LabelCPUArch, LabelCPUVendor, LabelDiskNVMeCount, LabelGPUVendor, LabelMemoryGiB, LabelNICSpeedMax}

// IsDerivedLabel reports whether key is written from the commissioning report.
func IsDerivedLabel(key string) bool { return slices.Contains(DerivedLabelKeys, key) }

var (
	dnsSubdomainE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// CheckLabelKey returns nil if key is a valid label key, or an error saying
// which rule it breaks.
func CheckLabelKey(key string) error {
	name := key
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		prefix := key[:i]
		name = key[i+1:]
		if prefix == "" || len(prefix) > 253 || !dnsSubdomainE.MatchString(prefix) {
			return fmt.Errorf("label key %q: prefix %q must be a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253 characters)", key, prefix)
		}
	}
	if name == "" || !namerule.LabelValue.Valid(name) { // the one definition (namerule)
		return fmt.Errorf("label key %q: name %q must be 1-63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit", key, name)
	}
	return nil
}

// CheckLabelValue returns nil if v is a valid label value (empty, or at
// most 63 characters of letters, digits, '-', '_' and '.', starting and
// ending with a letter or digit).
func CheckLabelValue(v string) error {
	if v == "" {
		return nil
	}
	if !namerule.LabelValue.Valid(v) {
		return fmt.Errorf("label value %q must be at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit", v)
	}
	return nil
}

// StatedLabels returns the labels servers.yaml gives s: its labels plus
// one TagLabelPrefix+tag: "true" per tag. The map is new.
func StatedLabels(s *Server) map[string]string {
	out := make(map[string]string, len(s.Labels)+len(s.Tags))
	for k, v := range s.Labels {
		out[k] = v
	}
	for _, t := range s.Tags {
		out[TagLabelPrefix+t] = "true"
	}
	return out
}

// Selector operators (Kubernetes LabelSelectorRequirement operators, plus
// Gt and Lt from node affinity, comparing integer values).
const (
	OpIn           = "In"
	OpNotIn        = "NotIn"
	OpExists       = "Exists"
	OpDoesNotExist = "DoesNotExist"
	OpGt           = "Gt"
	OpLt           = "Lt"
)

// Selector chooses servers by label, as a Kubernetes LabelSelector: every
// MatchLabels pair and every MatchExpressions requirement must hold. The
// zero Selector matches every server.
type Selector struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty"`
	MatchExpressions []Requirement     `json:"matchExpressions,omitempty"`
}

// Requirement is one selector expression. In and NotIn take one or more
// Values; Exists and DoesNotExist none; Gt and Lt exactly one integer,
// compared with the label's value read as an integer (a label that is
// absent or not an integer fails Gt and Lt).
type Requirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// String renders r as "key In (a,b)", "key Exists", "key Gt 64".
func (r Requirement) String() string {
	switch r.Operator {
	case OpExists, OpDoesNotExist:
		return r.Key + " " + r.Operator
	case OpIn, OpNotIn:
		return r.Key + " " + r.Operator + " (" + strings.Join(r.Values, ",") + ")"
	}
	return r.Key + " " + r.Operator + " " + strings.Join(r.Values, ",")
}

// requirements returns MatchLabels as In requirements (sorted by key)
// followed by MatchExpressions.
func (s *Selector) requirements() []Requirement {
	if s == nil {
		return nil
	}
	keys := make([]string, 0, len(s.MatchLabels))
	for k := range s.MatchLabels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]Requirement, 0, len(keys)+len(s.MatchExpressions))
	for _, k := range keys {
		out = append(out, Requirement{Key: k, Operator: OpIn, Values: []string{s.MatchLabels[k]}})
	}
	return append(out, s.MatchExpressions...)
}

// Matches reports whether labels satisfy every requirement of s. A nil
// Selector matches everything.
func (s *Selector) Matches(labels map[string]string) bool {
	ok, _ := s.Explain(labels)
	return ok
}

// Explain is Matches with the reason a server does not match: the first
// failing requirement and the value the server has ("gpu.vendor In
// (nvidia): has none", "memory.gib Gt 64: has 32").
func (s *Selector) Explain(labels map[string]string) (bool, string) {
	for _, r := range s.requirements() {
		if ok, have := r.holds(labels); !ok {
			return false, r.String() + ": " + have
		}
	}
	return true, ""
}

func (r Requirement) holds(labels map[string]string) (bool, string) {
	v, present := labels[r.Key]
	have := "has none"
	if present {
		have = fmt.Sprintf("has %q", v)
	}
	switch r.Operator {
	case OpIn:
		return present && slices.Contains(r.Values, v), have
	case OpNotIn:
		return !present || !slices.Contains(r.Values, v), have
	case OpExists:
		return present, have
	case OpDoesNotExist:
		return !present, have
	case OpGt, OpLt:
		if !present || len(r.Values) != 1 {
			return false, have
		}
		n, err1 := strconv.ParseInt(v, 10, 64)
		want, err2 := strconv.ParseInt(r.Values[0], 10, 64)
		if err1 != nil || err2 != nil {
			return false, have + " (not an integer)"
		}
		if r.Operator == OpGt {
			return n > want, have
		}
		return n < want, have
	}
	return false, "unknown operator " + r.Operator
}

// CouldMatch reports whether a server with these stated labels (servers.yaml
// labels and tags) can ever match s: requirements on derived keys count as
// satisfiable, since those labels are only known after commissioning.
// When it cannot, why names the requirement no stated label satisfies.
func (s *Selector) CouldMatch(stated map[string]string) (bool, string) {
	for _, r := range s.requirements() {
		if IsDerivedLabel(r.Key) {
			continue
		}
		if ok, have := r.holds(stated); !ok {
			return false, r.String() + ": " + have
		}
	}
	return true, ""
}

// checkSelector returns the problems of s's syntax: keys and values
// (label rules), each operator's number of values, integer values for Gt
// and Lt. ptr is the selector's JSON pointer.
func checkSelector(s *Selector, ptr string) []struct{ ptr, msg string } {
	var out []struct{ ptr, msg string }
	add := func(p, m string) { out = append(out, struct{ ptr, msg string }{p, m}) }
	for k, v := range s.MatchLabels {
		p := ptr + "/matchLabels/" + escapePointer(k)
		if err := CheckLabelKey(k); err != nil {
			add(p, err.Error())
		}
		if err := CheckLabelValue(v); err != nil {
			add(p, err.Error())
		}
	}
	for i, r := range s.MatchExpressions {
		p := ptr + "/matchExpressions/" + strconv.Itoa(i)
		if err := CheckLabelKey(r.Key); err != nil {
			add(p+"/key", err.Error())
		}
		switch r.Operator {
		case OpIn, OpNotIn:
			if len(r.Values) == 0 {
				add(p+"/values", r.Operator+" needs at least one value")
			}
		case OpExists, OpDoesNotExist:
			if len(r.Values) > 0 {
				add(p+"/values", r.Operator+" takes no values")
			}
		case OpGt, OpLt:
			if len(r.Values) != 1 {
				add(p+"/values", r.Operator+" takes exactly one integer value")
			} else if _, err := strconv.ParseInt(r.Values[0], 10, 64); err != nil {
				add(p+"/values/0", fmt.Sprintf("%s needs an integer, not %q", r.Operator, r.Values[0]))
			}
		}
		for j, v := range r.Values {
			if err := CheckLabelValue(v); err != nil {
				add(p+"/values/"+strconv.Itoa(j), err.Error())
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ptr < out[j].ptr })
	return out
}
