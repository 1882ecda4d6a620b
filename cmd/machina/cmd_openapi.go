package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/controller"
)

// newOpenAPICmd is `machina openapi`: it writes the admin API's OpenAPI
// 3.1 document built into this binary (the one GET /api/v1/openapi.json
// serves) to standard output, or with --markdown the reference page
// rendered from it (docs/api.md).
func newOpenAPICmd(e *env) *cobra.Command {
	var markdown bool
	cmd := &cobra.Command{
		Use:   "openapi",
		Short: "Print the admin API's OpenAPI 3.1 document (JSON), or with --markdown its reference page",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := api.OpenAPI()
			if markdown {
				var err error
				if out, err = controller.OpenAPIMarkdown(out); err != nil {
					return fmt.Errorf("openapi: %w", err)
				}
			}
			if _, err := e.stdout.Write(out); err != nil {
				return fmt.Errorf("openapi: write: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&markdown, "markdown", false, "print the reference page (docs/api.md) instead of the JSON document")
	return cmd
}
