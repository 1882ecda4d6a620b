// Package inventoryexample embeds the example site (servers.yaml,
// profiles.yaml, images.yaml) so `machina sim` runs it with no files
// around, as the embedded default.
package inventoryexample

import "embed"

// FS holds servers.yaml, profiles.yaml and images.yaml of the example site.
//
//go:embed servers.yaml profiles.yaml images.yaml
var FS embed.FS
