// Command machinactl is the operator's and CI's CLI for Machina.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runEnv(ctx, &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, tuneGC: tuneGC}, os.Args[1:])
	stop()
	os.Exit(code)
}
