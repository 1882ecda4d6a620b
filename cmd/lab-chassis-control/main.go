// Command lab-chassis-control is the chassis_control program of an ipmi_sim
// BMC in the Machina VM lab: `lab-chassis-control VMDIR get|set ...`, where
// VMDIR is a lab/vm/vmpower state directory. See lab/vm/ipmichassis.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/machina-metal/machina/lab/vm/ipmichassis"
	"github.com/machina-metal/machina/lab/vm/vmpower"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab-chassis-control:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) < 3 {
		return errors.New("usage: lab-chassis-control VMDIR get|set PARAM [VALUE]")
	}
	vm, err := vmpower.Open(args[0], nil)
	if err != nil {
		return err
	}
	return ipmichassis.Run(ctx, vm, args[1:], stdout)
}
