package state_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/machina-metal/machina/state"
)

// TestOpenCreatesNoFolder: Open never creates the state file's folder (a
// mistyped path fails with ErrNoStateDir instead of starting a new site),
// and MustExist refuses a missing file without creating it.
func TestOpenCreatesNoFolder(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "typo", "sub", "state.db")
	if _, err := state.Open(path, state.Options{}); !errors.Is(err, state.ErrNoStateDir) {
		t.Fatalf("Open in a missing folder = %v, want ErrNoStateDir", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "typo")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open created %s: %v", filepath.Join(dir, "typo"), err)
	}
	path = filepath.Join(dir, "state.db")
	if _, err := state.Open(path, state.Options{MustExist: true}); !errors.Is(err, state.ErrNoStateFile) {
		t.Fatalf("Open(MustExist) of a missing file = %v, want ErrNoStateFile", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open(MustExist) created the file: %v", err)
	}
	st, err := state.Open(path, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	st, err = state.Open(path, state.Options{MustExist: true})
	if err != nil {
		t.Fatalf("Open(MustExist) of an existing file: %v", err)
	}
	st.Close()
}
