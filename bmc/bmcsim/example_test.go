package bmcsim_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/machina-metal/machina/bmc/bmcsim"
)

// Many emulated BMCs share one parsed tree; each keeps only what it changed.
func ExampleTrees_New() {
	var trees bmcsim.Trees
	dir, err := bmcsim.TreeDir("", "dell-poweredge-r750-idrac9")
	if err != nil {
		fmt.Println(err)
		return
	}
	power := bmcsim.NewMemoryPower(false) // the lab plugs a QMP backend in here
	sim, err := trees.New(dir, bmcsim.Config{Username: "root", Password: "calvin", Power: power})
	if err != nil {
		fmt.Println(err)
		return
	}
	sim.Inject(bmcsim.Fault{Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset", Kind: bmcsim.FaultUnavailable, Times: 1})
	ts := httptest.NewServer(sim)
	defer ts.Close()

	reset := func() int {
		req, _ := http.NewRequest("POST", ts.URL+"/redfish/v1/Systems/System.Embedded.1/Actions/ComputerSystem.Reset", strings.NewReader(`{"ResetType":"On"}`))
		req.SetBasicAuth("root", "calvin")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	fmt.Println(reset(), reset(), power.On())
	for _, r := range sim.Requests() {
		fmt.Println(r.Status, r)
	}
	// Output:
	// 503 204 true
	// 503 POST /redfish/v1/Systems/System.Embedded.1/Actions/ComputerSystem.Reset {"ResetType":"On"}
	// 204 POST /redfish/v1/Systems/System.Embedded.1/Actions/ComputerSystem.Reset {"ResetType":"On"}
}
