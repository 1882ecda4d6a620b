// Command machina-agent is the /init of the Machina ramdisk: it mounts the
// kernel filesystems, loads the modules listed in /modules/order.txt with
// finit_module, waits (bounded) for the kernel CRNG, brings up the boot NIC
// named on the kernel command line with DHCP, and then commissions or
// deploys the machine against the controller (package ramdisk/agent).
package main

import (
	"context"
	"fmt"
	"os"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx := context.Background()
	err := run(ctx, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stdout, "machina-agent: FAILED:", err)
	}
	if os.Getpid() != 1 {
		if err != nil {
			os.Exit(1)
		}
		return
	}
	finish(err) // PID 1 must never exit
}
