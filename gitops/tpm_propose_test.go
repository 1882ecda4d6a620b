package gitops

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan/plantest"
	"github.com/machina-metal/machina/state"
)

// TestTPMPinnerProposes: a server whose TPM attested gets its EK pinned in
// servers.yaml on a tpm/DATE review branch (valid inventory, main
// untouched, every other line kept); a second pass proposes nothing, nor
// does a server already pinned.
func TestTPMPinnerProposes(t *testing.T) {
	repo := newTestRepo(t)
	st := openEnrolStore(t)
	inv := plantest.Example(t)
	day := time.Date(2026, 12, 6, 6, 0, 0, 0, time.UTC)
	prop, err := NewProposer(ProposerConfig{Remote: Remote{URL: repo.url()}, StateDir: t.TempDir(), BranchPrefix: "tpm", Now: func() time.Time { return day }, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewTPMPinner(TPMPinConfig{Store: st, Desired: func() *inventory.Inventory { return inv }, Proposer: prop, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if n, err := p.ProposePending(ctx); n != 0 || err != nil {
		t.Fatalf("ProposePending with no attested TPM = %d, %v", n, err)
	}
	name := inv.Servers[0].Name
	if _, err := st.CreateServer(state.Server{Name: name, BootMAC: inv.Servers[0].BootMAC}); err != nil {
		t.Fatal(err)
	}
	ek := "sha256:" + strings.Repeat("5a", 32)
	if _, err := st.UpdateServer(name, func(s *state.Server) error { s.TPM = &state.TPM{EK: ek}; return nil }); err != nil {
		t.Fatal(err)
	}
	mainBefore := repo.remoteHead("main")
	if n, err := p.ProposePending(ctx); n != 1 || err != nil {
		t.Fatalf("ProposePending = %d, %v; want 1", n, err)
	}
	if h := repo.remoteHead("main"); h != mainBefore {
		t.Errorf("main moved to %s", h)
	}
	branch := repo.remoteHead("tpm/2026-12-06")
	servers := readRemoteServers(t, repo, branch)
	files := map[string][]byte{inventory.ServersFile: servers}
	for _, f := range []string{inventory.ProfilesFile, inventory.ImagesFile, inventory.NetworksFile} {
		files[f] = []byte(repo.read(f))
	}
	res, err := inventory.Load(mapFSOf(files), inventory.Limits{})
	if err != nil {
		t.Fatalf("proposed inventory invalid: %v", err)
	}
	if s := res.Inventory.Server(name); s == nil || s.TPM == nil || s.TPM.EK != ek {
		t.Fatalf("proposed %s = %+v", name, s)
	}
	// Every other line is kept byte for byte: without the two tpm lines
	// the file is main's.
	var kept []string
	for _, l := range strings.SplitAfter(string(servers), "\n") {
		if strings.TrimSpace(l) != "tpm:" && !strings.Contains(l, ek) {
			kept = append(kept, l)
		}
	}
	if before := repo.read(inventory.ServersFile); strings.Join(kept, "") != before || len(kept) != strings.Count(string(servers), "\n")-2+1 {
		t.Errorf("other lines changed:\n%s", servers)
	}
	srv, _ := st.Server(name)
	if srv.TPM.Proposed != ek || srv.TPM.ProposalBranch != "tpm/2026-12-06" {
		t.Errorf("server TPM after the proposal = %+v", srv.TPM)
	}
	if n, err := p.ProposePending(ctx); n != 0 || err != nil {
		t.Errorf("second ProposePending = %d, %v; want nothing", n, err)
	}
	// Once merged (the inventory pins it), nothing is proposed even for a
	// new EK: a pinned server's other EK is refused, not re-proposed.
	inv.Servers[0].TPM = &inventory.TPM{EK: ek}
	if _, err := st.UpdateServer(name, func(s *state.Server) error { s.TPM = &state.TPM{EK: "sha256:" + strings.Repeat("77", 32)}; return nil }); err != nil {
		t.Fatal(err)
	}
	if n, err := p.ProposePending(ctx); n != 0 || err != nil {
		t.Errorf("ProposePending for a pinned server = %d, %v; want nothing", n, err)
	}
}
