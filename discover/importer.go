package discover

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing/fstest"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/macaddr"
)

// Columns are the import columns, in documentation order. CSV files need a
// header row naming some of them (any order); JSON files are an array of
// objects with these keys (string values; tags may be an array). tags in
// CSV are separated by ';' or spaces. Required: name, zone, bmc_driver,
// bmc_address, credentials, boot_mac.
var Columns = []string{"name", "zone", "bmc_driver", "bmc_address", "credentials", "boot_mac", "boot_mode", "site", "rack", "tags"}

var requiredColumns = []string{"name", "zone", "bmc_driver", "bmc_address", "credentials", "boot_mac"}

// ErrImportFormat reports an import file that cannot be read as rows at all
// (unknown extension, bad header, malformed CSV or JSON).
var ErrImportFormat = errors.New("discover: import format")

// MaxImportRows bounds the rows of one import file.
const MaxImportRows = 10000

// Row is one input row with the line it starts on (1-based).
type Row struct {
	Line   int
	Fields map[string]string
}

// ImportReport is what an import added, skipped and refused.
type ImportReport struct {
	Added   []Skip `json:"added"`   // Key is the server name, Reason empty
	Skipped []Skip `json:"skipped"` // already in servers.yaml or earlier in the file
	Invalid []Skip `json:"invalid"` // the row is not a valid server
}

// ParseRows reads name's rows by its extension: .csv (RFC 4180, header
// row) or .json (an array of objects). Unknown columns or keys are an
// error wrapping ErrImportFormat, so a typo never drops a field silently.
func ParseRows(name string, data []byte) ([]Row, error) {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".csv":
		return parseCSV(data)
	case ".json":
		return parseJSON(data)
	}
	return nil, fmt.Errorf("%w: %s: want a .csv or .json file", ErrImportFormat, name)
}

func checkColumns(cols []string) error {
	seen := map[string]bool{}
	for _, c := range cols {
		if !slices.Contains(Columns, c) {
			return fmt.Errorf("%w: unknown column %q (columns: %s)", ErrImportFormat, c, strings.Join(Columns, ", "))
		}
		if seen[c] {
			return fmt.Errorf("%w: column %q given twice", ErrImportFormat, c)
		}
		seen[c] = true
	}
	return nil
}

func parseCSV(data []byte) ([]Row, error) {
	r := csv.NewReader(bytes.NewReader(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))))
	r.FieldsPerRecord = -1
	r.Comment = '#'
	head, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("%w: csv header: %w", ErrImportFormat, err)
	}
	for i := range head {
		head[i] = strings.ToLower(strings.TrimSpace(head[i]))
	}
	if err := checkColumns(head); err != nil {
		return nil, err
	}
	var rows []Row
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			return rows, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: csv: %w", ErrImportFormat, err)
		}
		line, _ := r.FieldPos(0)
		if len(rows) >= MaxImportRows {
			return nil, fmt.Errorf("%w: more than %d rows", ErrImportFormat, MaxImportRows)
		}
		row := Row{Line: line, Fields: map[string]string{}}
		if len(rec) != len(head) {
			row.Fields["\x00"] = fmt.Sprintf("%d fields, the header has %d", len(rec), len(head))
		}
		for i, v := range rec {
			if i < len(head) {
				row.Fields[head[i]] = strings.TrimSpace(v)
			}
		}
		rows = append(rows, row)
	}
}

func parseJSON(data []byte) ([]Row, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	lineAt := func(off int64) int { return 1 + bytes.Count(data[:off], []byte("\n")) }
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return nil, fmt.Errorf("%w: json: want an array of objects", ErrImportFormat)
	}
	var rows []Row
	for dec.More() {
		off := dec.InputOffset()
		// Skip whitespace to the object's first byte for its line.
		for off < int64(len(data)) && strings.ContainsRune(" \t\r\n,", rune(data[off])) {
			off++
		}
		obj, err := decodeObject(dec)
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return nil, fmt.Errorf("%w: json line %d: %w", ErrImportFormat, lineAt(min(off, int64(len(data)))), err)
		}
		if len(rows) >= MaxImportRows {
			return nil, fmt.Errorf("%w: more than %d rows", ErrImportFormat, MaxImportRows)
		}
		row := Row{Line: lineAt(off), Fields: map[string]string{}}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		if err := checkColumns(keys); err != nil {
			return nil, fmt.Errorf("json line %d: %w", row.Line, err)
		}
		for k, v := range obj {
			switch v := v.(type) {
			case string:
				if k == "tags" {
					row.Fields["\x00"] = "tags must be an array of strings"
					continue
				}
				row.Fields[k] = strings.TrimSpace(v)
			case []any:
				if k != "tags" {
					row.Fields["\x00"] = k + " must be a string"
					continue
				}
				var ts []string
				for _, t := range v {
					s, ok := t.(string)
					if !ok {
						row.Fields["\x00"] = "tags must be strings"
					}
					ts = append(ts, s)
				}
				row.Fields[k] = strings.Join(ts, ";")
			case nil:
			default:
				row.Fields["\x00"] = k + " must be a string"
			}
		}
		rows = append(rows, row)
	}
	if _, err := dec.Token(); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("%w: json line %d: %w", ErrImportFormat, lineAt(min(dec.InputOffset(), int64(len(data)))), err)
	}
	return rows, nil
}

// decodeObject reads one JSON object from dec key by key, refusing a key
// given twice (encoding/json keeps the last one silently, so a row with
// "zone" twice would import whichever came last).
func decodeObject(dec *json.Decoder) (map[string]any, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if t != json.Delim('{') {
		return nil, fmt.Errorf("want an object, got %v", t)
	}
	obj := map[string]any{}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, _ := kt.(string)
		if _, dup := obj[k]; dup {
			return nil, fmt.Errorf("key %q given twice", k)
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		obj[k] = v
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, err
	}
	return obj, nil
}

// entry builds the row's entry, or says why it is not one.
func (r Row) entry() (Entry, string) {
	if msg, ok := r.Fields["\x00"]; ok {
		return Entry{}, msg
	}
	var missing []string
	for _, c := range requiredColumns {
		if r.Fields[c] == "" {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return Entry{}, "missing " + strings.Join(missing, ", ")
	}
	mac, err := macaddr.Normalize(strings.TrimSpace(r.Fields["boot_mac"]))
	if err != nil {
		return Entry{}, "boot_mac is not a MAC address"
	}
	var tags []string
	for _, t := range strings.FieldsFunc(r.Fields["tags"], func(c rune) bool { return c == ';' || c == ' ' }) {
		if !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	e := Entry{Name: r.Fields["name"], Zone: r.Fields["zone"], Site: r.Fields["site"], Rack: r.Fields["rack"], Tags: tags,
		BootMAC: mac, BootMode: strings.ToLower(r.Fields["boot_mode"]),
		BMC: inventory.BMC{Driver: inventory.BMCDriver(strings.ToLower(r.Fields["bmc_driver"])), Address: r.Fields["bmc_address"], Credentials: r.Fields["credentials"]}}
	// The row alone must be a valid servers.yaml: the schema and the
	// per-server checks give the exact reason.
	one, _ := AppendEntries(nil, []Entry{e})
	if _, err := inventory.Load(fstest.MapFS{inventory.ServersFile: {Data: one}}, inventory.Limits{}); err != nil {
		var ve *inventory.ValidationError
		if errors.As(err, &ve) && len(ve.Errors) > 0 {
			var msgs []string
			for _, fe := range ve.Errors {
				field := strings.TrimPrefix(strings.TrimPrefix(fe.Path, "servers[0]"), ".")
				if field != "" {
					msgs = append(msgs, field+": "+fe.Msg)
				} else {
					msgs = append(msgs, fe.Msg)
				}
			}
			return Entry{}, strings.Join(msgs, "; ")
		}
		return Entry{}, err.Error()
	}
	return e, ""
}

// Import appends rows to servers (the raw servers.yaml whose validated
// inventory is inv). A row that is not a valid server is Invalid; one whose
// name, boot MAC or BMC address (normalised) is already in inv or earlier
// in the file is Skipped; the rest are appended in file order. The caller
// validates the result in its repository ([Validate] or [Commit]) before
// writing it.
func Import(servers []byte, inv *inventory.Inventory, rows []Row) ([]byte, *ImportReport, error) {
	ix := newIndex(inv)
	rep := &ImportReport{Added: []Skip{}, Skipped: []Skip{}, Invalid: []Skip{}}
	var es []Entry
	for _, r := range rows {
		e, why := r.entry()
		if why != "" {
			rep.Invalid = append(rep.Invalid, Skip{Line: r.Line, Key: r.Fields["name"], Reason: why})
			continue
		}
		if why := ix.clash(e.Name, e.BootMAC, e.BMC.Driver, e.BMC.Address); why != "" {
			rep.Skipped = append(rep.Skipped, Skip{Line: r.Line, Key: e.Name, Reason: why})
			continue
		}
		ix.add(e.Name, e.BootMAC, e.BMC.Driver, e.BMC.Address)
		es = append(es, e)
		rep.Added = append(rep.Added, Skip{Line: r.Line, Key: e.Name})
	}
	out, err := AppendEntries(servers, es)
	if err != nil {
		return nil, nil, err
	}
	return out, rep, nil
}

// WriteImportReport writes one "FILE:LINE: added|skipped|invalid NAME[:
// reason]" line per row in input order, then a summary.
func WriteImportReport(w io.Writer, file string, rep *ImportReport) error {
	type line struct {
		s    Skip
		verb string
	}
	var ls []line
	for _, s := range rep.Added {
		ls = append(ls, line{s, "added"})
	}
	for _, s := range rep.Skipped {
		ls = append(ls, line{s, "skipped"})
	}
	for _, s := range rep.Invalid {
		ls = append(ls, line{s, "invalid"})
	}
	slices.SortStableFunc(ls, func(a, b line) int { return a.s.Line - b.s.Line })
	for _, l := range ls {
		key := l.s.Key
		if key == "" {
			key = "(no name)"
		}
		if l.s.Reason == "" {
			fmt.Fprintf(w, "%s:%d: %s %s\n", file, l.s.Line, l.verb, key)
		} else {
			fmt.Fprintf(w, "%s:%d: %s %s: %s\n", file, l.s.Line, l.verb, key, l.s.Reason)
		}
	}
	_, err := fmt.Fprintf(w, "%d added, %d skipped, %d invalid\n", len(rep.Added), len(rep.Skipped), len(rep.Invalid))
	return err
}
