package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/spf13/cobra"
)

// tokenFlags are the enrolment-token flags shared by `token create` and
// `host add`.
type tokenFlags struct {
	site, rack, host, server, ttl string
	tags, require                 []string
	networks, pools               []string
	minMemoryGiB                  int64
}

func (f *tokenFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.site, "site", "", "site recorded on the host (RFC 1123 label)")
	fl.StringVar(&f.rack, "rack", "", "rack recorded on the host (RFC 1123 label)")
	fl.StringSliceVar(&f.tags, "tags", nil, "tags recorded on the host (comma-separated)")
	fl.StringArrayVar(&f.networks, "networks", nil, "a network to apply, repeatable: name=N,bridge=BR,nic=NIC[,vlan=ID][,cidr=ADDR/LEN]")
	fl.StringArrayVar(&f.pools, "pools", nil, "a storage pool to apply, repeatable: name=N,type=dir,path=/srv/p or name=VG,type=lvm,disks=/dev/sdb:/dev/sdc")
	fl.StringSliceVar(&f.require, "require", nil, "host checks that must pass: kvm, virt, memory")
	fl.Int64Var(&f.minMemoryGiB, "min-memory-gib", 0, "memory check threshold in GiB (default 1)")
	fl.StringVar(&f.ttl, "ttl", "1h", "token lifetime (Go duration, at most 168h)")
	fl.StringVar(&f.server, "server", "", "inventory server the host runs on, if any")
}

// kv parses "k=v,k=v" with the allowed keys.
func kv(s string, allowed ...string) (map[string]string, error) {
	out := map[string]string{}
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok || !slicesContains(allowed, k) {
			return nil, fmt.Errorf("%q: want comma-separated KEY=VALUE with keys %s", part, strings.Join(allowed, ", "))
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%q: key %s given twice", s, k)
		}
		out[k] = v
	}
	return out, nil
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// request builds the enrolment request; the controller validates it fully.
func (f *tokenFlags) request() (v1.EnrolmentRequest, error) {
	r := v1.EnrolmentRequest{Site: f.site, Rack: f.rack, Tags: f.tags, Require: f.require, TTL: f.ttl,
		Host: f.host, Server: f.server, MinMemoryBytes: f.minMemoryGiB << 30}
	for _, s := range f.networks {
		m, err := kv(s, "name", "bridge", "nic", "vlan", "cidr")
		if err != nil {
			return r, fmt.Errorf("--networks %w", err)
		}
		n := v1.JoinNetwork{Name: m["name"], Bridge: m["bridge"], NIC: m["nic"], CIDR: m["cidr"]}
		if v := m["vlan"]; v != "" {
			id, err := strconv.Atoi(v)
			if err != nil {
				return r, fmt.Errorf("--networks %q: vlan %q is not a number", s, v)
			}
			n.VLAN = id
		}
		r.Networks = append(r.Networks, n)
	}
	for _, s := range f.pools {
		m, err := kv(s, "name", "type", "path", "disks")
		if err != nil {
			return r, fmt.Errorf("--pools %w", err)
		}
		p := v1.JoinPool{Name: m["name"], Type: m["type"], Path: m["path"]}
		if d := m["disks"]; d != "" {
			p.Disks = strings.Split(d, ":")
		}
		r.Pools = append(r.Pools, p)
	}
	return r, nil
}

// newTokenCmd is `machinactl token create ...`: an enrolment token for a
// manual join, printed once with what the installer pins.
func newTokenCmd(e *env) *cobra.Command {
	var apiURL string
	cmd := &cobra.Command{Use: "token", Short: "Create enrolment tokens for joining hosts"}
	cmd.PersistentFlags().StringVar(&apiURL, "api", apiFlagDefault(), "admin API base URL (env "+envAPI+"); the token comes from "+envToken)
	var tf tokenFlags
	var asJSON bool
	create := &cobra.Command{
		Use:     "create [--site S] [--rack R] [--tags a,b] [--networks ...] [--pools ...] [--ttl 1h]",
		Short:   "Create a single-use, short-lived enrolment token",
		Example: "  machinactl token create --site lab1 --rack r1 --tags kvm --networks name=prod,bridge=br-prod,nic=eno1,vlan=20 --pools name=images,type=dir,path=/srv/images --ttl 30m",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := tf.request()
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("token create: %w", err)}
			}
			c, err := e.apiClient(apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("token create: %w", err)}
			}
			tok, err := c.CreateEnrolmentToken(cmd.Context(), req)
			if err != nil {
				code := 2
				if v1.IsCode(err, v1.CodeBadRequest) {
					code = 1
				}
				return &exitError{code: code, err: fmt.Errorf("token create: %w", err)}
			}
			if asJSON {
				enc := json.NewEncoder(e.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(tok)
			}
			fmt.Fprintf(e.stdout, "token:          %s\n", tok.Token)
			fmt.Fprintf(e.stdout, "id:             %s (single use, expires %s)\n", tok.ID, tok.ExpiresAt.Format("2006-01-02T15:04:05Z07:00"))
			fmt.Fprintf(e.stdout, "join URL:       %s\n", tok.JoinURL)
			fmt.Fprintf(e.stdout, "CA fingerprint: %s\n", tok.CAFingerprint)
			fmt.Fprintf(e.stdout, "script SHA-256: %s\n", tok.ScriptSHA256)
			fmt.Fprintln(e.stdout, "join with:      machinactl host add USER@HOST, or a bundle: ./install --join URL - (token on stdin)")
			return nil
		},
	}
	tf.register(create)
	create.Flags().StringVar(&tf.host, "host", "", "only this host name may use the token")
	create.Flags().BoolVar(&asJSON, "json", false, "print the answer as JSON")
	cmd.AddCommand(create)
	return cmd
}

var errNoHosts = errors.New("no hosts: give USER@HOST arguments or --file")

// apiFlagDefault is the --api default of the join verbs: MACHINA_API, else
// defaultAPI.
func apiFlagDefault() string {
	if v := os.Getenv(envAPI); v != "" {
		return v
	}
	return defaultAPI
}
