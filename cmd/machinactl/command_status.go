package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// maxAttentionLines bounds the servers `machinactl status` lists as needing
// attention, to keep the overview on one screen.
const maxAttentionLines = 15

// maxConditionLines bounds the plan conditions (orphaned servers, short
// capacity) status lists.
const maxConditionLines = 5

// lifecycleOrder is the order status prints lifecycle counts in.
var lifecycleOrder = []string{"new", "commissioning", "ready", "allocated", "deploying", "deployed", "failed", "retired"}

// newStatusCmd is `machinactl status`: a one-screen overview of the fleet
// from GET /api/v1/status, /api/v1/servers (every page), /api/v1/inventory
// and /api/v1/plan: inventory validity, counts by lifecycle, whether
// secrets are sealed at rest (it says so when they are not), the pending
// and held plan, and failed or stalled servers with their last error and
// servers whose BMC the controller's sweep cannot read. `machinactl status
// SERVER` shows one server (GET /api/v1/servers/{name}) with the pool
// addresses IPAM holds for it (writeServerDetail).
// Exit 0, or 2 when the API cannot be read.
func newStatusCmd(e *env) *cobra.Command {
	var apiURL string
	cmd := &cobra.Command{
		Use:   "status [SERVER]",
		Short: "One-screen overview of the fleet and the controller, or one server's detail",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.apiClient(apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("status: %w", err)}
			}
			ctx := cmd.Context()
			if len(args) == 1 {
				srv, err := c.Server(ctx, args[0])
				if err != nil {
					return &exitError{code: 2, err: fmt.Errorf("status %s: %w", args[0], err)}
				}
				writeServerDetail(e.stdout, srv)
				return nil
			}
			st, err := c.Status(ctx)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("status: %w", err)}
			}
			var inv gitops.InventoryStatus
			if err := c.GetJSON(ctx, "/api/v1/inventory", &inv); err != nil {
				return &exitError{code: 2, err: fmt.Errorf("status: inventory: %w", err)}
			}
			var res plan.Result
			if err := c.GetJSON(ctx, "/api/v1/plan", &res); err != nil {
				return &exitError{code: 2, err: fmt.Errorf("status: plan: %w", err)}
			}
			snap, err := snapshotFromAPI(ctx, c)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("status: %w", err)}
			}
			hosts, err := c.Hosts(ctx)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("status: hosts: %w", err)}
			}
			writeStatus(e.stdout, apiURL, st.Servers, st.Secrets.Sealing, st.Secrets.Sealed, st.Secrets.Unsealed, inv, res, snap)
			writeGitLines(e.stdout, st.Git, time.Now())
			writeHostStatus(e.stdout, hosts.Items)
			return nil
		},
	}
	cmd.Flags().StringVar(&apiURL, "api", envOr(envAPI, defaultAPI), "admin API base URL (env "+envAPI+"); the token comes from "+envToken)
	return cmd
}

// writeServerDetail renders one server (machinactl status SERVER): its
// lifecycle, power, allocation, the pool addresses IPAM holds for it and
// its last error.
func writeServerDetail(w io.Writer, s v1.Server) {
	fmt.Fprintf(w, "Server %s\n", termSafe(s.Name))
	fmt.Fprintf(w, "  lifecycle:  %s since %s\n", termSafe(s.Lifecycle), s.LifecycleAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "  power:      %s\n", termSafe(string(s.Power.State)))
	if a := s.Allocation; a != nil {
		fmt.Fprintf(w, "  profile:    %s (%s), image %s\n", termSafe(a.Profile), termSafe(a.Reason), termSafe(a.Image))
	} else {
		fmt.Fprintln(w, "  profile:    none")
	}
	if len(s.Addresses) == 0 {
		fmt.Fprintln(w, "  addresses:  none from IPAM")
	}
	for i, l := range s.Addresses {
		head := "  addresses: "
		if i > 0 {
			head = "             "
		}
		fmt.Fprintf(w, "%s %-15s %s on %s (taken for %s)\n", head, termSafe(l.Address), termSafe(l.Interface), termSafe(l.Subnet), termSafe(l.Profile))
	}
	if s.LastError != "" {
		fmt.Fprintf(w, "  last error: %s\n", termSafe(oneLine(s.LastError, 200)))
	}
}

// writeStatus renders the overview.
func writeStatus(w io.Writer, apiURL string, counts map[string]int, sealing bool, sealed, unsealed int,
	inv gitops.InventoryStatus, res plan.Result, snap state.Snapshot) {
	fmt.Fprintf(w, "Machina at %s\n", apiURL)
	writeInventoryLine(w, inv)
	writeServersLine(w, counts)
	writeSecretsLine(w, sealing, sealed, unsealed)
	writePlanLines(w, res)
	writeAttention(w, res, snap)
	writeProgress(w, snap)
	writeCabling(w, snap)
}

// writeProgress lists the deploys whose ramdisk reports progress: step,
// bytes, rate, and when the bytes last moved.
func writeProgress(w io.Writer, snap state.Snapshot) {
	var lines []string
	for _, name := range sortedNames(snap.Servers) {
		p := snap.Servers[name].CurrentProgress()
		if p == nil {
			continue
		}
		pct := 0.0
		if p.BytesTotal > 0 {
			pct = float64(p.BytesDone) * 100 / float64(p.BytesTotal)
		}
		line := fmt.Sprintf("  %-16s %-15s %5.1f%% of %.1f GiB, %.1f MB/s, reported %s", termSafe(name), termSafe(p.Step), pct,
			float64(p.BytesTotal)/(1<<30), float64(p.RateBytesPerSecond)/1e6, p.At.UTC().Format(time.RFC3339))
		if p.AdvancedAt.Before(p.At) {
			line += ", no bytes since " + p.AdvancedAt.UTC().Format(time.RFC3339)
		}
		if p.Retry != "" {
			line += ", retrying: " + termSafe(p.Retry)
		}
		lines = append(lines, line)
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(w, "Progress:   %s\n", plural(len(lines), "deploy"))
	for i, l := range lines {
		if i == maxAttentionLines {
			fmt.Fprintf(w, "  ... %d more: machinactl server get NAME\n", len(lines)-maxAttentionLines)
			break
		}
		fmt.Fprintln(w, l)
	}
}

// writeGitLines says how the Git side fares (GET /api/v1/status's git):
// the inventory poller and the status write-back, each "ok" with the age
// of its last success, or FAILING with its consecutive failures and last
// error; and the commits the poller is behind the remote tip. Nothing
// for a controller without a repository (git absent).
func writeGitLines(w io.Writer, g *v1.GitHealth, now time.Time) {
	if g == nil {
		return
	}
	loop := func(label string, h v1.GitLoopHealth, extra string) {
		last := "never succeeded"
		if h.LastSuccess != nil {
			last = "last success " + now.Sub(*h.LastSuccess).Round(time.Second).String() + " ago"
		}
		if h.ConsecutiveFailures > 0 {
			state := "failing"
			if h.Failing {
				state = "FAILING"
			}
			fmt.Fprintf(w, "%s%s: %s, %s: %s\n", label, state, plural(h.ConsecutiveFailures, "consecutive failure"), last, termSafe(h.LastError))
			return
		}
		fmt.Fprintf(w, "%sok, %s%s\n", label, last, extra)
	}
	behind := ""
	switch {
	case g.Behind < 0:
		behind = ", the remote tip " + short12(g.RemoteTip) + " is not fetched"
	case g.Behind > 0:
		behind = fmt.Sprintf(", %s behind the remote tip %s", plural(g.Behind, "commit"), short12(g.RemoteTip))
	}
	loop("Git poll:   ", g.Poll, behind)
	pushed := ""
	if g.LastStatusCommit != "" {
		pushed = fmt.Sprintf(", last status commit %s (%d bytes pushed)", short12(g.LastStatusCommit), g.LastStatusPackBytes)
	}
	loop("Git push:   ", g.Push, pushed)
}

// writeInventoryLine says which revision the controller acts on, and an
// invalid newest one with its first errors.
func writeInventoryLine(w io.Writer, inv gitops.InventoryStatus) {
	// Inventory.
	switch {
	case inv.Invalid != nil:
		fmt.Fprintf(w, "Inventory:  INVALID at commit %s (%s); no new disk-writing operation starts\n", short12(inv.Invalid.Commit), plural(len(inv.Invalid.Errors), "error"))
		for i, fe := range inv.Invalid.Errors {
			if i == 3 {
				fmt.Fprintf(w, "            ... %d more in status/inventory.yaml\n", len(inv.Invalid.Errors)-3)
				break
			}
			fmt.Fprintf(w, "            %s\n", termSafe(fe.Error())) // quotes repository text (auto-enrol proposals carry machine data)
		}
		if inv.Good.Commit != "" {
			fmt.Fprintf(w, "            acting on the last good commit %s (inventory %s)\n", short12(inv.Good.Commit), shortDigest(inv.Good.Digest))
		} else {
			fmt.Fprintln(w, "            no good revision yet")
		}
	case inv.Good.Commit != "":
		fmt.Fprintf(w, "Inventory:  valid, acting on commit %s (inventory %s)\n", short12(inv.Good.Commit), shortDigest(inv.Good.Digest))
	default:
		fmt.Fprintln(w, "Inventory:  no revision read yet")
	}

}

// writeServersLine counts the servers by lifecycle, in lifecycle order.
func writeServersLine(w io.Writer, counts map[string]int) {
	// Servers by lifecycle.
	total := 0
	var parts []string
	seen := map[string]bool{}
	for _, lc := range lifecycleOrder {
		seen[lc] = true
		if n := counts[lc]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, lc))
			total += n
		}
	}
	var other []string
	for lc, n := range counts {
		if !seen[lc] && n > 0 {
			other = append(other, fmt.Sprintf("%d %s", n, lc))
			total += n
		}
	}
	sort.Strings(other)
	parts = append(parts, other...)
	if total == 0 {
		fmt.Fprintln(w, "Servers:    none registered")
	} else {
		fmt.Fprintf(w, "Servers:    %d: %s\n", total, strings.Join(parts, ", "))
	}

}

// writeSecretsLine says whether the secrets are sealed at rest.
func writeSecretsLine(w io.Writer, sealing bool, sealed, unsealed int) {
	// Secrets.
	switch {
	case !sealing:
		fmt.Fprintf(w, "Secrets:    UNSEALED: the controller has no master key (MACHINA_API_KEY_MASTER_KEY); %d stored in clear in the state file\n", sealed+unsealed)
	case unsealed > 0:
		fmt.Fprintf(w, "Secrets:    sealing on, but %d of %d still UNSEALED (stored before the master key was set): set them again\n", unsealed, sealed+unsealed)
	default:
		fmt.Fprintf(w, "Secrets:    sealed at rest (%d)\n", sealed)
	}

}

// writePlanLines says what is pending, what the brake holds, and the
// plan's conditions.
func writePlanLines(w io.Writer, res plan.Result) {
	// Plan.
	if len(res.Steps) == 0 {
		fmt.Fprintln(w, "Plan:       nothing pending")
	} else {
		fmt.Fprintf(w, "Plan:       %s pending\n", plural(len(res.Steps), "step"))
	}
	if res.Brake != "" {
		fmt.Fprintf(w, "HELD:       %s: %s\n", plural(len(res.Held), "step"), termSafe(res.Brake))
	}
	shown := 0
	for _, c := range res.Conditions {
		if c.Type == "Held" {
			continue // shown above
		}
		if shown == maxConditionLines {
			fmt.Fprintf(w, "            ... more conditions: machinactl plan\n")
			break
		}
		shown++
		fmt.Fprintf(w, "            %s %s: %s\n", termSafe(c.Subject), c.Type, oneLine(c.Message, 120))
	}

}

// attentionConds picks, per server, the plan condition status names it
// with (a Failing one first: it is why the rest waits) and the Waiting
// (BehindAction) conditions said on their own lines, and returns the
// names of the known servers and of those only a condition names.
func attentionConds(res plan.Result, snap state.Snapshot) (conds map[string]plan.Condition, waits map[string][]plan.Condition, names []string) {
	conds, waits = map[string]plan.Condition{}, map[string][]plan.Condition{}
	names = sortedNames(snap.Servers)
	for _, c := range res.Conditions {
		name, ok := strings.CutPrefix(c.Subject, "server/")
		// Not listed: a wipe or a deploy with a changed image (moving), a
		// never-commissioned server that is to be retired (at rest).
		if !ok || c.Type == "WipePending" || c.Type == plan.CondImageChanged || c.Reason == "NeverCommissioned" {
			continue
		}
		if c.Reason == plan.ReasonBehindAction {
			waits[name] = append(waits[name], c)
		}
		prev, dup := conds[name]
		if dup && (prev.Type == plan.CondFailing || c.Type != plan.CondFailing) {
			continue
		}
		conds[name] = c
		if _, known := snap.Servers[name]; !known && !dup {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return conds, waits, names
}

// writeAttention lists the servers that need a human, or that are not
// moving and why.
func writeAttention(w io.Writer, res plan.Result, snap state.Snapshot) {
	// Servers that need a human, or that are not moving and why: failed,
	// stalled, an unreadable BMC (not for retired servers, which the sweep
	// does not read), or a plan condition naming the server (a deploy
	// waiting for its image, a server that cannot be commissioned, ...).
	conds, waits, names := attentionConds(res, snap)
	sort.Strings(names)
	var attn []string
	servers := 0
	for _, name := range names {
		s, known := snap.Servers[name]
		if !known {
			s = &state.Server{Name: name} // a condition without a record
		}
		c, hasCond := conds[name]
		what := ""
		switch {
		case known && s.Lifecycle == state.LifecycleFailed:
			what = "failed"
		case known && s.Stalled != "":
			what = "stalled (" + string(s.Lifecycle) + ")"
		case known && s.BMCError != "" && s.Lifecycle != state.LifecycleRetired:
			what = "BMC unreadable"
		case hasCond && c.Type == plan.CondFailing:
			what = "failing"
		case hasCond:
			what = c.Type
		default:
			continue
		}
		msg := s.LastError
		switch what {
		case "BMC unreadable":
			msg = s.BMCError
		case c.Type, "failing":
			msg = c.Message
		}
		if msg == "" {
			msg = "no error recorded"
		}
		width := 100
		if what == "failing" {
			width = 160 // the action, the count, the next retry and the error
		}
		attn = append(attn, fmt.Sprintf("  %-16s %-22s %s", termSafe(name), what, oneLine(msg, width)))
		servers++
		for _, wc := range waits[name] {
			if wc != c {
				attn = append(attn, fmt.Sprintf("  %-16s %-22s %s", "", "waiting", oneLine(wc.Message, 100)))
			}
		}
	}
	if len(attn) == 0 {
		fmt.Fprintln(w, "Attention:  no failed, stalled or waiting servers, no unreadable BMCs")
		return
	}
	fmt.Fprintf(w, "Attention:  %s\n", plural(servers, "server"))
	for i, l := range attn {
		if i == maxAttentionLines {
			fmt.Fprintf(w, "  ... %d more: machinactl plan, status/README.md\n", len(attn)-maxAttentionLines)
			break
		}
		fmt.Fprintln(w, l)
	}
}

func sortedNames(m map[string]*state.Server) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func short12(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// oneLine flattens s to one line of at most n bytes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(termSafe(s)), " ")
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n-3], "") + "..."
	}
	return s
}

// writeHostStatus renders the joined hosts' line and one line per host
// with a condition: HostLost (with the power its BMC read: "lost, powered
// on" is running but unreachable, "lost, powered off" is down), Fenced, or
// FenceFailed (fenced, and heartbeats all the same).
func writeHostStatus(w io.Writer, hosts []v1.Host) {
	if len(hosts) == 0 {
		fmt.Fprintln(w, "Hosts:      none joined")
		return
	}
	lost, fenced := 0, 0
	var lines []string
	for _, h := range hosts {
		if h.Lost != nil {
			lost++
		}
		if h.Fenced != nil {
			fenced++
		}
		for _, c := range h.Conditions {
			lines = append(lines, fmt.Sprintf("  %-16s %-10s %s", termSafe(h.Name), c.Type, oneLine(c.Message, 110)))
		}
	}
	fmt.Fprintf(w, "Hosts:      %d joined, %d lost, %d fenced\n", len(hosts), lost, fenced)
	for i, l := range lines {
		if i == maxAttentionLines {
			fmt.Fprintf(w, "  ... %d more: machinactl host list\n", len(lines)-maxAttentionLines)
			break
		}
		fmt.Fprintln(w, l)
	}
}
