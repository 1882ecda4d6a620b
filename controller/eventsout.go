package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/machina-metal/machina/eventsout"
)

// EventsOutConfig configures the outgoing webhooks (package eventsout):
// the controller's event log POSTed as signed CloudEvents to each URL.
type EventsOutConfig struct {
	// URLs are the receivers (http or https); none runs no sender.
	URLs []string
	// SecretFile holds the HMAC-SHA256 key every request is signed with
	// (surrounding white space trimmed); required with URLs. The secret
	// is never a flag value.
	SecretFile string
	// Kinds, if set, delivers only events whose kind starts with one of
	// these prefixes (e.g. "lifecycle", "server.").
	Kinds []string
}

// eventsOut builds the outgoing webhook sender and registers its
// metrics; it runs as the leader-only component "events out".
func (w *wiring) eventsOut() (func(), error) {
	c := w.cfg.EventsOut
	if len(c.URLs) == 0 {
		return nil, nil
	}
	if c.SecretFile == "" {
		return nil, errors.New("controller: events out: --webhook-out needs --webhook-out-secret-file")
	}
	raw, err := os.ReadFile(c.SecretFile)
	if err != nil {
		return nil, fmt.Errorf("controller: events out: read secret: %w", err)
	}
	secret := []byte(strings.TrimSpace(string(raw)))
	if len(secret) == 0 {
		return nil, fmt.Errorf("controller: events out: secret file %s is empty", c.SecretFile)
	}
	var hooks []eventsout.Webhook
	for _, u := range c.URLs {
		hooks = append(hooks, eventsout.Webhook{URL: u, Secret: secret, Kinds: c.Kinds})
	}
	s, err := eventsout.New(eventsout.Config{Store: w.st, Webhooks: hooks, Source: w.publicURL,
		Logger: w.log.With("component", "events-out")})
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	for _, m := range s.Collectors() {
		if err := w.reg.Register(m); err != nil {
			return nil, fmt.Errorf("controller: events out: %w", err)
		}
	}
	w.evOut = s
	return nil, nil
}

// eventsOutComponent is the sender's component, or none without webhooks.
func (w *wiring) eventsOutComponent() []component {
	if w.evOut == nil {
		return nil
	}
	return []component{{"events out", func(ctx context.Context) error { return w.evOut.Run(ctx) }}}
}
