// Command machina-node runs on a joined host: `join` enrols it with the
// controller (pinned CA, enrolment token from MACHINA_JOIN_TOKEN) and
// applies the networks and storage pools named on the token;
// `install-unit` installs and starts its systemd unit; `run` holds the node
// certificate and heartbeats over mutual TLS; `facts` prints what a join
// would report.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=..."; it
// travels in every heartbeat.
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
