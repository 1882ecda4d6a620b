// Command lab-os-image builds (once) or reuses the VM lab's Debian 12 OS
// image and prints "<path> <sha256>". Usage: lab-os-image [CACHEDIR]; the
// default cache is ${XDG_CACHE_HOME:-$HOME/.cache}/machina/os-image. Needs
// root for a build. See lab/vm/osimage.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/machina-metal/machina/lab/vm/osimage"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab-os-image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 1 {
		return fmt.Errorf("usage: lab-os-image [CACHEDIR]")
	}
	dir := ""
	if len(args) == 1 {
		dir = args[0]
	}
	path, sum, err := osimage.Ensure(ctx, dir)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s %s\n", path, sum)
	return err
}
