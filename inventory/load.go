package inventory

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/machina-metal/machina/schema"
)

// Limits bound what Load reads, so a hostile or broken revision cannot
// exhaust the controller or a CI runner.
type Limits struct {
	// MaxFileBytes refuses any inventory file larger than this; zero means
	// 16 MiB (an inventory of 10,000 servers is about 3 MiB).
	MaxFileBytes int64
	// MinAliasBudget is how many nodes YAML aliases may add to a document
	// beyond those written, at least; the budget is the larger of this and
	// the written node count. Zero means 10,000.
	MinAliasBudget int
}

func (l Limits) withDefaults() Limits {
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = 16 << 20
	}
	if l.MinAliasBudget <= 0 {
		l.MinAliasBudget = 10000
	}
	return l
}

// Result is a valid revision and the warnings it raised.
type Result struct {
	Inventory *Inventory
	Warnings  []FieldError
}

// fileSpec ties an inventory file to its schema and top-level key.
type fileSpec struct {
	name     string
	kind     schema.Kind
	required bool
}

var fileSpecs = []fileSpec{
	{ServersFile, schema.Servers, true},
	{ProfilesFile, schema.Profiles, false},
	{ImagesFile, schema.Images, false},
	{NetworksFile, schema.Networks, false},
}

// Load reads servers.yaml (required), profiles.yaml, images.yaml and
// networks.yaml (each optional: a missing file means an empty list) at the root of fsys, parses
// them strictly, validates them against the embedded schemas and checks them
// against each other.
//
// A valid revision returns a Result with the normalised Inventory. An
// invalid one returns a nil Result and a *ValidationError listing every
// problem at once, sorted. A file that cannot be read returns another error
// (callers map it to an I/O failure, exit code 2 in machinactl).
func Load(fsys fs.FS, lim Limits) (*Result, error) {
	lim = lim.withDefaults()
	v, err := schema.Default()
	if err != nil {
		return nil, err
	}
	var problems []FieldError
	docs := map[string]*doc{}
	inv := &Inventory{}
	// valid names the files that decoded without an error: cross-file
	// checks run for every pair of valid files, so one broken file does
	// not hide the other files' problems.
	valid := map[string]bool{}
	for _, spec := range fileSpecs {
		data, err := readLimited(fsys, spec.name, lim.MaxFileBytes)
		if errors.Is(err, fs.ErrNotExist) {
			if spec.required {
				problems = append(problems, FieldError{File: spec.name, Msg: "file is missing; the inventory needs a " + spec.name + " at the repository root", Severity: SeverityError})
			} else {
				valid[spec.name] = true // a missing optional file is an empty list
			}
			continue
		}
		var tl *tooLargeError
		if errors.As(err, &tl) {
			problems = append(problems, FieldError{File: spec.name, Msg: tl.Error(), Severity: SeverityError})
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("inventory: read %s: %w", spec.name, err)
		}
		d, errs := loadFile(v, spec, data, lim, inv)
		problems = append(problems, errs...)
		if d != nil {
			docs[spec.name] = d
		}
		valid[spec.name] = d != nil && !hasErrors(errs)
	}
	normalise(inv)
	problems = append(problems, crossCheck(inv, docs, valid)...)
	problems = sortProblems(problems)
	var errs, warns []FieldError
	for _, p := range problems {
		if p.Severity == SeverityWarning {
			warns = append(warns, p)
		} else {
			errs = append(errs, p)
		}
	}
	if len(errs) > 0 {
		return nil, &ValidationError{Errors: errs, Warnings: warns}
	}
	inv.Digest = digest(inv)
	return &Result{Inventory: inv, Warnings: warns}, nil
}

// hasBareTag reports whether data may hold YAML's non-specific tag "!"
// alone, which the node tree does not record (yaml.v3 resolves the scalar as
// if untagged, YAML 1.1 parsers read it as a string), so the file takes the
// general conversion. A "!" that only looks like one (in a quoted string)
// costs that file the slower conversion, nothing else.
func hasBareTag(data []byte) bool {
	for i := bytes.IndexByte(data, '!'); i >= 0; {
		before := i == 0 || strings.IndexByte(" \t\n[{,:-?", data[i-1]) >= 0
		after := i+1 == len(data) || strings.IndexByte(" \t\r\n,]}", data[i+1]) >= 0
		if before && after {
			return true
		}
		j := bytes.IndexByte(data[i+1:], '!')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return false
}

// readLimited reads name, refusing to read more than limit+1 bytes so a
// huge file is measured without being loaded.
func readLimited(fsys fs.FS, name string, limit int64) ([]byte, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return nil, fmt.Errorf("%s is a directory", name)
	}
	if st.Size() > limit {
		return nil, &tooLargeError{size: st.Size(), limit: limit}
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		return nil, &tooLargeError{size: int64(len(b)), limit: limit}
	}
	return b, err
}

// loadFile runs every per-file check and, when they pass, decodes the file
// into inv. It returns the parsed document (for positions) when parsing got
// that far.
func loadFile(v *schema.Validator, spec fileSpec, data []byte, lim Limits, inv *Inventory) (*doc, []FieldError) {
	d, errs := parseYAML(spec.name, data, lim)
	if d == nil {
		return d, errs
	}
	// A document parsed; its only errors so far are duplicate keys (the
	// indexer's). The other checks still run, on a conversion that keeps
	// the last of each duplicate, so one duplicate does not hide the file's
	// other problems; the file is not decoded into inv either way.
	//
	// The YAML 1.1 check and the conversion both only read the node tree:
	// on a machine with a spare core they run side by side.
	var yerrs []FieldError
	var flagged map[string]bool
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		yerrs, flagged = d.checkYAML11(spec.kind)
	}()
	generic, js, ok := any(nil), []byte(nil), false
	if !hasBareTag(d.data) {
		generic, js, ok = convert(d.root)
	}
	<-checked
	errs = append(errs, yerrs...)
	data, d.root, d.data = d.data, nil, nil // the node tree is no longer needed: let it go
	if !ok {
		// Tags, anchors, merge keys and keys YAML 1.1 reads as another
		// type keep sigs.k8s.io/yaml's meaning: convert the text again.
		toJSON := yaml.YAMLToJSONStrict
		if len(errs) > 0 {
			toJSON = yaml.YAMLToJSON
		}
		var err error
		js, err = toJSON(data)
		if err != nil {
			return d, append(errs, syntaxError(spec.name, err)...)
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.UseNumber()
		if err := dec.Decode(&generic); err != nil {
			return d, append(errs, FieldError{File: spec.name, Msg: "decode: " + err.Error(), Severity: SeverityError})
		}
	}
	// The schema check runs beside the decode into the Go types, which is
	// kept only if the file has no errors (a file with errors so far is
	// not decoded at all).
	var viols []schema.Violation
	validated := make(chan struct{})
	go func() {
		defer close(validated)
		viols = v.Validate(spec.kind, generic)
	}()
	var apply func(*Inventory)
	var err error
	if len(errs) == 0 {
		apply, err = decodeTyped(spec.kind, js)
	}
	<-validated
	for _, viol := range viols {
		if flagged[viol.Pointer] {
			continue
		}
		errs = append(errs, d.violationError(spec.kind, viol, generic)...)
	}
	if len(errs) > 0 {
		return d, errs
	}
	if err != nil {
		// The schema and the Go types disagree: a defect, but reported, not panicked.
		return d, append(errs, FieldError{File: spec.name, Msg: "decode: " + err.Error(), Severity: SeverityError})
	}
	apply(inv)
	return d, errs
}

// decodeTyped decodes a file's JSON text strictly into its Go types and
// returns the function that stores them into an Inventory.
func decodeTyped(kind schema.Kind, js []byte) (func(*Inventory), error) {
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	switch kind {
	case schema.Servers:
		var f struct {
			Servers []Server `json:"servers"`
		}
		err := dec.Decode(&f)
		return func(inv *Inventory) { inv.Servers = f.Servers }, err
	case schema.Profiles:
		var f struct {
			Profiles []Profile `json:"profiles"`
		}
		err := dec.Decode(&f)
		return func(inv *Inventory) { inv.Profiles = f.Profiles }, err
	case schema.Images:
		var f struct {
			Images   []Image         `json:"images"`
			Firmware []FirmwareImage `json:"firmware"`
		}
		err := dec.Decode(&f)
		return func(inv *Inventory) { inv.Images, inv.FirmwareImages = f.Images, f.Firmware }, err
	case schema.Networks:
		var f struct {
			Subnets []Subnet `json:"subnets"`
		}
		err := dec.Decode(&f)
		return func(inv *Inventory) { inv.Subnets = f.Subnets }, err
	}
	return func(*Inventory) {}, nil
}

// violationError turns a schema violation into located messages. Values are
// repeated only where they cannot be a secret.
func (d *doc) violationError(kind schema.Kind, viol schema.Violation, generic any) []FieldError {
	switch viol.Keyword {
	case "additionalProperties":
		var out []FieldError
		known := expectAt(kind, viol.Pointer).props
		for _, f := range viol.Fields {
			child := viol.Pointer + "/" + escapePointer(f)
			msg := fmt.Sprintf("unknown field %q", f)
			if hint := fieldHint(viol.Pointer, f, known); hint != "" {
				msg += " " + hint
			}
			fe := d.errAt(d.keyAt(child), viol.Pointer, msg)
			out = append(out, fe)
		}
		return out
	case "required":
		var out []FieldError
		for _, f := range viol.Fields {
			out = append(out, d.errAt(d.at(viol.Pointer), viol.Pointer, fmt.Sprintf("missing required field %q", f)))
		}
		return out
	case "pattern", "format":
		val, _ := lookup(generic, viol.Pointer).(string)
		var msg string
		switch {
		case strings.Contains(val, "PRIVATE KEY"):
			msg = "holds a private key (value not shown); only public keys belong in the inventory, and this key must now be considered leaked"
		case viol.Def == "credentialName" || sensitivePointer(viol.Pointer):
			msg = "value not shown: " + viol.Detail
		case strings.Contains(val, "@") && (viol.Def == "httpURL" || viol.Def == "hostPort"):
			msg = "value not shown: an address must not carry user:password@; put credentials in the controller's secret store and name them in bmc.credentials"
		default:
			msg = fmt.Sprintf("%q %s", val, viol.Detail)
		}
		return []FieldError{d.errAt(d.at(viol.Pointer), viol.Pointer, msg)}
	}
	return []FieldError{d.errAt(d.at(viol.Pointer), viol.Pointer, viol.Detail)}
}

// fieldHint suggests the known field an unknown one was probably meant to be.
func fieldHint(pointer, field string, known []string) string {
	if strings.HasSuffix(pointer, "/rootDevice") && (field == "name" || field == "device" || field == "path") {
		return "(kernel names such as /dev/sda change between boots; use serial, wwn or byPath)"
	}
	if strings.EqualFold(field, "password") || strings.EqualFold(field, "username") || strings.EqualFold(field, "user") {
		return "(credentials live in the controller's secret store: `machinactl secret set NAME`; name them in bmc.credentials)"
	}
	sort.Strings(known)
	for _, k := range known {
		if strings.EqualFold(k, field) {
			return fmt.Sprintf("(did you mean %q?)", k)
		}
	}
	return ""
}

// lookup returns the value at an RFC 6901 pointer in a decoded JSON document.
func lookup(v any, pointer string) any {
	if pointer == "" {
		return v
	}
	for _, seg := range strings.Split(pointer[1:], "/") {
		seg = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
		switch t := v.(type) {
		case map[string]any:
			v = t[seg]
		case []any:
			var i int
			if _, err := fmt.Sscanf(seg, "%d", &i); err != nil || i < 0 || i >= len(t) {
				return nil
			}
			v = t[i]
		default:
			return nil
		}
	}
	return v
}

func hasErrors(p []FieldError) bool {
	for _, e := range p {
		if e.Severity != SeverityWarning {
			return true
		}
	}
	return false
}

// digest hashes the canonical JSON of the normalised lists.
func digest(inv *Inventory) string {
	b, err := json.Marshal(inv)
	if err != nil {
		panic("inventory: marshal for digest: " + err.Error()) // plain structs: cannot fail
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// tooLargeError is a file over Limits.MaxFileBytes.
type tooLargeError struct{ size, limit int64 }

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("file is %d bytes, over the limit of %d bytes; split the inventory or raise --max-file-size", e.size, e.limit)
}
