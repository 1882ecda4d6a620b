package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// TestStatusServerDetailAddresses: machinactl status SERVER reads the
// server from the admin API and shows the pool addresses IPAM holds for
// it, each with interface, subnet and the profile it was taken for.
func TestStatusServerDetailAddresses(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	srv := v1.Server{Name: "r1-n01", Lifecycle: "deployed", LifecycleAt: at, Power: v1.PowerStatus{State: "powered_on"},
		Allocation: &v1.Allocation{Profile: "hypervisor", Image: "ubuntu-24.04", Reason: "count", At: at},
		Addresses: []v1.AddressLease{{Subnet: "mgmt", Interface: "eno1", Address: "10.20.0.101", Profile: "hypervisor", At: at},
			{Subnet: "tenant", Interface: "tenant0", Address: "10.120.0.11", Profile: "hypervisor", At: at}}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/servers/r1-n01", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(srv)
	})
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	t.Setenv("MACHINA_TOKEN", "tok")
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"status", "r1-n01", "--api", ts.URL}, strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("status r1-n01 = %d: %s", code, errb.String())
	}
	want := `Server r1-n01
  lifecycle:  deployed since 2026-03-04T05:06:07Z
  power:      powered_on
  profile:    hypervisor (count), image ubuntu-24.04
  addresses:  10.20.0.101     eno1 on mgmt (taken for hypervisor)
              10.120.0.11     tenant0 on tenant (taken for hypervisor)
`
	if out.String() != want {
		t.Errorf("status r1-n01 =\n%s\nwant\n%s", out.String(), want)
	}
}

// TestParseStatusServerAddresses: the addresses of a status file (the
// status writer's own golden) come back as held leases, so machinactl
// plan's IPAM simulation skips them.
func TestParseStatusServerAddresses(t *testing.T) {
	s := parseStatusGolden(t)
	if len(s.Addresses) != 2 || s.Addresses[0].Address != "10.20.0.101" || s.Addresses[0].Subnet != "mgmt" || s.Addresses[1].Interface != "tenant0" {
		t.Fatalf("parseStatusServer addresses = %+v, want mgmt 10.20.0.101 and tenant0's", s.Addresses)
	}
}

// statusGoldenPath is the status file gitops' writer renders for server
// r1-n01 (its golden): machinactl's status readers are tested on what the
// controller writes, not on a copy that could drift from it.
const statusGoldenPath = "../../gitops/testdata/status/servers/r1-n01.yaml.golden"

// statusGolden returns the bytes of the file at statusGoldenPath.
func statusGolden(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(statusGoldenPath)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// parseStatusGolden returns the file at statusGoldenPath read by
// parseStatusServer at fixedNow.
func parseStatusGolden(t *testing.T) state.Server {
	t.Helper()
	s, err := parseStatusServer(statusGolden(t), fixedNow)
	if err != nil {
		t.Fatalf("parseStatusServer(%s) = %v", statusGoldenPath, err)
	}
	return s
}
