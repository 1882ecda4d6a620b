package sim_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// buildInstallerISO makes a tiny ISO 9660 image with xorriso holding fake
// installer files, writes it into the lab's mirror as name.iso and returns
// its SHA-256.
func buildInstallerISO(t *testing.T, mirrorDir, name string, files map[string]string) string {
	t.Helper()
	peertest.Command(t, "xorriso")
	tree := filepath.Join(t.TempDir(), name)
	for p, c := range files {
		full := filepath.Join(tree, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	iso := filepath.Join(mirrorDir, name+".iso")
	if out, err := exec.Command("xorriso", "-as", "mkisofs", "-quiet", "-R", "-V", strings.ToUpper(strings.ReplaceAll(name, "-", "_")), "-o", iso, tree).CombinedOutput(); err != nil {
		t.Fatalf("xorriso: %v\n%s", err, out)
	}
	b, err := os.ReadFile(iso)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

const installerKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1"

// TestInstallerDeploys: a server pinned to a `deploy:
// autoinstall` profile and one pinned to a `deploy: kickstart` profile go
// through the installer path. Their images are tiny ISOs built here with
// xorriso (fake casper/vmlinuz and casper/initrd; fake
// images/pxeboot/vmlinuz, initrd.img, images/install.img and .treeinfo),
// imported from the lab's mirror by checksum; the controller extracts the
// kernels and initrds; each simulated machine PXE-boots the controller's
// installer iPXE script, fetches the kernel and initrd, the ISO (Ubuntu) or
// stage2 (RHEL), and the NoCloud user-data or kickstart with its install
// token, checks the document parses and holds the real join command and
// the completion callback, writes the OS to its disk, POSTs the callback;
// the server becomes deployed, the boot override goes back to disk, and the
// machine boots its disk and joins the fleet. No real installer runs here.
func TestInstallerDeploys(t *testing.T) {
	r := startRig(t, rigOptions{})
	r.steady()
	mirror := filepath.Join(r.dir, "lab", "mirror")
	ubuntuSum := buildInstallerISO(t, mirror, "ubuntu-live", map[string]string{
		"casper/vmlinuz": "fake ubuntu kernel", "casper/initrd": "fake ubuntu initrd", "casper/filesystem.squashfs": "fake squashfs"})
	rhelSum := buildInstallerISO(t, mirror, "rhel-dvd", map[string]string{
		"images/pxeboot/vmlinuz": "fake rhel kernel", "images/pxeboot/initrd.img": "fake rhel initrd",
		"images/install.img": "fake stage2", ".treeinfo": "[general]\nname = fake\n", "BaseOS/repodata/repomd.xml": "<repomd/>"})
	seq := r.lastSeq()

	r.commit("installer profiles", func(dir string) {
		appendFile(t, filepath.Join(dir, inventory.ImagesFile), fmt.Sprintf(
			"  - name: ubuntu-live\n    url: %s/ubuntu-live.iso\n    checksum: sha256:%s\n  - name: rhel-dvd\n    url: %s/rhel-dvd.iso\n    checksum: sha256:%s\n",
			r.lab.MirrorURL, ubuntuSum, r.lab.MirrorURL, rhelSum))
		for _, p := range []struct{ name, image, deploy string }{{"ubuntu-auto", "ubuntu-live", "autoinstall"}, {"rhel-ks", "rhel-dvd", "kickstart"}} {
			appendFile(t, filepath.Join(dir, inventory.ProfilesFile), fmt.Sprintf(
				"  - name: %s\n    image: %s\n    deploy: %s\n    sshKeys:\n      - %q\n    min: {cores: 1, memoryGiB: 1, diskGiB: 1}\n    join: {site: lab1, tags: [installer]}\n",
				p.name, p.image, p.deploy, installerKey))
		}
		r.setServer(dir, "r3-n01", "want", "deployed")
		r.setServer(dir, "r3-n01", "profile", "ubuntu-auto")
		r.setServer(dir, "r3-n02", "want", "deployed")
		r.setServer(dir, "r3-n02", "profile", "rhel-ks")
	})
	for name, want := range map[string]struct {
		profile, installer string
		boot               []string
	}{
		"r3-n01": {"ubuntu-auto", "autoinstall", []string{"fake ubuntu kernel", "fake ubuntu initrd"}},
		"r3-n02": {"rhel-ks", "kickstart", []string{"fake rhel kernel", "fake rhel initrd"}},
	} {
		srv := r.waitServer(name, "deployed by the installer", time.Minute, func(s state.Server) bool {
			return s.Lifecycle == state.LifecycleDeployed && !s.FinishDeploy && s.InFlight == nil
		})
		if srv.Allocation == nil || srv.Allocation.Profile != want.profile || srv.Allocation.Deploy != want.installer {
			t.Errorf("%s: allocation %+v, want profile %s deploy %s", name, srv.Allocation, want.profile, want.installer)
		}
		m := r.lab.Machine(name)
		r.waitMachine(m, sim.PhaseOS)
		if got, boot := m.Installed(); got != want.installer || !slices.Equal(boot, want.boot) {
			t.Errorf("%s installed by %q booting %q, want %q booting the ISO's %q", name, got, boot, want.installer, want.boot)
		}
		r.waitFor(name+" joined", time.Minute, func(state.Snapshot) bool { return m.Joined() })
		var kinds, msgs []string
		for _, e := range r.events(name, seq) {
			kinds = append(kinds, string(e.Kind))
			msgs = append(msgs, e.Message)
		}
		if !slices.ContainsFunc(msgs, func(s string) bool { return strings.Contains(s, "installer finished (completion callback)") }) {
			t.Errorf("%s: no completion callback event: %v", name, msgs)
		}
		if slices.Contains(kinds, "token.refused") {
			t.Errorf("%s: a token was refused: %v", name, msgs)
		}
		r.waitStatus(gitops.ServerStatusPath(name), "lifecycle: deployed")
	}
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(b, s...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestInstallerDeadline: an installer that never calls back (its
// ISO has no stage2 image, so the simulated anaconda stops) is failed by
// the deploy deadline like an image deploy: failed with the reason,
// allocation dropped, powered off through the BMC.
func TestInstallerDeadline(t *testing.T) {
	r := startRig(t, rigOptions{plan: plan.Options{DeployTimeout: 8 * time.Second}})
	r.steady()
	sum := buildInstallerISO(t, filepath.Join(r.dir, "lab", "mirror"), "rhel-broken", map[string]string{
		"images/pxeboot/vmlinuz": "fake rhel kernel", "images/pxeboot/initrd.img": "fake rhel initrd", ".treeinfo": "[general]\n"})
	r.commit("broken installer", func(dir string) {
		appendFile(t, filepath.Join(dir, inventory.ImagesFile), fmt.Sprintf("  - name: rhel-broken\n    url: %s/rhel-broken.iso\n    checksum: sha256:%s\n", r.lab.MirrorURL, sum))
		appendFile(t, filepath.Join(dir, inventory.ProfilesFile), fmt.Sprintf(
			"  - name: rhel-broken\n    image: rhel-broken\n    deploy: kickstart\n    sshKeys:\n      - %q\n    min: {cores: 1, memoryGiB: 1, diskGiB: 1}\n", installerKey))
		r.setServer(dir, "r3-n02", "want", "deployed")
		r.setServer(dir, "r3-n02", "profile", "rhel-broken")
	})
	srv := r.waitServer("r3-n02", "failed by the deploy deadline", time.Minute, func(s state.Server) bool {
		return s.Lifecycle == state.LifecycleFailed && s.InFlight == nil
	})
	if !strings.Contains(srv.LastError, "deploy did not report within 8s") || srv.Allocation != nil || srv.Power.State != state.PowerOff {
		t.Errorf("r3-n02: lastError %q allocation %v power %s; want the deadline, none, off", srv.LastError, srv.Allocation, srv.Power.State)
	}
	r.waitMachine(r.lab.Machine("r3-n02"), sim.PhaseOff)
	if kind, _ := r.lab.Machine("r3-n02").Installed(); kind != "" {
		t.Errorf("r3-n02 reports an install by %q", kind)
	}
}
