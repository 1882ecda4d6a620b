package inventory

import (
	"fmt"
	"strconv"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/schema"
)

// CloudInitReserved are the cloud-config keys Machina sets in a deployed
// host's user-data and an operator's cloudInit may not set: password login
// stays off and root login disabled (the host is reached with the profile's
// SSH keys only).
var CloudInitReserved = []string{"ssh_pwauth", "disable_root"}

// MachinaUser is the login user Machina's user-data creates; an operator's
// users may not redefine it.
const MachinaUser = "machina"

// cloudInit checks profiles[i].cloudInit: each part against cloud-init's
// cloud-config schema, none of Machina's parts overridden, and a deploy
// method that writes a NoCloud seed.
func (c *crossChecker) cloudInit(i int) {
	p := &c.inv.Profiles[i]
	ci := p.CloudInit
	if ci == nil {
		return
	}
	base := "/profiles/" + strconv.Itoa(i) + "/cloudInit"
	if p.Deploy != DeployImage {
		c.errAt(c.pd, base, SeverityError, fmt.Sprintf("cloudInit applies to deploy: image (a NoCloud seed); the %s installer takes its own configuration", p.Deploy))
	}
	v, err := schema.Default()
	if err != nil {
		c.errAt(c.pd, base, SeverityError, "cloud-config schema: "+err.Error())
		return
	}
	for _, part := range []struct {
		field string
		doc   map[string]any
	}{{"userData", ci.UserData}, {"vendorData", ci.VendorData}} {
		if part.doc == nil {
			continue
		}
		at := base + "/" + part.field
		for _, viol := range v.ValidateCloudConfig(part.doc) {
			c.errAt(c.pd, at+viol.Pointer, SeverityError, "cloud-init's cloud-config schema: "+viol.Detail)
		}
		for _, k := range CloudInitReserved {
			if _, ok := part.doc[k]; ok {
				c.errAt(c.pd, at+"/"+k, SeverityError, fmt.Sprintf("%s is Machina's: deployed hosts keep password login off and root login disabled; remove it", k))
			}
		}
		if users, ok := part.doc["users"].([]any); ok {
			for k, u := range users {
				name, _ := u.(string)
				if m, ok := u.(map[string]any); ok {
					name, _ = m["name"].(string)
				}
				if name == MachinaUser {
					c.errAt(c.pd, at+"/users/"+strconv.Itoa(k), SeverityError, "user machina is Machina's own login (the profile's sshKeys); name your user differently")
				}
			}
		}
		if files, ok := part.doc["write_files"].([]any); ok {
			for k, f := range files {
				if m, ok := f.(map[string]any); ok && m["path"] == v1.JoinTokenPath {
					c.errAt(c.pd, at+"/write_files/"+strconv.Itoa(k)+"/path", SeverityError, v1.JoinTokenPath+" is where Machina writes the host's enrolment token; write elsewhere")
				}
			}
		}
	}
}
