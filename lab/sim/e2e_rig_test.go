package sim_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/lab/sim/simtest"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// rig is the harness with a controller that can be stopped and started
// again on the same state file, work folder and address (a restart), and
// with a hook to inject faults into the lab before the controller acts.
type rig struct {
	*harness
	dir    string
	listen string
	log    *slog.Logger
	plan   plan.Options
	config func(*controller.Config)

	ctl *simtest.Controller // the running controller, nil while stopped
	// secrets are stored besides the lab's BMC credentials on start.
	secrets map[string]state.Credential
}

type rigOptions struct {
	lab sim.Config
	// before runs after the lab started and before the controller does.
	before func(*sim.Lab)
	// plan overrides the reconciler's plan options (deadlines).
	plan plan.Options
	// config, when set, edits the controller's configuration (auto-enrol).
	config func(*controller.Config)
	// secrets are stored in the controller's secret store on start, next
	// to the lab's BMC credentials (a CA bundle).
	secrets map[string]state.Credential
	// ipmi keeps OpenIPMI's ipmi_sim as the BMC of the inventory's IPMI
	// servers (r1-n04, r1-n05, r2-n03, r3-n03), with their serial consoles;
	// lab.BMC is then nil for those.
	ipmi bool
}

func startRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	labCtx, labCancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	cfg := o.lab
	cfg.Dir = filepath.Join(dir, "lab")
	// These tests read and clear BMC requests of any server: Redfish
	// BMCs everywhere (IPMI is covered by TestExampleSiteEndToEnd), unless
	// the test asks for ipmi_sim.
	cfg.RedfishOnly = !o.ipmi
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg.Logger = log.With("lab", "sim")
	lab, err := sim.Start(labCtx, cfg)
	if err != nil {
		labCancel()
		t.Fatal(err)
	}
	requireIPMIPeers(t, lab, labCancel)
	r := &rig{harness: &harness{t: t, lab: lab}, dir: dir, listen: "127.0.0.1:0", log: log, plan: o.plan, config: o.config, secrets: o.secrets}
	t.Cleanup(func() {
		if r.ctl != nil {
			r.stopController()
		}
		labCancel()
		lab.Close()
	})
	if o.before != nil {
		o.before(lab)
	}
	r.startController()
	return r
}

// startController runs controller.Run on the rig's state file and work
// folder; after the first start it listens on the same address again, as a
// restarted controller does (the machines' ramdisks hold its URL).
func (r *rig) startController() {
	r.t.Helper()
	lab := r.lab
	cfg := simtest.Config(r.dir, lab, r.log.With("lab", "controller"))
	cfg.Listen = r.listen
	cfg.Reconciler.Plan = r.plan
	// The BMC sweep's reads would show in the BMC request logs these tests
	// check; TestBMCSweep turns it on.
	cfg.BMCWatchInterval = -1
	cfg.OnReady = func(run *controller.Running) {
		if err := simtest.PutLabSecrets(run.Store, lab); err != nil {
			r.t.Error(err)
		}
		for name, c := range r.secrets {
			if _, err := run.Store.PutSecret(name, c, "test"); err != nil {
				r.t.Errorf("put secret: %v", err)
			}
		}
		lab.SetController(run.URL)
	}
	if r.config != nil {
		r.config(&cfg)
	}
	c, err := simtest.Start(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.ctl, r.run, r.listen = c, c.Run, c.Run.Addr.String()
}

// firstInPhase waits up to a minute for a machine of the lab to be in
// phase p (what names it in the failure) and returns its name.
func (r *rig) firstInPhase(p sim.Phase, what string) string {
	r.t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		for _, m := range r.lab.Machines() {
			if m.Phase() == p {
				return m.Name
			}
		}
	}
	r.t.Fatalf("no machine seen %s", what)
	return ""
}

// stopController ends controller.Run through its ctx and waits for it,
// after checking that no part of the controller (plan, dispatch, status,
// API) nor the test wrote through a server record a snapshot shared.
func (r *rig) stopController() {
	r.t.Helper()
	if err := r.run.Store.CheckSharedRecords(); err != nil {
		r.t.Error(err)
	}
	if err := r.ctl.Stop(); err != nil {
		r.t.Errorf("controller: %v", err)
	}
	r.ctl = nil
}

// steady waits for the example site to settle: 11 servers commissioned (one
// is retired in the example), hypervisor 2 and storage 1 deployed and
// booted from disk, nothing in flight.
func (r *rig) steady() state.Snapshot {
	r.t.Helper()
	r.t.Cleanup(func() {
		if r.t.Failed() {
			for _, m := range r.lab.Machines() {
				r.t.Logf("machine %s: phase %s, boots %d", m.Name, m.Phase(), m.Boots())
			}
		}
	})
	return r.waitFor("example site steady", time.Minute, func(s state.Snapshot) bool {
		deployed := 0
		for _, srv := range s.Servers {
			switch srv.Lifecycle {
			case state.LifecycleReady:
			case state.LifecycleDeployed:
				if srv.FinishDeploy || r.lab.Machine(srv.Name).Phase() != sim.PhaseOS {
					return false
				}
				deployed++
			case state.LifecycleNew:
				if srv.Name != "r3-n03" {
					return false
				}
			default:
				return false
			}
			if srv.InFlight != nil {
				return false
			}
		}
		return len(s.Servers) == 12 && deployed == 3
	})
}

// commit brings the operator's clone to the remote's tip (the controller
// pushes status commits), applies edit, commits and pushes, and asks the
// controller to poll now. A push that loses the race with a status commit
// is redone on the new tip, as an operator would. It returns the commit id.
func (r *rig) commit(msg string, edit func(dir string)) string {
	r.t.Helper()
	repo, err := git.PlainOpen(r.lab.Clone)
	if err != nil {
		r.t.Fatal(err)
	}
	wt, err := repo.Worktree()
	if err != nil {
		r.t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		if err := repo.Fetch(&git.FetchOptions{RemoteName: "origin"}); err != nil && err != git.NoErrAlreadyUpToDate {
			r.t.Fatalf("fetch: %v", err)
		}
		tip, err := repo.Reference(plumbing.NewRemoteReferenceName("origin", "main"), true)
		if err != nil {
			r.t.Fatal(err)
		}
		if err := wt.Reset(&git.ResetOptions{Commit: tip.Hash(), Mode: git.HardReset}); err != nil {
			r.t.Fatal(err)
		}
		edit(r.lab.Clone)
		if err := wt.AddGlob("."); err != nil {
			r.t.Fatal(err)
		}
		sig := &object.Signature{Name: "op", Email: "op@sim.invalid", When: time.Now()}
		id, err := wt.Commit(msg, &git.CommitOptions{Author: sig, Committer: sig})
		if err != nil {
			r.t.Fatal(err)
		}
		err = repo.Push(&git.PushOptions{RemoteName: "origin"})
		if err == nil {
			r.run.Source.Trigger()
			return id.String()
		}
		if attempt == 20 {
			r.t.Fatalf("push: %v", err)
		}
		r.t.Logf("push lost a race (%v); redoing the commit on the new tip", err)
		// Back off (jittered) so a loaded machine's status writer, which
		// pushes every few hundred ms here, cannot win every retry.
		time.Sleep(time.Duration(attempt) * time.Duration(20+rand.IntN(40)) * time.Millisecond)
	}
}

// editBlock rewrites the YAML list item "  - name: NAME" of file in dir.
func (r *rig) editBlock(dir, file, name string, f func(block string) string) {
	r.t.Helper()
	path := filepath.Join(dir, file)
	b, err := os.ReadFile(path)
	if err != nil {
		r.t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "  - name: "+name+"\n")
	if start < 0 {
		r.t.Fatalf("%s has no item %s", file, name)
	}
	end := strings.Index(s[start+1:], "\n  - name: ")
	if end < 0 {
		end = len(s)
	} else {
		end += start + 2
	}
	s = s[:start] + f(s[start:end]) + s[end:]
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// setField sets "    key: value" in a list item, replacing the line when
// the key is there.
func setField(block, key, value string) string {
	lines := strings.SplitAfter(block, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "    "+key+":") {
			lines[i] = "    " + key + ": " + value + "\n"
			return strings.Join(lines, "")
		}
	}
	return strings.TrimSuffix(block, "\n") + "\n    " + key + ": " + value + "\n"
}

// setServer sets a field of server name in servers.yaml.
func (r *rig) setServer(dir, name, key, value string) {
	r.editBlock(dir, inventory.ServersFile, name, func(b string) string { return setField(b, key, value) })
}

// setActions sets the action counters of server name.
func (r *rig) setActions(dir, name string, a inventory.Actions) {
	r.setServer(dir, name, "actions", fmt.Sprintf("{commission: %d, powerCycle: %d, powerOn: %d, powerOff: %d}", a.Commission, a.PowerCycle, a.PowerOn, a.PowerOff))
}

// setCount sets profile's count in profiles.yaml.
func (r *rig) setCount(dir, profile string, n int) {
	r.editBlock(dir, inventory.ProfilesFile, profile, func(b string) string { return setField(b, "count", fmt.Sprint(n)) })
}

// waitServer waits until server name satisfies cond.
func (r *rig) waitServer(name, what string, d time.Duration, cond func(state.Server) bool) state.Server {
	r.t.Helper()
	snap := r.waitFor(name+" "+what, d, func(s state.Snapshot) bool {
		srv, ok := s.Servers[name]
		return ok && cond(*srv)
	})
	return *snap.Servers[name]
}

// bmcWrites returns the non-GET requests name's BMC answered (session
// logins excluded), formatted "METHOD path".
func (r *rig) bmcWrites(name string) []string {
	var out []string
	for _, q := range r.lab.BMC(name).Requests() {
		if q.Method == http.MethodGet || strings.HasSuffix(q.Path, "/SessionService/Sessions") {
			continue
		}
		out = append(out, q.Method+" "+q.Path)
	}
	return out
}

// bootOverride reads the boot override name's bmcsim BMC holds now, from
// the resource the controller last PATCHed a Boot object to (the System,
// or its settings object); ok is false for a server without a bmcsim BMC
// (IPMI servers run behind ipmi_sim) or one never PATCHed.
func (r *rig) bootOverride(name string) (target, enabled string, ok bool) {
	b := r.lab.BMC(name)
	if b == nil {
		return "", "", false
	}
	path := ""
	for _, q := range b.Requests() {
		if _, boot := q.Body["Boot"]; q.Method == http.MethodPatch && boot {
			path = q.Path
		}
	}
	if path == "" {
		return "", "", false
	}
	boot, _ := b.Get(path)["Boot"].(map[string]any)
	target, _ = boot["BootSourceOverrideTarget"].(string)
	enabled, _ = boot["BootSourceOverrideEnabled"].(string)
	return target, enabled, true
}

// resets counts the ComputerSystem.Reset actions name's BMC accepted.
func (r *rig) resets(name string) int {
	n := 0
	for _, q := range r.lab.BMC(name).Requests() {
		if q.Method == http.MethodPost && strings.HasSuffix(q.Path, "ComputerSystem.Reset") && q.Status < 300 {
			n++
		}
	}
	return n
}

// events returns server name's events after seq.
func (r *rig) events(name string, after uint64) []state.Event {
	r.t.Helper()
	evs, err := r.run.Store.Events(state.EventQuery{Server: name, After: after, Limit: state.MaxPageSize})
	if err != nil {
		r.t.Fatal(err)
	}
	return evs
}

// lastSeq returns the sequence number of the newest event.
func (r *rig) lastSeq() uint64 {
	r.t.Helper()
	var seq uint64
	for {
		evs, err := r.run.Store.Events(state.EventQuery{After: seq, Limit: state.MaxPageSize})
		if err != nil {
			r.t.Fatal(err)
		}
		if len(evs) == 0 {
			return seq
		}
		seq = evs[len(evs)-1].Seq
	}
}

// moves counts name's lifecycle events into to.
func moves(evs []state.Event, to state.Lifecycle) int {
	n := 0
	for _, e := range evs {
		if e.To == to && e.From != to {
			n++
		}
	}
	return n
}

// admin calls the admin API with a fresh admin token and returns the
// status code and body.
func (r *rig) admin(method, path string, body any) (int, []byte) {
	r.t.Helper()
	tok, _, err := r.run.Store.CreateAdminToken(fmt.Sprintf("e2e-%d", time.Now().UnixNano()), "test")
	if err != nil {
		r.t.Fatal(err)
	}
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, r.run.URL+path, rd)
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// seenByController reports whether the controller's Git clone holds commit.
func (r *rig) seenByController(commit string) bool {
	repo, err := git.PlainOpen(filepath.Join(r.dir, "work", "git", "inventory.git"))
	if err != nil {
		return false
	}
	_, err = repo.CommitObject(plumbing.NewHash(commit))
	return err == nil
}

// diskPrint is what the tests compare of a disk file: size, modification
// time and a hash of its first 16 MiB and last 1 MiB (the image, the seed
// and the signature areas the agent writes or wipes).
type diskPrint struct {
	size  int64
	mod   time.Time
	head  [32]byte
	tail  [32]byte
	valid bool
}

func printDisk(t *testing.T, path string) diskPrint {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, min(16<<20, st.Size()))
	if _, err := f.ReadAt(head, 0); err != nil {
		t.Fatal(err)
	}
	tail := make([]byte, min(1<<20, st.Size()))
	if _, err := f.ReadAt(tail, st.Size()-int64(len(tail))); err != nil {
		t.Fatal(err)
	}
	return diskPrint{size: st.Size(), mod: st.ModTime(), head: sha256.Sum256(head), tail: sha256.Sum256(tail), valid: true}
}

// lineOf returns the 1-based line of the first line of file in dir that
// contains text.
func lineOf(t *testing.T, path, text string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, text) {
			return i + 1
		}
	}
	t.Fatalf("%s has no line with %q", path, text)
	return 0
}

// record is name's record in s, or a zero record when s has none (as a
// map of values read before snapshots shared their records); read-only.
func record(s state.Snapshot, name string) *state.Server {
	if srv, ok := s.Servers[name]; ok {
		return srv
	}
	return &state.Server{Name: name}
}
