package redfish

import (
	"strings"

	"github.com/machina-metal/machina/macaddr"
)

// Tolerant accessors over decoded JSON. A value of the wrong type (a string
// "N/A" where a number belongs, a number where a string belongs, an empty
// string for a number) reads as unknown (ok=false); nothing here panics.

// obj returns m[k] as an object.
func obj(m map[string]any, k string) map[string]any {
	v, _ := m[k].(map[string]any)
	return v
}

// str returns m[k] when it is a string.
func str(m map[string]any, k string) (string, bool) {
	v, ok := m[k].(string)
	return v, ok
}

// strv returns m[k] as a string, "" when absent or not a string.
func strv(m map[string]any, k string) string { v, _ := str(m, k); return v }

// num returns m[k] when it is a JSON number.
func num(m map[string]any, k string) (float64, bool) {
	v, ok := m[k].(float64)
	return v, ok
}

// boolv returns m[k] when it is a boolean.
func boolv(m map[string]any, k string) (bool, bool) {
	v, ok := m[k].(bool)
	return v, ok
}

// strList returns the string members of m[k]; ok is false when m[k] is not
// an array. Non-string members are skipped.
func strList(m map[string]any, k string) ([]string, bool) {
	a, ok := m[k].([]any)
	if !ok {
		return nil, false
	}
	out := []string{}
	for _, e := range a {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out, true
}

// link returns m[k]["@odata.id"].
func link(m map[string]any, k string) string { return strv(obj(m, k), "@odata.id") }

// members returns the @odata.id of every member of a collection.
func members(m map[string]any) []string {
	a, _ := m["Members"].([]any)
	var out []string
	for _, e := range a {
		if mm, ok := e.(map[string]any); ok {
			if id := strv(mm, "@odata.id"); id != "" {
				out = append(out, id)
			}
		}
	}
	return out
}

// normMAC returns s in lower-case colon form, or "" if s is not a MAC.
func normMAC(s string) string {
	m, err := macaddr.Parse(strings.TrimSpace(s))
	if err != nil {
		return ""
	}
	return m.String()
}

// normETag strips a weak prefix, quotes and a "-gzip" suffix (added by
// mod_deflate in front of some BMC web servers) and re-quotes.
func normETag(e string) string {
	e = strings.TrimSpace(e)
	e = strings.TrimPrefix(e, "W/")
	e = strings.Trim(e, `"`)
	e = strings.TrimSuffix(e, "-gzip")
	if e == "" {
		return ""
	}
	return `"` + e + `"`
}
