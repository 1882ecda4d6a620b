package reconciler_test

import (
	"fmt"

	"github.com/machina-metal/machina/reconciler"
)

func ExampleRedact() {
	fmt.Println(reconciler.Redact("GET https://admin:s3cret@10.0.0.5/redfish/v1 failed: 401"))
	fmt.Println(reconciler.Redact("ipmitool: password=s3cret rejected"))
	fmt.Println(reconciler.Redact("dial tcp 10.0.0.5:443: i/o timeout"))
	// Output:
	// GET https://admin:***@10.0.0.5/redfish/v1 failed: 401
	// ipmitool: password=*** rejected
	// dial tcp 10.0.0.5:443: i/o timeout
}
