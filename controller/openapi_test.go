package controller

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/console"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/state"
)

var updateOpenAPI = flag.Bool("update", false, "rewrite api/openapi.json and docs/api.md from the operation table")

// TestOpenAPIDocumentFresh: api/openapi.json (embedded, served) is what
// OpenAPIDocument builds from the operation table and the Go wire types,
// and docs/api.md is what OpenAPIMarkdown renders from it; -update
// rewrites both.
func TestOpenAPIDocumentFresh(t *testing.T) {
	doc, err := OpenAPIDocument()
	if err != nil {
		t.Fatal(err)
	}
	page, err := OpenAPIMarkdown(doc)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"../api/openapi.json": doc, "../docs/api.md": page}
	for path, want := range files {
		if *updateOpenAPI {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run go test ./controller -run TestOpenAPIDocumentFresh -update", filepath.Clean(path))
		}
	}
	if !bytes.Equal(api.OpenAPI(), doc) && !*updateOpenAPI {
		t.Error("api.OpenAPI() differs from the built document")
	}
}

// openAPIOps returns the document's operations as "METHOD /path" → the
// operation object.
func openAPIOps(t *testing.T, doc []byte) map[string]map[string]any {
	t.Helper()
	var d struct {
		OpenAPI string                               `json:"openapi"`
		Paths   map[string]map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	if d.OpenAPI != "3.1.0" {
		t.Fatalf("openapi = %q, want 3.1.0", d.OpenAPI)
	}
	out := map[string]map[string]any{}
	for path, item := range d.Paths {
		for method, op := range item {
			out[strings.ToUpper(method)+" "+path] = op
		}
	}
	return out
}

// mountAllAdmin mounts every admin route as controller.Run does (the one
// list, adminRoutes, with nil dependencies, and the join stage's
// join.RegisterAdmin) on a fresh api.Server over a fresh state store.
func mountAllAdmin(t *testing.T) (*api.Server, *state.Store) {
	t.Helper()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv, err := api.New(api.Config{Store: st, Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (adminRoutes{branch: "main", trigger: func() {}, heartbeat: time.Minute, gitDir: t.TempDir()}).mount(srv, st); err != nil {
		t.Fatal(err)
	}
	if err := join.RegisterAdmin(srv, nil, api.Actor); err != nil {
		t.Fatal(err)
	}
	return srv, st
}

// TestOpenAPIRoutesMatchServer: the embedded document has an operation
// for every admin route the controller mounts, and none the server lacks.
func TestOpenAPIRoutesMatchServer(t *testing.T) {
	srv, _ := mountAllAdmin(t)
	ops := openAPIOps(t, api.OpenAPI())
	admin := srv.AdminRoutes()
	if len(admin) < 28 {
		t.Fatalf("only %d admin routes mounted: %v", len(admin), admin)
	}
	for _, p := range admin {
		if _, ok := ops[p]; !ok {
			t.Errorf("the server has %s, which the OpenAPI document lacks (add it to apiOperations, controller/openapi_ops.go)", p)
		}
	}
	var documented []string
	for p := range ops {
		documented = append(documented, p)
		if !slices.Contains(admin, p) {
			t.Errorf("the OpenAPI document has %s, which the server does not serve behind an admin token", p)
		}
	}
	sort.Strings(documented)
	t.Logf("%d admin routes, %d documented operations", len(admin), len(documented))
}

// TestOpenAPIRolesMatchTable: each operation's x-machina-role is its
// route's role in api/roles.go, every operation but a viewer's documents
// the 403 naming that role, and every entry of the role table is
// documented but the serial console (a WebSocket upgrade that
// authenticates itself).
func TestOpenAPIRolesMatchTable(t *testing.T) {
	ops := openAPIOps(t, api.OpenAPI())
	table := api.RouteRoles()
	for p, op := range ops {
		want, ok := table[p]
		if !ok {
			t.Errorf("%s: documented, but api/roles.go has no role for it", p)
			continue
		}
		if got := op["x-machina-role"]; got != string(want) {
			t.Errorf("%s: x-machina-role %v, api/roles.go says %s", p, got, want)
		}
		resps, _ := op["responses"].(map[string]any)
		f, has403 := resps["403"].(map[string]any)
		if want == state.RoleViewer {
			if has403 {
				t.Errorf("%s: a viewer's route documents a 403", p)
			}
		} else if !has403 || !strings.Contains(f["description"].(string), string(want)) ||
			!strings.Contains(mustJSON(t, f), `"const":"`+string(want)+`"`) {
			t.Errorf("%s: the 403 does not name role %s: %s", p, want, mustJSON(t, f))
		}
		if _, ok := resps["401"]; !ok {
			t.Errorf("%s: no 401", p)
		}
	}
	for p := range table {
		if _, ok := ops[p]; !ok && p != console.Pattern {
			t.Errorf("api/roles.go has %s, which the OpenAPI document lacks", p)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestOpenAPISchemasFollowGoTypes: a component's properties are the Go
// struct's JSON fields and its required list the fields without
// omitempty/omitzero, for a few wire types checked field by field here
// against encoding/json's own output (so the reflection is tested by the
// standard library, not by itself).
func TestOpenAPISchemasFollowGoTypes(t *testing.T) {
	var d struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]any `json:"properties"`
				Required   []string       `json:"required"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(api.OpenAPI(), &d); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{
		"Server": v1.Server{}, "Event": v1.Event{}, "Error": v1.Error{}, "AdminTokenCreated": v1.AdminTokenCreated{},
		"ScanRequest": v1.ScanRequest{}, "FenceResult": v1.FenceResult{}, "Status": v1.Status{}, "Host": v1.Host{},
	} {
		s, ok := d.Components.Schemas[name]
		if !ok {
			t.Errorf("no component %s", name)
			continue
		}
		// encoding/json writes every field of a zero value but the
		// omitted ones: those are the required properties.
		zero := map[string]any{}
		if err := json.Unmarshal([]byte(mustJSON(t, v)), &zero); err != nil {
			t.Fatal(err)
		}
		full := map[string]any{}
		if err := json.Unmarshal([]byte(mustJSON(t, filled(reflect.TypeOf(v)).Interface())), &full); err != nil {
			t.Fatal(err)
		}
		req := slices.Sorted(mapsKeys(zero))
		if !slices.Equal(req, s.Required) {
			t.Errorf("%s: required %v, encoding/json always writes %v", name, s.Required, req)
		}
		if props := slices.Sorted(mapsKeys(s.Properties)); !slices.Equal(props, slices.Sorted(mapsKeys(full))) {
			t.Errorf("%s: properties %v, encoding/json writes %v", name, props, slices.Sorted(mapsKeys(full)))
		}
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// filled returns a value of t with every field set to a non-zero value
// (so encoding/json writes every property).
func filled(t reflect.Type) reflect.Value {
	v := reflect.New(t).Elem()
	fill(v, 0)
	return v
}

func fill(v reflect.Value, depth int) {
	if depth > 6 {
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), depth+1)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Unix(1, 0).UTC()))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), depth+1)
			}
		}
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0), depth+1)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, depth+1)
		fill(e, depth+1)
		m.SetMapIndex(k, e)
		v.Set(m)
	}
}
