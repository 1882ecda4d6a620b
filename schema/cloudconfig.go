package schema

import (
	"bytes"
	_ "embed" // the cloud-config schema
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// cloudConfigSchema is cloud-init's schema of cloud-config (draft 4),
// copied from Debian 12's cloud-init 22.4 (cloudinit/README.md).
//
//go:embed cloudinit/schema-cloud-config-v1.json
var cloudConfigSchema []byte

var (
	cloudOnce   sync.Once
	cloudSchema *jsonschema.Schema
	cloudErr    error
)

// ValidateCloudConfig checks doc, a cloud-config mapping decoded by
// encoding/json (a profile's cloudInit.userData or vendorData), against
// cloud-init's own cloud-config schema, as `cloud-init schema
// --config-file` does. It returns every violation, sorted by pointer, nil
// when doc is valid. The schema is compiled on first use (it is large and
// most inventories never need it); formats are not asserted (cloud-init's
// own check annotates them only).
func (v *Validator) ValidateCloudConfig(doc any) []Violation {
	cloudOnce.Do(func() {
		c := jsonschema.NewCompiler()
		c.Draft = jsonschema.Draft4
		const url = "file:///schema/cloudinit/schema-cloud-config-v1.json"
		if err := c.AddResource(url, bytes.NewReader(cloudConfigSchema)); err != nil {
			cloudErr = err
			return
		}
		cloudSchema, cloudErr = c.Compile(url)
	})
	if cloudErr != nil {
		return []Violation{{Keyword: "schema", Detail: fmt.Sprintf("cloud-config schema does not compile: %v", cloudErr)}}
	}
	err := cloudSchema.Validate(doc)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return []Violation{{Keyword: "schema", Detail: err.Error()}}
	}
	var out []Violation
	collectCloud(ve, &out)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Pointer < out[j].Pointer })
	return dedupe(out)
}

// collectCloud flattens the error tree into its leaves. cloud-init's
// schema combines its modules' schemas with allOf and describes many keys
// with oneOf/anyOf of several forms: a failed choice is reported once at
// its location with the library's message, its branches dropped.
func collectCloud(ve *jsonschema.ValidationError, out *[]Violation) {
	kw := lastSegment(ve.KeywordLocation)
	if kw == "oneOf" || kw == "anyOf" || len(ve.Causes) == 0 {
		v := Violation{Pointer: ve.InstanceLocation, Keyword: kw, Detail: ve.Message}
		if kw == "oneOf" || kw == "anyOf" {
			v.Detail = "matches none of the forms cloud-init's cloud-config schema allows here"
		}
		*out = append(*out, v)
		return
	}
	for _, c := range ve.Causes {
		collectCloud(c, out)
	}
}
