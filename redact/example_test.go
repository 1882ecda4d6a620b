package redact_test

import (
	"fmt"

	"github.com/machina-metal/machina/redact"
)

func ExampleString() {
	fmt.Println(redact.String("GET https://admin:s3cret@10.0.0.5/redfish/v1 failed: 401"))
	fmt.Println(redact.String("ipmitool: password=s3cret rejected"))
	fmt.Println(redact.String("dial tcp 10.0.0.5:443: i/o timeout"))
	// Output:
	// GET https://admin:***@10.0.0.5/redfish/v1 failed: 401
	// ipmitool: password=*** rejected
	// dial tcp 10.0.0.5:443: i/o timeout
}
