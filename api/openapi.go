package api

import (
	_ "embed"
	"net/http"
	"strconv"
)

// openAPIDocument is the admin API's OpenAPI 3.1 document. It is generated
// from the controller's operation table and the Go wire types
// (controller.OpenAPIDocument; the controller's TestOpenAPIDocumentFresh
// fails when this file is stale) and checked against the running server
// by the controller's round-trip and route tests.
//
//go:embed openapi.json
var openAPIDocument []byte

// OpenAPI returns the admin API's OpenAPI 3.1 document (JSON), as served
// at GET /api/v1/openapi.json. The caller must not modify it.
func OpenAPI() []byte { return openAPIDocument }

// handleOpenAPI answers GET /api/v1/openapi.json (viewer: it describes
// the routes and their roles, nothing of the fleet).
func handleOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(openAPIDocument)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openAPIDocument)
}
