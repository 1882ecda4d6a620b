// Package inventoryexample embeds the example site (servers.yaml,
// profiles.yaml, images.yaml, networks.yaml) so `machina sim` runs it with no files
// around, as the embedded default.
package inventoryexample

import "embed"

// FS holds servers.yaml, profiles.yaml, images.yaml and networks.yaml of the example site.
//
//go:embed servers.yaml profiles.yaml images.yaml networks.yaml
var FS embed.FS
