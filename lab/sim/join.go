package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/join/node"
)

// planCapture is the simulated machine's view of its ramdisk's network:
// it passes every request through and keeps the NoCloud seed of the deploy
// plan the agent fetched, which cloud-init reads from the disk's seed
// partition at first boot.
type planCapture struct {
	base http.RoundTripper
	m    *Machine
}

func (p planCapture) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := p.base.RoundTrip(r)
	if err != nil || r.URL.Path != v1.PathAgentPlan || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	var plan v1.Plan
	if json.Unmarshal(body, &plan) == nil {
		p.m.mu.Lock()
		seed := plan.Seed
		p.m.lastSeed = &seed
		p.m.mu.Unlock()
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// firstBoot is cloud-init's first boot of the deployed OS: it runs the
// seed's join command. The simulated OS joins in-process with the real
// node code (join/node: pinned TLS, CSR, node certificate) instead of sh,
// curl and openssl; networks and storage pools are reported as simulated,
// since a simulated host has no NICs or disks of its own to change, and
// the node then heartbeats over mutual TLS until the machine powers off.
func (m *Machine) firstBoot(ctx context.Context) error {
	m.mu.Lock()
	seed := m.lastSeed
	m.mu.Unlock()
	if seed == nil || !strings.Contains(seed.JoinCommand, "MACHINA_JOIN_TOKEN") {
		return nil // no join command in the seed: nothing to join
	}
	url, fp, tok, tokFile, err := join.ParseFirstBootCommand(seed.JoinCommand)
	if err != nil {
		return err
	}
	if tokFile != "" {
		// The token-file variant: the seed's write_files puts the token
		// there (0600) and the command reads it; it is not in the command.
		if tokFile != v1.JoinTokenPath || seed.JoinToken == "" || strings.Contains(seed.JoinCommand, seed.JoinToken) {
			return fmt.Errorf("first boot: join command reads %s but the seed writes the token to %s (token set: %v)", tokFile, v1.JoinTokenPath, seed.JoinToken != "")
		}
		tok = seed.JoinToken
	}
	facts := v1.HostFacts{Hostname: seed.Hostname, MemoryBytes: m.HW.MemoryGiB << 30, KVM: true}
	if m.HW.Virt != "" {
		facts.CPUFlags = []string{m.HW.Virt}
	}
	dir := filepath.Join(filepath.Dir(m.root), "node")
	resp, err := node.Join(ctx, node.JoinConfig{URL: url, Fingerprint: fp, Token: tok, Dir: dir, Facts: facts})
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	c, err := node.Load(dir)
	if err != nil {
		return err
	}
	for _, n := range resp.Networks {
		msg := fmt.Sprintf("simulated: bridge %s over %s", n.Bridge, n.NIC)
		if n.VLAN > 0 {
			msg += fmt.Sprintf(" VLAN %d", n.VLAN)
		}
		if err := c.Step(ctx, v1.JoinStep{Step: "network " + n.Name, OK: true, Message: msg}); err != nil {
			return err
		}
	}
	for _, p := range resp.Pools {
		if err := c.Step(ctx, v1.JoinStep{Step: "pool " + p.Name, OK: true, Message: "simulated: " + p.Type + " pool"}); err != nil {
			return err
		}
	}
	if err := c.Done(ctx, v1.JoinDone{OK: true}); err != nil {
		return err
	}
	m.log.Info("joined the fleet", "host", resp.Host)
	m.mu.Lock()
	m.joined = true
	m.mu.Unlock()
	go func() { _ = c.Run(ctx, func(error) {}) }() // heartbeats until the machine powers off
	return nil
}

// Joined reports whether the machine's OS joined the fleet.
func (m *Machine) Joined() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.joined
}
