package inventory

import (
	"strings"
	"testing"
)

// TestCloudInitChecks: a profile's cloudInit is refused on an installer
// profile, checked against cloud-init's schema inside vendorData as in
// userData, and a valid one loads with its values decoded.
func TestCloudInitChecks(t *testing.T) {
	files := map[string]string{}
	for k, v := range netBase {
		files[k] = v
	}
	files[ProfilesFile] = strings.Replace(netBase[ProfilesFile], "    count: 2\n", "    count: 2\n    cloudInit:\n      userData: {packages: [chrony], users: [default, {name: ops}]}\n      vendorData: {timezone: UTC}\n", 1)
	res, err := loadNet(t, files)
	if err != nil {
		t.Fatal(err)
	}
	if ci := res.Inventory.Profile("p").CloudInit; ci == nil || ci.VendorData["timezone"] != "UTC" || len(ci.UserData["users"].([]any)) != 2 {
		t.Fatalf("cloudInit = %+v", ci)
	}
	for _, tt := range []struct{ old, new, want string }{
		{"    count: 2\n", "    count: 2\n    deploy: kickstart\n", "profiles.yaml:9:7: profiles[0].cloudInit: cloudInit applies to deploy: image (a NoCloud seed); the kickstart installer takes its own configuration"},
		{"timezone: UTC", "timezone: [UTC]", "profiles.yaml:9:30: profiles[0].cloudInit.vendorData.timezone: cloud-init's cloud-config schema: expected string, but got array"},
		{"{name: ops}", "{name: machina}", "profiles.yaml:8:55: profiles[0].cloudInit.userData.users[1]: user machina is Machina's own login (the profile's sshKeys); name your user differently"},
	} {
		f := map[string]string{}
		for k, v := range files {
			f[k] = v
		}
		f[ProfilesFile] = strings.Replace(files[ProfilesFile], tt.old, tt.new, 1)
		_, err := loadNet(t, f)
		if err == nil {
			t.Fatalf("%s: loaded, want %q", tt.new, tt.want)
		}
		found := false
		for _, fe := range err.(*ValidationError).Errors {
			found = found || fe.Error() == tt.want
		}
		if !found {
			t.Errorf("%s: %v\nwant %s", tt.new, err.(*ValidationError).Errors, tt.want)
		}
	}
}
