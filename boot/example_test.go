package boot_test

import (
	"fmt"

	"github.com/machina-metal/machina/boot"
)

func ExampleChainScript() {
	b, _ := boot.ChainScript("http://10.99.0.1:8080/boot/ipxe")
	fmt.Print(string(b))
	// Output:
	// #!ipxe
	// # Machina: get an address (retrying), then fetch this machine's script.
	// :retry
	// isset ${net0/ip} || dhcp || goto wait
	// chain --autofree http://10.99.0.1:8080/boot/ipxe?mac=${net0/mac:hexhyp}&platform=${platform}&arch=${buildarch} || goto wait
	// # The script returned: boot from disk. Leave iPXE for the next boot device
	// # (UEFI: with an error status, so the boot manager tries the next entry).
	// echo Machina: leaving iPXE for the firmware's next boot device
	// iseq ${platform} efi && exit 1 ||
	// exit 0
	// :wait
	// echo Machina: boot script not available, retrying in 5 s
	// sleep 5
	// goto retry
}
