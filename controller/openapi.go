package controller

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// This file builds the admin API's OpenAPI 3.1 document (api/openapi.json,
// embedded in the binary and served at GET /api/v1/openapi.json) from the
// operation table apiOperations (openapi_ops.go) and the Go wire types the
// handlers encode and decode: every schema under components is reflected
// from a Go type by encoding/json's rules, so the document cannot describe
// a field the server does not send. TestOpenAPIDocumentFresh fails when
// the checked-in file differs from what OpenAPIDocument builds.

// apiOp is one admin route of the document: its ServeMux pattern, the
// role its token needs (checked against api.RouteRoles), what it takes and
// what it answers.
type apiOp struct {
	// Pattern is the route as mounted: "METHOD /path/{wildcard}".
	Pattern string
	// Role is the least admin-token role the route needs.
	Role state.Role
	// ID is the operationId (lowerCamelCase, unique).
	ID string
	// Tag groups the operation in docs/api.md.
	Tag string
	// Summary is one line; Description may be longer (CommonMark).
	Summary, Description string
	// Path describes each {wildcard} of Pattern.
	Path map[string]string
	// Query lists the query parameters.
	Query []apiParam
	// Request is a zero value of the JSON body's Go type; nil: no body.
	Request any
	// Responses are the successful answers, Errors the error statuses
	// (each with a v1.Error body) beyond 401, 403 and 500, which every
	// operation has.
	Responses []apiResp
	Errors    map[int]string
	// Example is a request body shown in docs/api.md (JSON), if any.
	Example string
}

// apiParam is a query parameter: Type is a JSON Schema type (string,
// integer, boolean).
type apiParam struct {
	Name, Type, Description string
}

// apiResp is a successful answer: Body is a zero value of the Go type
// encoded as JSON (nil: no body, unless Media names another media type
// whose body is described by Description alone).
type apiResp struct {
	Status      int
	Description string
	Body        any
	Media       string
}

// schemaSet reflects Go types into JSON Schema (2020-12, as OpenAPI 3.1
// uses) by encoding/json's rules, collecting named struct types as
// components.
type schemaSet struct {
	defs  map[string]any
	names map[reflect.Type]string
	taken map[string]reflect.Type
}

var (
	timeType      = reflect.TypeFor[time.Time]()
	durationType  = reflect.TypeFor[time.Duration]()
	rawType       = reflect.TypeFor[json.RawMessage]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	// biosValuesType encodes as the JSON object of a BIOS's attribute
	// names and values (its MarshalJSON writes what a map[string]any
	// would: string, number, boolean or null values).
	biosValuesType = reflect.TypeFor[state.BIOSValues]()
)

// schema returns the schema of t: a $ref for a named struct, inline
// otherwise. nullable adds "null" to the type (a nil pointer, slice or map
// that encoding/json writes as null).
func (s *schemaSet) schema(t reflect.Type) map[string]any {
	nullable := false
	for t.Kind() == reflect.Pointer {
		t, nullable = t.Elem(), true
	}
	out := s.base(t, &nullable)
	if nullable {
		if ty, ok := out["type"].(string); ok {
			out["type"] = []string{ty, "null"}
		} else if _, ok := out["$ref"]; ok {
			out = map[string]any{"anyOf": []any{out, map[string]any{"type": "null"}}}
		}
	}
	return out
}

func (s *schemaSet) base(t reflect.Type, nullable *bool) map[string]any {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t == rawType:
		return map[string]any{}
	case t == durationType:
		return map[string]any{"type": "integer", "description": "nanoseconds"}
	case t == biosValuesType:
		return map[string]any{"type": "object", "additionalProperties": map[string]any{}, "description": "BIOS attribute name to value (string, number, boolean, or null for a password attribute), as the BMC's Bios resource reports them"}
	case reflect.PointerTo(t).Implements(jsonMarshaler) || t.Implements(jsonMarshaler):
		panic(fmt.Sprintf("openapi: %s has its own MarshalJSON: describe it by hand", t))
	case reflect.PointerTo(t).Implements(textMarshaler) || t.Implements(textMarshaler):
		return map[string]any{"type": "string"}
	}
	switch t.Kind() {
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return map[string]any{"type": "integer"}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer", "minimum": 0}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Interface:
		return map[string]any{}
	case reflect.Slice:
		*nullable = true
		if t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string", "contentEncoding": "base64"}
		}
		return map[string]any{"type": "array", "items": s.schema(t.Elem())}
	case reflect.Array:
		return map[string]any{"type": "array", "items": s.schema(t.Elem()), "minItems": t.Len(), "maxItems": t.Len()}
	case reflect.Map:
		*nullable = true
		return map[string]any{"type": "object", "additionalProperties": s.schema(t.Elem())}
	case reflect.Struct:
		if t.Name() == "" {
			return s.object(t)
		}
		return map[string]any{"$ref": "#/components/schemas/" + s.ref(t)}
	}
	panic(fmt.Sprintf("openapi: no schema for Go type %s", t))
}

// ref names t's component, reflecting it on first use. Two types of one
// name from different packages: the later gets its package's name first.
func (s *schemaSet) ref(t reflect.Type) string {
	if n, ok := s.names[t]; ok {
		return n
	}
	n := t.Name()
	if o, ok := componentNames[t]; ok {
		n = o
	}
	n = string(unicode.ToUpper(rune(n[0]))) + n[1:]
	if other, ok := s.taken[n]; ok && other != t {
		pkg := t.PkgPath()[strings.LastIndex(t.PkgPath(), "/")+1:]
		n = string(unicode.ToUpper(rune(pkg[0]))) + pkg[1:] + n
	}
	s.names[t], s.taken[n] = n, t
	s.defs[n] = nil // reserve: recursive types refer to it while it is built
	s.defs[n] = s.object(t)
	return n
}

// object is a struct's schema: encoding/json's fields (embedded structs'
// promoted, "-" dropped), required unless omitempty or omitzero, and no
// other property (the server's decoders refuse unknown fields, and its
// encoders write none).
func (s *schemaSet) object(t reflect.Type) map[string]any {
	props := map[string]any{}
	var required []string
	s.fields(t, props, &required)
	sort.Strings(required)
	out := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		out["required"] = required
	}
	return out
}

func (s *schemaSet) fields(t reflect.Type, props map[string]any, required *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				s.fields(ft, props, required)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		var fs map[string]any
		if strings.Contains(","+opts+",", ",string,") {
			fs = map[string]any{"type": "string"}
		} else {
			fs = s.schema(f.Type)
		}
		props[name] = fs
		if !strings.Contains(","+opts+",", ",omitempty,") && !strings.Contains(","+opts+",", ",omitzero,") {
			*required = append(*required, name)
		}
	}
}

// forbidden is the 403 body of a route that needs role: v1.Error with
// code "forbidden" and role naming it.
func forbidden(role state.Role) map[string]any {
	return map[string]any{"allOf": []any{
		map[string]any{"$ref": "#/components/schemas/Error"},
		map[string]any{"properties": map[string]any{"code": map[string]any{"const": "forbidden"}, "role": map[string]any{"const": string(role)}},
			"required": []string{"role"}},
	}}
}

// errorDescriptions are the default texts of error statuses.
var errorDescriptions = map[int]string{
	http.StatusBadRequest:            "The request is malformed (code bad_request); the message names the parameter or field.",
	http.StatusUnauthorized:          "No bearer token, or an unknown or revoked one (code unauthorized; WWW-Authenticate: Bearer).",
	http.StatusNotFound:              "No such record (code not_found).",
	http.StatusConflict:              "The request conflicts with the current state (code conflict or as named).",
	http.StatusRequestEntityTooLarge: "The body is larger than 64 KiB (code too_large).",
	http.StatusInternalServerError:   "The controller failed (code internal); details are in its log, never in the answer.",
}

// OpenAPIDocument builds the admin API's OpenAPI 3.1 document from
// apiOperations, indented JSON with a final newline (what api/openapi.json
// holds). Errors: an operation whose Go types cannot be described.
func OpenAPIDocument() (doc []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("controller: openapi document: %v", r)
		}
	}()
	s := &schemaSet{defs: map[string]any{}, names: map[reflect.Type]string{}, taken: map[string]reflect.Type{}}
	errRef := map[string]any{"$ref": "#/components/schemas/" + s.ref(reflect.TypeFor[v1.Error]())}
	paths := map[string]map[string]any{}
	ids := map[string]bool{}
	for _, op := range apiOperations {
		method, path, ok := strings.Cut(op.Pattern, " ")
		if !ok || ids[op.ID] {
			return nil, fmt.Errorf("controller: openapi document: operation %q: bad pattern or repeated id %q", op.Pattern, op.ID)
		}
		ids[op.ID] = true
		o, err := s.operation(op, path, errRef)
		if err != nil {
			return nil, fmt.Errorf("controller: openapi document: %s: %w", op.Pattern, err)
		}
		if paths[path] == nil {
			paths[path] = map[string]any{}
		}
		paths[path][strings.ToLower(method)] = o
	}
	d := map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{
			"title":   "Machina admin API",
			"version": "v1",
			"description": "The admin API of the Machina controller: every route needs `Authorization: Bearer <admin token>` " +
				"(RFC 6750) of a token whose role (viewer < operator < admin) allows the operation's `x-machina-role`. " +
				"Off loopback it is served over TLS only. Errors are JSON objects {\"error\": message, \"code\": code}.",
		},
		"servers": []any{map[string]any{"url": "/"}},
		"tags":    apiTags,
		"paths":   paths,
		"components": map[string]any{
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer",
				"description": "An admin token (machina token, machinactl admin-token create); its role is viewer, operator or admin."}},
			"schemas": s.defs,
		},
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return nil, fmt.Errorf("controller: openapi document: %w", err)
	}
	return buf.Bytes(), nil
}

// operation is op's Operation Object (path is its path without the
// method); errRef is the error body's schema.
func (s *schemaSet) operation(op apiOp, path string, errRef map[string]any) (map[string]any, error) {
	o := map[string]any{
		"operationId": op.ID, "summary": op.Summary, "tags": []string{op.Tag},
		"x-machina-role": string(op.Role),
		"security":       []any{map[string]any{"bearer": []string{}}},
	}
	if op.Description != "" {
		o["description"] = op.Description
	}
	var params []any
	for _, w := range wildcards(path) {
		d, ok := op.Path[w]
		if !ok {
			return nil, fmt.Errorf("path parameter %s has no description", w)
		}
		params = append(params, map[string]any{"name": w, "in": "path", "required": true, "description": d, "schema": map[string]any{"type": "string"}})
	}
	for _, q := range op.Query {
		params = append(params, map[string]any{"name": q.Name, "in": "query", "description": q.Description, "schema": map[string]any{"type": q.Type}})
	}
	if len(params) > 0 {
		o["parameters"] = params
	}
	if op.Request != nil {
		rb := map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{"schema": s.schema(reflect.TypeOf(op.Request))}}}
		if op.Example != "" {
			var ex any
			if err := json.Unmarshal([]byte(op.Example), &ex); err != nil {
				return nil, fmt.Errorf("example: %w", err)
			}
			rb["content"].(map[string]any)["application/json"].(map[string]any)["example"] = ex
		}
		o["requestBody"] = rb
	}
	resps := map[string]any{}
	for _, r := range op.Responses {
		ro := map[string]any{"description": r.Description}
		switch {
		case r.Body != nil:
			ro["content"] = map[string]any{"application/json": map[string]any{"schema": s.schema(reflect.TypeOf(r.Body))}}
		case r.Media == "application/json": // a JSON document of its own (the OpenAPI document)
			ro["content"] = map[string]any{r.Media: map[string]any{"schema": map[string]any{"type": "object", "required": []string{"openapi", "info", "paths"}}}}
		case r.Media != "":
			ro["content"] = map[string]any{r.Media: map[string]any{"schema": map[string]any{"type": "string"}}}
		}
		resps[strconv.Itoa(r.Status)] = ro
	}
	errs := map[int]string{http.StatusUnauthorized: "", http.StatusInternalServerError: ""}
	for c, d := range op.Errors {
		errs[c] = d
	}
	for c, d := range errs {
		if d == "" {
			d = errorDescriptions[c]
		}
		resps[strconv.Itoa(c)] = map[string]any{"description": d, "content": map[string]any{"application/json": map[string]any{"schema": errRef}}}
	}
	if op.Role != state.RoleViewer {
		resps["403"] = map[string]any{
			"description": fmt.Sprintf("The token's role is below %s (code forbidden, role %q; WWW-Authenticate: Bearer error=\"insufficient_scope\").", op.Role, op.Role),
			"content":     map[string]any{"application/json": map[string]any{"schema": forbidden(op.Role)}},
		}
	}
	o["responses"] = resps
	return o, nil
}

// wildcards returns the {names} of a ServeMux path, in order.
func wildcards(path string) []string {
	var out []string
	for _, seg := range strings.Split(path, "/") {
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
			out = append(out, strings.TrimSuffix(strings.TrimPrefix(seg, "{"), "}"))
		}
	}
	return out
}
