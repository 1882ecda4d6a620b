// Command geninventory writes a synthetic inventory for benchmarks:
// geninventory [-networks] DIR [SERVERS PROFILES IMAGES] (default 10000
// 200 50). -networks adds networks.yaml, a network layout with a
// pool-mode VLAN on every profile and each server's fixed address
// (inventorygen.Size.Networks).
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"

	"github.com/machina-metal/machina/bench/inventorygen"
)

func main() {
	networks := flag.Bool("networks", false, "add networks.yaml and network layouts (pool and fixed addresses)")
	flag.Parse()
	args := flag.Args()
	if len(args) != 1 && len(args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: geninventory [-networks] DIR [SERVERS PROFILES IMAGES]")
		os.Exit(2)
	}
	sz := inventorygen.Size{Servers: 10000, Profiles: 200, Images: 50, Networks: *networks}
	if len(args) == 4 {
		var err error
		for i, p := range []*int{&sz.Servers, &sz.Profiles, &sz.Images} {
			if *p, err = strconv.Atoi(args[1+i]); err != nil {
				fmt.Fprintln(os.Stderr, "geninventory:", err)
				os.Exit(2)
			}
		}
	}
	if err := inventorygen.Write(args[0], sz); err != nil {
		fmt.Fprintln(os.Stderr, "geninventory:", err)
		os.Exit(1)
	}
}
