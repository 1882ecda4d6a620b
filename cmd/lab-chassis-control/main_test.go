package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/machina-metal/machina/lab/vm/vmpower"
)

func TestRun(t *testing.T) {
	dir := t.TempDir()
	if _, err := vmpower.New(vmpower.Config{Name: "cc", Dir: dir}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{dir, "set", "boot", "pxe"}, &out); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{dir, "get", "power", "boot"}, &out); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "power:0\nboot:pxe\n" {
		t.Fatalf("output %q, want power:0 and boot:pxe", got)
	}
	if err := run(context.Background(), []string{dir, "get"}, &out); err == nil {
		t.Fatal("run with too few arguments succeeded")
	}
	if err := run(context.Background(), []string{t.TempDir(), "get", "power"}, &out); err == nil {
		t.Fatal("run on a directory without vm.json succeeded")
	}
}
