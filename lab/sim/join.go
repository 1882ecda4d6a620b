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
	"time"

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
	m.mu.Lock()
	joined := m.joined
	m.osCtx, m.bootedAt = ctx, time.Now()
	m.mu.Unlock()
	if joined {
		// A reboot of a joined host: the node agent's unit starts again
		// from its state folder, as systemd runs machina-node run.
		return m.StartNodeAgent()
	}
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
	dir := m.nodeDir()
	resp, err := node.Join(ctx, node.JoinConfig{URL: url, Fingerprint: fp, Token: tok, Dir: dir, Facts: facts, LocalAddr: m.src})
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	c, err := node.Load(dir)
	if err != nil {
		return err
	}
	// The join command's process ends here on a real host, closing its
	// connections; the agent started below opens its own.
	c.SetLocalAddr(m.src)
	defer c.CloseIdleConnections()
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
	return m.StartNodeAgent() // heartbeats until the machine powers off
}

// nodeDir is where the simulated OS keeps the node agent's state.
func (m *Machine) nodeDir() string { return filepath.Join(filepath.Dir(m.root), "node") }

// StartNodeAgent starts the joined OS's node agent (machina-node run): a
// fresh process, so the controller sees an agent restart when one ran
// before on this boot. It heartbeats over mutual TLS with the OS's uptime
// (since the last disk boot) and version "sim" until StopNodeAgent or the
// machine powers off. It fails when the machine has not joined or is not
// running its OS.
func (m *Machine) StartNodeAgent() error {
	m.mu.Lock()
	ctx, booted, joined := m.osCtx, m.bootedAt, m.joined
	if m.nodeCancel != nil {
		m.nodeCancel()
		m.nodeCancel = nil
	}
	m.mu.Unlock()
	if !joined || ctx == nil || ctx.Err() != nil {
		return fmt.Errorf("sim: %s: start node agent: the machine is not running its joined OS", m.Name)
	}
	c, err := node.Load(m.nodeDir())
	if err != nil {
		return err
	}
	c.Version = "sim"
	c.SetLocalAddr(m.src)
	c.Uptime = func() (time.Duration, error) { return time.Since(booted), nil }
	nctx, cancel := context.WithCancel(ctx)
	m.mu.Lock()
	m.nodeCancel = cancel
	m.mu.Unlock()
	log := m.log
	go func() {
		_ = c.Run(nctx, func(err error) { log.Warn("node agent: heartbeat failed", "err", err) })
	}()
	return nil
}

// StopNodeAgent stops the node agent (its heartbeats) while the OS keeps
// running: the controller should mark the host lost with its power on.
func (m *Machine) StopNodeAgent() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.nodeCancel != nil {
		m.nodeCancel()
		m.nodeCancel = nil
	}
}

// Joined reports whether the machine's OS joined the fleet.
func (m *Machine) Joined() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.joined
}
