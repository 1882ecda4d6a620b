// Command geninventory writes a synthetic inventory for benchmarks:
// geninventory DIR [SERVERS PROFILES IMAGES] (default 10000 200 50).
package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/machina-metal/machina/bench/inventorygen"
)

func main() {
	if len(os.Args) != 2 && len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: geninventory DIR [SERVERS PROFILES IMAGES]")
		os.Exit(2)
	}
	sz := inventorygen.Size{Servers: 10000, Profiles: 200, Images: 50}
	if len(os.Args) == 5 {
		var err error
		for i, p := range []*int{&sz.Servers, &sz.Profiles, &sz.Images} {
			if *p, err = strconv.Atoi(os.Args[2+i]); err != nil {
				fmt.Fprintln(os.Stderr, "geninventory:", err)
				os.Exit(2)
			}
		}
	}
	if err := inventorygen.Write(os.Args[1], sz); err != nil {
		fmt.Fprintln(os.Stderr, "geninventory:", err)
		os.Exit(1)
	}
}
