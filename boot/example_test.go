package boot_test

import (
	"fmt"

	"github.com/machina-metal/machina/boot"
)

func ExampleParseMAC() {
	for _, s := range []string{"52-54-00-AB-CD-EF", "5254.00ab.cdef", "01:00:5e:00:00:01"} {
		mac, err := boot.ParseMAC(s)
		fmt.Println(mac, err)
	}
	// Output:
	// 52:54:00:ab:cd:ef <nil>
	// 52:54:00:ab:cd:ef <nil>
	//  parse mac: invalid mac: 01:00:5e:00:00:01 is a group (multicast) address
}

func ExampleChainScript() {
	b, _ := boot.ChainScript("http://10.99.0.1:8080/boot/ipxe")
	fmt.Print(string(b))
	// Output:
	// #!ipxe
	// # Machina: get an address (retrying), then fetch this machine's script.
	// :retry
	// isset ${net0/ip} || dhcp || goto wait
	// chain --autofree http://10.99.0.1:8080/boot/ipxe?mac=${net0/mac:hexhyp}&platform=${platform}&arch=${buildarch} || goto wait
	// :wait
	// echo Machina: boot script not available, retrying in 5 s
	// sleep 5
	// goto retry
}
