package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/state"
	"github.com/spf13/cobra"
)

// Environment variables of the join listener (flags of machina serve).
const (
	envJoinListen = "MACHINA_JOIN_LISTEN"
	envJoinURL    = "MACHINA_JOIN_URL"
	envNodeBinary = "MACHINA_NODE_BINARY"
)

// JoinServeConfig is the join listener's part of machina serve.
type JoinServeConfig struct {
	// Listen is the join listener's TCP address; empty disables it.
	Listen string
	// URL is the address hosts reach the listener at ("https://10.0.0.1:8443");
	// empty means https://<bound address>, allowed only when Listen names a
	// specific IP (not 0.0.0.0 or [::]).
	URL string
	// NodeBinary is served at /join/machina-node; empty serves none.
	NodeBinary string
	// Heartbeat is the node heartbeat interval; zero means 30s.
	Heartbeat time.Duration
	// OnReady, if set, is called with the listener's URL once it accepts.
	OnReady func(url string)
}

// register adds the join flags to cmd (machina serve).
func (j *JoinServeConfig) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&j.Listen, "join-listen", envOrDefault(envJoinListen, ""), "join listener TCP address, TLS (env "+envJoinListen+"); empty disables joins")
	cmd.Flags().StringVar(&j.URL, "join-url", envOrDefault(envJoinURL, ""), "URL hosts use to reach the join listener, https://HOST:PORT (env "+envJoinURL+")")
	cmd.Flags().StringVar(&j.NodeBinary, "node-binary", envOrDefault(envNodeBinary, ""), "machina-node executable served to joining hosts (env "+envNodeBinary+")")
}

// Setup returns a ServeConfig.Setup function that loads or creates the
// controller CA (sealed in the store), builds the join listener, mounts
// its admin routes (POST /api/v1/join/tokens, GET /api/v1/hosts, GET
// /api/v1/join/info) on the admin API, and serves the listener until ctx
// is done. With Listen empty it does nothing. It returns the join server
// through *out (for deploys: out.IssueToken then join.RunCmd).
func (j JoinServeConfig) Setup(ctx context.Context, log *slog.Logger, out **join.Server) func(*state.Store, *api.Server) error {
	return func(st *state.Store, srv *api.Server) error {
		if j.Listen == "" {
			return nil
		}
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		ca, err := join.LoadOrCreateCA(st, nil)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", j.Listen)
		if err != nil {
			return fmt.Errorf("join: listen %s: %w", j.Listen, err)
		}
		u := j.URL
		if u == "" {
			ta := ln.Addr().(*net.TCPAddr)
			if ta.IP.IsUnspecified() {
				ln.Close()
				return fmt.Errorf("join: listening on %s: set --join-url to the address hosts reach", ln.Addr())
			}
			u = "https://" + ln.Addr().String()
		}
		js, err := join.New(join.Config{Store: st, CA: ca, URL: u, NodeBinary: j.NodeBinary, Heartbeat: j.Heartbeat,
			Logger: log.With("component", "join")})
		if err != nil {
			ln.Close()
			return err
		}
		if err := join.RegisterAdmin(srv, js, api.Actor); err != nil {
			ln.Close()
			return err
		}
		if out != nil {
			*out = js
		}
		log.Info("join listener", "addr", ln.Addr().String(), "url", u, "caFingerprint", ca.Fingerprint(), "scriptSHA256", join.ScriptSHA256())
		go func() {
			if err := js.Serve(ctx, ln); err != nil {
				log.Error("join listener stopped", "err", err)
			}
		}()
		if j.OnReady != nil {
			j.OnReady(u)
		}
		return nil
	}
}
