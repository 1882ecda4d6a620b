package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/lab/vm/osimage"
)

func TestRunUsage(t *testing.T) {
	if err := run(context.Background(), []string{"a", "b"}, &bytes.Buffer{}); err == nil {
		t.Fatal("run with two arguments succeeded")
	}
}

// TestRunCached prints "<path> <sha256>" for a cache entry that exists,
// without building (the entry is laid out by hand as Ensure would).
func TestRunCached(t *testing.T) {
	cache := t.TempDir()
	dir := filepath.Join(cache, osimage.Key())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := strings.Repeat("cd", 32)
	if err := os.WriteFile(filepath.Join(dir, osimage.ImageFile), []byte("image"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, osimage.SumsFile), []byte(sum+"  os.img\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{cache}, &out); err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, osimage.ImageFile) + " " + sum + "\n"; out.String() != want {
		t.Fatalf("output %q, want %q", out.String(), want)
	}
}
