package images

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/machina-metal/machina/internal/peertest"
)

// buildISO makes an ISO 9660 image of files (path → content) with xorriso.
func buildISO(t *testing.T, files map[string]string) string {
	t.Helper()
	peertest.Command(t, "xorriso")
	dir := t.TempDir()
	for p, c := range files {
		full := filepath.Join(dir, "tree", p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	iso := filepath.Join(dir, "test.iso")
	out, err := exec.Command("xorriso", "-as", "mkisofs", "-quiet", "-R", "-V", "MACHINA_TEST", "-o", iso, filepath.Join(dir, "tree")).CombinedOutput()
	if err != nil {
		t.Fatalf("xorriso: %v\n%s", err, out)
	}
	return iso
}

func importISO(t *testing.T, e *testEnv, name, iso string, installer bool) (Record, error) {
	t.Helper()
	b, err := os.ReadFile(iso)
	if err != nil {
		t.Fatal(err)
	}
	return e.im.Import(context.Background(), Request{Name: name, URL: "file://" + iso, Checksum: sha256Of(b).String(), Installer: installer})
}

// TestInstallerTree imports tiny installer ISOs built with xorriso and
// extracts their kernels and initrds (Ubuntu casper/, RHEL
// images/pxeboot/ plus the whole tree for anaconda's stage2 and repo);
// an ISO without the kind's files is ErrNotInstaller; an ISO is refused
// as a disk image.
func TestInstallerTree(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.AllowFileURLs = true })
	ubuntu := buildISO(t, map[string]string{"casper/vmlinuz": "ubuntu-kernel", "casper/initrd": "ubuntu-initrd", "casper/filesystem.squashfs": "big"})
	rhel := buildISO(t, map[string]string{"images/pxeboot/vmlinuz": "rhel-kernel", "images/pxeboot/initrd.img": "rhel-initrd",
		"images/install.img": "stage2", ".treeinfo": "[general]\n", "BaseOS/repodata/repomd.xml": "<repomd/>"})

	if _, err := importISO(t, e, "ubuntu-disk", ubuntu, false); !errors.Is(err, ErrUnsupportedFormat) {
		t.Fatalf("ISO imported as a disk image: %v, want ErrUnsupportedFormat", err)
	}
	rec, err := importISO(t, e, "ubuntu-live", ubuntu, true)
	if err != nil {
		t.Fatal(err)
	}
	if rec.SourceFormat != FormatISO {
		t.Errorf("source format %s, want iso9660", rec.SourceFormat)
	}
	if _, err := e.store.InstallerReady("ubuntu-live", InstallerAutoinstall); !errors.Is(err, ErrNotFound) {
		t.Errorf("InstallerReady before extraction: %v, want ErrNotFound", err)
	}
	dir, err := e.store.InstallerTree(context.Background(), "ubuntu-live", InstallerAutoinstall)
	if err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"casper/vmlinuz": "ubuntu-kernel", "casper/initrd": "ubuntu-initrd"} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", f, b, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "casper/filesystem.squashfs")); err == nil {
		t.Error("autoinstall extraction copied more than the kernel and initrd")
	}
	if again, err := e.store.InstallerReady("ubuntu-live", InstallerAutoinstall); err != nil || again != dir {
		t.Errorf("InstallerReady = %q, %v; want the cached %q", again, err, dir)
	}
	if _, err := e.store.InstallerTree(context.Background(), "ubuntu-live", InstallerKickstart); !errors.Is(err, ErrNotInstaller) {
		t.Errorf("Ubuntu ISO as kickstart: %v, want ErrNotInstaller", err)
	}

	if _, err := importISO(t, e, "rhel-9", rhel, true); err != nil {
		t.Fatal(err)
	}
	dir, err = e.store.InstallerTree(context.Background(), "rhel-9", InstallerKickstart)
	if err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"images/pxeboot/vmlinuz": "rhel-kernel", "images/pxeboot/initrd.img": "rhel-initrd",
		"images/install.img": "stage2", ".treeinfo": "[general]\n", "BaseOS/repodata/repomd.xml": "<repomd/>"} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", f, b, err, want)
		}
	}
	if _, err := e.store.InstallerTree(context.Background(), "missing", InstallerKickstart); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown image: %v, want ErrNotFound", err)
	}
}
