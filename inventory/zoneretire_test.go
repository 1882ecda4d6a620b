package inventory

import (
	"errors"
	"os"
	"strings"
	"testing"
	"testing/fstest"
)

// TestRetiringAZone: every server of zone-c retired and the zone's
// profile at count 0 is a valid inventory (it was refused with
// `zone "zone-c" has no servers in servers.yaml` while its servers were
// listed); at count 1 it is refused with a message saying they are
// retired; a zone with no servers at all keeps the old message.
func TestRetiringAZone(t *testing.T) {
	fsys := fstest.MapFS{}
	for _, f := range Files {
		b, err := os.ReadFile("../inventory-example/" + f)
		if err != nil {
			t.Fatal(err)
		}
		fsys[f] = &fstest.MapFile{Data: b}
	}
	servers := string(fsys[ServersFile].Data)
	servers = strings.ReplaceAll(servers, "    want: retired\n", "") // the example retires r3-n03 already
	servers = strings.ReplaceAll(servers, "    zone: zone-c\n", "    zone: zone-c\n    want: retired\n")
	if n := strings.Count(servers, "want: retired"); n != 3 {
		t.Fatalf("edited servers.yaml retires %d servers, want zone-c's 3", n)
	}
	fsys[ServersFile] = &fstest.MapFile{Data: []byte(servers)}
	if _, err := Load(fsys, Limits{}); err != nil {
		t.Fatalf("zone-c retired with its profile at count 0: %v", err)
	}

	profiles := string(fsys[ProfilesFile].Data)
	i := strings.Index(profiles, "    zone: zone-c\n")
	j := i + strings.Index(profiles[i:], "    count: 0\n")
	fsys[ProfilesFile] = &fstest.MapFile{Data: []byte(profiles[:j] + "    count: 1\n" + profiles[j+len("    count: 0\n"):])}
	_, err := Load(fsys, Limits{})
	var verr *ValidationError
	if !errors.As(err, &verr) || !strings.Contains(err.Error(), `zone "zone-c" has only retired servers in servers.yaml (3)`) {
		t.Fatalf("count 1 in a retired zone: %v, want the only-retired error", err)
	}

	fsys[ProfilesFile] = &fstest.MapFile{Data: []byte(strings.Replace(profiles, "    zone: zone-c\n", "    zone: zone-z\n", 1))}
	if _, err := Load(fsys, Limits{}); err == nil || !strings.Contains(err.Error(), `zone "zone-z" has no servers in servers.yaml`) {
		t.Fatalf("a zone without servers: %v, want the no-servers error", err)
	}
}
