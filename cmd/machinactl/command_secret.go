package main

import (
	"bufio"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/spf13/cobra"
)

// Environment variables for talking to the controller's admin API.
const (
	envAPI   = "MACHINA_API"   // base URL of the admin API
	envToken = "MACHINA_TOKEN" // admin bearer token: environment only, never a flag
)

// defaultAPI is the admin API when neither --api nor MACHINA_API is given.
const defaultAPI = "http://127.0.0.1:8080"

// maxPasswordBytes bounds what --password-stdin reads.
const maxPasswordBytes = 4096

// readPassword reads one password from r: everything up to the first
// newline (a trailing "\r" is dropped), at most maxPasswordBytes.
func readPassword(r io.Reader) (string, error) {
	br := bufio.NewReader(io.LimitReader(r, maxPasswordBytes+1))
	line, err := br.ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read password from stdin: %w", err)
	}
	if len(line) > maxPasswordBytes {
		return "", fmt.Errorf("password on stdin is longer than %d bytes", maxPasswordBytes)
	}
	line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
	if line == "" {
		return "", errors.New("empty password on stdin")
	}
	return line, nil
}

// newSecretCmd is `machinactl secret set NAME --username U --password-stdin`.
// The password is read from stdin only, never from argv; the token from
// MACHINA_TOKEN only.
func newSecretCmd(e *env) *cobra.Command {
	var apiURL string
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Store credentials in the controller's secret store",
	}
	cmd.PersistentFlags().StringVar(&apiURL, "api", envOr(envAPI, defaultAPI), "admin API base URL (env "+envAPI+"); the token comes from "+envToken)

	var username, pemFile string
	var fromStdin bool
	set := &cobra.Command{
		Use:     "set NAME --username USER --password-stdin",
		Short:   "Create or replace a named credential (password read from stdin)",
		Example: "  export MACHINA_API=https://machina.example:8444 MACHINA_CA=/etc/machina/ca.pem MACHINA_TOKEN=...\n  printf '%s\\n' \"$BMC_PASSWORD\" | machinactl secret set bmc-default --username admin --password-stdin",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if pemFile != "" {
				// A CA bundle for servers.yaml bmc.caBundle: public
				// certificates, no password.
				b, err := os.ReadFile(pemFile)
				if err != nil {
					return &exitError{code: 2, err: fmt.Errorf("secret set: --pem-file: %w", err)}
				}
				if !x509.NewCertPool().AppendCertsFromPEM(b) {
					return &exitError{code: 2, err: fmt.Errorf("secret set: --pem-file %s: no PEM certificate in it", pemFile)}
				}
				c, err := e.apiClient(apiURL)
				if err != nil {
					return &exitError{code: 2, err: fmt.Errorf("secret set: %w", err)}
				}
				// The PEM is the secret's value (the API wants a user name and a
				// value; fleet.CABundlePEM reads it back).
				info, err := c.PutSecret(cmd.Context(), name, v1.SecretRequest{Username: "ca-bundle", Password: string(b)})
				if err != nil {
					return &exitError{code: 2, err: fmt.Errorf("secret set %s: %w", name, err)}
				}
				fmt.Fprintf(e.stdout, "CA bundle %s stored (name it in servers.yaml bmc.caBundle)\n", info.Name)
				return nil
			}
			if !fromStdin {
				return &exitError{code: 2, err: errors.New("secret set: pass --password-stdin; the password is never taken from the command line")}
			}
			if username == "" {
				return &exitError{code: 2, err: errors.New("secret set: --username is required")}
			}
			c, err := e.apiClient(apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("secret set: %w", err)}
			}
			pw, err := readPassword(e.stdin)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("secret set: %w", err)}
			}
			info, err := c.PutSecret(cmd.Context(), name, v1.SecretRequest{Username: username, Password: pw})
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("secret set %s: %w", name, err)}
			}
			if info.Sealed {
				fmt.Fprintf(e.stdout, "secret %s stored, sealed at rest\n", info.Name)
			} else {
				fmt.Fprintf(e.stdout, "secret %s stored UNSEALED: the controller has no master key (set MACHINA_API_KEY_MASTER_KEY)\n", info.Name)
			}
			return nil
		},
	}
	set.Flags().StringVar(&username, "username", "", "user name of the credential")
	set.Flags().BoolVar(&fromStdin, "password-stdin", false, "read the password from stdin (the only way to pass it)")
	set.Flags().StringVar(&pemFile, "pem-file", "", "store a CA bundle instead (PEM: the CA of a BMC's certificate, or its self-signed certificate) for servers.yaml bmc.caBundle")
	cmd.AddCommand(set)
	return cmd
}
