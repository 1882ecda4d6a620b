package controller

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// apiPageIntro opens docs/api.md: what the document cannot say itself.
const apiPageIntro = `# Admin API

<!-- Generated from api/openapi.json by controller.OpenAPIMarkdown; do not edit.
     Rewrite with: go test ./controller -run TestOpenAPIDocumentFresh -update -->

The controller's admin API is described by an OpenAPI 3.1 document, built into the binary and
served at ` + "`GET /api/v1/openapi.json`" + ` (any admin token: role viewer). ` + "`machina openapi`" + ` writes it to
standard output (` + "`machina openapi --markdown`" + ` writes this page). This page is generated from
the document; the document is generated from the Go wire types (api/v1 and the controller's
answers) and the operation table in controller/openapi_ops.go.

## Authentication

Every route needs ` + "`Authorization: Bearer <admin token>`" + ` (RFC 6750). Off loopback the admin API is
served over TLS only: the plain HTTP listener that machines use answers every admin route 403
with code ` + "`tls_required`" + ` and the TLS URL. Create the first token with ` + "`machina token`" + ` on the
controller's host, later ones with ` + "`machinactl admin-token create NAME --role ROLE`" + ` or
` + "`POST /api/v1/admin-tokens`" + `.

## Roles

A token has one role: **viewer** reads (servers, events, plan, inventory, images, hosts, this
document); **operator** also moves servers through their lifecycle, provisions, approves held
plans, fences and unfences hosts, opens serial consoles and asks for a reconcile; **admin** also
manages secrets and tokens, issues enrolment tokens, scans BMC subnets and takes state
snapshots. Each operation's role is its ` + "`x-machina-role`" + ` in the document, the same as the
one table in api/roles.go (a test fails when they differ). The serial console,
` + "`GET /api/v1/servers/{name}/console`" + ` (operator), is a WebSocket upgrade that authenticates
itself and is not part of the document.

## Errors

Every error is a JSON object:

` + "```json" + `
{"error": "this request needs an admin token with role operator; token grafana has role viewer",
 "code": "forbidden", "role": "operator"}
` + "```" + `

` + "`code`" + ` is stable (bad_request, unauthorized, forbidden, tls_required, not_found,
method_not_allowed, conflict, too_large, internal, unavailable, and the route-specific codes
below); ` + "`error`" + ` is for people. A 401 carries ` + "`WWW-Authenticate: Bearer`" + `; a 403 for a role
carries ` + "`error=\"insufficient_scope\"`" + ` and names the role needed in ` + "`role`" + `. A 409 of a lifecycle
move names the server's current state in ` + "`lifecycle`" + `. Answers are never cached
(` + "`Cache-Control: no-store`" + `).

## Examples

` + "```sh" + `
export TOKEN=...   # an admin token
curl -sS -H "Authorization: Bearer $TOKEN" https://controller:8444/api/v1/servers?lifecycle=ready
curl -sS -H "Authorization: Bearer $TOKEN" -X POST -d '{"profile":"web","count":2}' \
  https://controller:8444/api/v1/provision
curl -sS -H "Authorization: Bearer $TOKEN" https://controller:8444/api/v1/openapi.json > machina.json
` + "```" + `

## Adding a route

1. Mount it (` + "`api.Server.HandleAdmin`" + `) and give it its role in api/roles.go (and the role table
   of docs/operations.md).
2. Add its entry to ` + "`apiOperations`" + ` in controller/openapi_ops.go: pattern, role, summary,
   parameters, the Go types of its request and answers, its error statuses.
3. Run ` + "`go test ./controller -run TestOpenAPIDocumentFresh -update`" + `: it rewrites api/openapi.json
   and this page.
4. Drive it in TestOpenAPIRoundTrip (lab/sim/e2e_openapi_test.go) to a success: the test runs the
   whole controller in-process against the simulated lab and validates every real request and
   answer against the document.

TestOpenAPIRoutesMatchServer fails while a mounted admin route is missing from the document (or
the document has one the server lacks), TestOpenAPIRolesMatchTable while a role differs from
api/roles.go, TestOpenAPIDocumentFresh while api/openapi.json or this page is stale, and
TestOpenAPIRoundTrip while a route was not driven to a success or a request or answer does not
match the document.

## Validator

The round trip validates with github.com/pb33f/libopenapi-validator. It was written for OpenAPI
3.1 (3.0 and 3.2 too): its schemas are JSON Schema 2020-12, checked by a fork of
santhosh-tekuri/jsonschema (the validator Machina already uses for the inventory), so type arrays
with "null", const and additionalProperties mean what the document says; it validates a request
(path, query, security, body) and its answer (status declared, media type, body) in one call,
and rejects an undeclared status. kin-openapi's 3.1 support is recent (added in 2026) and built
on its OpenAPI 3.0 model; for a document that is 3.1 from the start the validator made for 3.1
was the safer choice.
`

// OpenAPIMarkdown renders docs/api.md from the OpenAPI document doc (as
// OpenAPIDocument builds it): the fixed introduction, then each tag's
// operations (role, parameters, request, answers) and the schemas.
// Errors: doc is not such a document.
func OpenAPIMarkdown(doc []byte) ([]byte, error) {
	var d struct {
		Tags []struct {
			Name, Description string
		}
		Paths      map[string]map[string]mdOp
		Components struct {
			Schemas map[string]map[string]any
		}
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, fmt.Errorf("controller: openapi markdown: %w", err)
	}
	var b strings.Builder
	b.WriteString(apiPageIntro)
	type entry struct {
		method, path string
		op           mdOp
	}
	byTag := map[string][]entry{}
	for path, item := range d.Paths {
		for method, op := range item {
			for _, t := range op.Tags {
				byTag[t] = append(byTag[t], entry{strings.ToUpper(method), path, op})
			}
		}
	}
	b.WriteString("\n## Routes\n\n| Route | Role | Summary |\n|---|---|---|\n")
	for _, t := range d.Tags {
		es := byTag[t.Name]
		sort.Slice(es, func(i, j int) bool { return es[i].path+" "+es[i].method < es[j].path+" "+es[j].method })
		byTag[t.Name] = es
		for _, e := range es {
			fmt.Fprintf(&b, "| [`%s %s`](#%s) | %s | %s |\n", e.method, e.path, strings.ToLower(e.op.OperationID), e.op.Role, cell(e.op.Summary))
		}
	}
	for _, t := range d.Tags {
		fmt.Fprintf(&b, "\n## %s\n\n%s\n", strings.ToUpper(t.Name[:1])+t.Name[1:], t.Description)
		for _, e := range byTag[t.Name] {
			writeMDOp(&b, e.method, e.path, e.op)
		}
	}
	b.WriteString("\n## Schemas\n\nEvery object refuses properties it does not list. A type ending in `|null` may be null.\n")
	names := make([]string, 0, len(d.Components.Schemas))
	for n := range d.Components.Schemas {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s := d.Components.Schemas[n]
		fmt.Fprintf(&b, "\n### %s (schema)\n\n| Property | Type | Required |\n|---|---|---|\n", n)
		props, _ := s["properties"].(map[string]any)
		req := map[string]bool{}
		if rs, ok := s["required"].([]any); ok {
			for _, r := range rs {
				req[r.(string)] = true
			}
		}
		pn := make([]string, 0, len(props))
		for p := range props {
			pn = append(pn, p)
		}
		sort.Strings(pn)
		for _, p := range pn {
			r := ""
			if req[p] {
				r = "yes"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", p, typeText(props[p]), r)
		}
	}
	return []byte(b.String()), nil
}

// mdOp is the part of an operation the page shows.
type mdOp struct {
	OperationID string `json:"operationId"`
	Summary     string `json:"summary"`
	Description string `json:"description"`
	Tags        []string
	Role        string `json:"x-machina-role"`
	Parameters  []struct {
		Name, In, Description string
		Schema                map[string]any
	}
	RequestBody *struct {
		Content map[string]struct {
			Schema  map[string]any
			Example any
		}
	} `json:"requestBody"`
	Responses map[string]struct {
		Description string
		Content     map[string]struct {
			Schema map[string]any
		}
	}
}

func writeMDOp(b *strings.Builder, method, path string, op mdOp) {
	fmt.Fprintf(b, "\n### %s\n\n`%s %s` — role **%s**\n\n%s\n", op.OperationID, method, path, op.Role, op.Summary)
	if op.Description != "" {
		fmt.Fprintf(b, "\n%s\n", op.Description)
	}
	if len(op.Parameters) > 0 {
		b.WriteString("\n| Parameter | In | Type | Description |\n|---|---|---|---|\n")
		for _, p := range op.Parameters {
			fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", p.Name, p.In, typeText(p.Schema), cell(p.Description))
		}
	}
	if op.RequestBody != nil {
		for media, c := range op.RequestBody.Content {
			fmt.Fprintf(b, "\nRequest body (%s): %s\n", media, typeText(c.Schema))
			if c.Example != nil {
				ex, _ := json.Marshal(c.Example)
				fmt.Fprintf(b, "\n```json\n%s\n```\n", ex)
			}
		}
	}
	b.WriteString("\n| Status | Answer | Body |\n|---|---|---|\n")
	codes := make([]string, 0, len(op.Responses))
	for c := range op.Responses {
		codes = append(codes, c)
	}
	sort.Strings(codes)
	for _, c := range codes {
		r := op.Responses[c]
		body := ""
		for media, mc := range r.Content {
			body = media
			if t := typeText(mc.Schema); t != "string" {
				body = t
			}
		}
		fmt.Fprintf(b, "| %s | %s | %s |\n", c, cell(r.Description), body)
	}
}

// typeText is a schema in a few words: a component's name, "array of X",
// "map of X", or its JSON type.
func typeText(s any) string {
	m, _ := s.(map[string]any)
	if ref, ok := m["$ref"].(string); ok {
		n := ref[strings.LastIndex(ref, "/")+1:]
		return "[" + n + "](#" + strings.ToLower(n) + "-schema)"
	}
	if any, ok := m["anyOf"].([]any); ok && len(any) == 2 {
		return typeText(any[0]) + "\\|null"
	}
	if all, ok := m["allOf"].([]any); ok && len(all) > 0 {
		return typeText(all[0])
	}
	var t string
	switch ty := m["type"].(type) {
	case string:
		t = ty
	case []any:
		var parts []string
		for _, p := range ty {
			parts = append(parts, p.(string))
		}
		t = strings.Join(parts, "\\|")
	default:
		return "any"
	}
	base, null, _ := strings.Cut(t, "\\|")
	t = base
	switch base {
	case "array":
		t = "array of " + typeText(m["items"])
	case "object":
		if ap, ok := m["additionalProperties"].(map[string]any); ok {
			t = "map of " + typeText(ap)
		}
	case "string":
		if f, ok := m["format"].(string); ok {
			t = "string (" + f + ")"
		}
	}
	if null != "" {
		t += " \\|null"
	}
	return t
}

// cell escapes a table cell's pipes and line breaks.
func cell(s string) string {
	return strings.NewReplacer("|", "\\|", "\n", " ").Replace(s)
}
