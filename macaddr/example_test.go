package macaddr_test

import (
	"fmt"

	"github.com/machina-metal/machina/macaddr"
)

func ExampleParseUnicast() {
	for _, s := range []string{"52-54-00-AB-CD-EF", "5254.00ab.cdef", "01:00:5e:00:00:01"} {
		mac, err := macaddr.ParseUnicast(s)
		fmt.Println(mac, err)
	}
	// Output:
	// 52:54:00:ab:cd:ef <nil>
	// 52:54:00:ab:cd:ef <nil>
	// 00:00:00:00:00:00 parse mac: invalid mac: 01:00:5e:00:00:01 is a group (multicast) address
}
