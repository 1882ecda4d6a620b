package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/schema"
)

// newSchemaCmd is `machinactl schema export DIR`: writes the JSON Schema
// files (servers.schema.json, profiles.schema.json, images.schema.json)
// byte for byte as embedded, for editors and other validators.
func newSchemaCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "schema", Short: "Work with the inventory JSON Schemas"}
	export := &cobra.Command{
		Use:   "export DIR",
		Short: "Write the inventory JSON Schemas (draft 2020-12) into DIR",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return &exitError{code: 2, err: err}
			}
			for _, k := range schema.Kinds {
				b, err := fs.ReadFile(schema.Files(), k.FileName())
				if err != nil {
					return &exitError{code: 2, err: err}
				}
				p := filepath.Join(dir, k.FileName())
				if err := os.WriteFile(p, b, 0o644); err != nil {
					return &exitError{code: 2, err: err}
				}
				fmt.Fprintln(e.stdout, p)
			}
			return nil
		},
	}
	cmd.AddCommand(export)
	return cmd
}
