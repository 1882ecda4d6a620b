package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/machina-metal/machina/api"
)

// TestOpenAPICommand: `machina openapi` prints the embedded OpenAPI 3.1
// document byte for byte, and --markdown prints docs/api.md.
func TestOpenAPICommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"openapi"}, nil, &out, &errb); code != 0 {
		t.Fatalf("machina openapi: exit %d: %s", code, errb.String())
	}
	var doc struct {
		OpenAPI string         `json:"openapi"`
		Paths   map[string]any `json:"paths"`
	}
	if !bytes.Equal(out.Bytes(), api.OpenAPI()) || json.Unmarshal(out.Bytes(), &doc) != nil || doc.OpenAPI != "3.1.0" || len(doc.Paths) < 20 {
		t.Fatalf("machina openapi printed %d bytes (openapi %q, %d paths); want the %d embedded", out.Len(), doc.OpenAPI, len(doc.Paths), len(api.OpenAPI()))
	}
	out.Reset()
	if code := run(context.Background(), []string{"openapi", "--markdown"}, nil, &out, &errb); code != 0 {
		t.Fatalf("machina openapi --markdown: exit %d: %s", code, errb.String())
	}
	page, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), page) {
		t.Errorf("machina openapi --markdown differs from docs/api.md (%d and %d bytes)", out.Len(), len(page))
	}
	if code := run(context.Background(), []string{"openapi", "extra"}, nil, &out, &errb); code != 2 {
		t.Errorf("machina openapi extra: exit %d, want 2", code)
	}
}
