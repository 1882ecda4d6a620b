package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/state"
)

func TestTokenCreateListRevoke(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"token", "create", "--name", "ops", "--state", path}, nil, &out, &errb); code != 0 {
		t.Fatalf("token create exit %d: %s", code, errb.String())
	}
	value := strings.TrimSpace(out.String())
	if !strings.HasPrefix(value, state.AdminTokenPrefix) || strings.Contains(errb.String(), value) {
		t.Fatalf("stdout %q stderr %q", out.String(), errb.String())
	}
	// A duplicate name fails.
	if code := run(context.Background(), []string{"token", "create", "--name", "ops", "--state", path}, nil, &out, &errb); code == 0 {
		t.Error("duplicate token create succeeded")
	}
	out.Reset()
	if code := run(context.Background(), []string{"token", "list", "--state", path}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "ops") || strings.Contains(out.String(), value) {
		t.Errorf("token list exit %d: %q", code, out.String())
	}
	st, err := state.Open(path, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.AuthenticateAdmin(value)
	if err != nil || got.Name != "ops" {
		t.Errorf("AuthenticateAdmin(printed token) = %+v, %v", got, err)
	}
	// While the store is held, the command fails at once with a clear message.
	errb.Reset()
	if code := run(context.Background(), []string{"token", "create", "--name", "ci", "--state", path}, nil, &out, &errb); code == 0 || !strings.Contains(errb.String(), "in use by another process") {
		t.Errorf("create while locked: exit %d, %q", code, errb.String())
	}
	st.Close()
	if code := run(context.Background(), []string{"token", "revoke", "--name", "ops", "--state", path}, nil, &out, &errb); code != 0 {
		t.Fatalf("revoke exit %d: %s", code, errb.String())
	}
	st, _ = state.Open(path, state.Options{})
	defer st.Close()
	if _, err := st.AuthenticateAdmin(value); !errors.Is(err, state.ErrTokenUnknown) {
		t.Errorf("after revoke: %v", err)
	}
	if code := run(context.Background(), []string{"token", "create", "--name", "Bad Name", "--state", path}, nil, &out, &errb); code == 0 {
		t.Error("bad name accepted")
	}
}
