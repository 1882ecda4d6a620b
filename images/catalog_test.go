package images

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDefaultCatalogResolve(t *testing.T) {
	c, err := DefaultCatalog()
	if err != nil {
		t.Fatalf("DefaultCatalog() = %v", err)
	}
	want := map[string][2]string{
		"ubuntu-26.04/amd64": {"https://cloud-images.ubuntu.com/releases/26.04/release/ubuntu-26.04-server-cloudimg-amd64.img", "https://cloud-images.ubuntu.com/releases/26.04/release/SHA256SUMS"},
		"ubuntu-26.04/arm64": {"https://cloud-images.ubuntu.com/releases/26.04/release/ubuntu-26.04-server-cloudimg-arm64.img", "https://cloud-images.ubuntu.com/releases/26.04/release/SHA256SUMS"},
		"ubuntu-24.04/amd64": {"https://cloud-images.ubuntu.com/releases/24.04/release/ubuntu-24.04-server-cloudimg-amd64.img", "https://cloud-images.ubuntu.com/releases/24.04/release/SHA256SUMS"},
		"ubuntu-24.04/arm64": {"https://cloud-images.ubuntu.com/releases/24.04/release/ubuntu-24.04-server-cloudimg-arm64.img", "https://cloud-images.ubuntu.com/releases/24.04/release/SHA256SUMS"},
		"ubuntu-22.04/amd64": {"https://cloud-images.ubuntu.com/releases/22.04/release/ubuntu-22.04-server-cloudimg-amd64.img", "https://cloud-images.ubuntu.com/releases/22.04/release/SHA256SUMS"},
		"ubuntu-22.04/arm64": {"https://cloud-images.ubuntu.com/releases/22.04/release/ubuntu-22.04-server-cloudimg-arm64.img", "https://cloud-images.ubuntu.com/releases/22.04/release/SHA256SUMS"},
		"debian-13/amd64":    {"https://cloud.debian.org/images/cloud/trixie/latest/debian-13-genericcloud-amd64.qcow2", "https://cloud.debian.org/images/cloud/trixie/latest/SHA512SUMS"},
		"debian-13/arm64":    {"https://cloud.debian.org/images/cloud/trixie/latest/debian-13-genericcloud-arm64.qcow2", "https://cloud.debian.org/images/cloud/trixie/latest/SHA512SUMS"},
		"debian-12/amd64":    {"https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2", "https://cloud.debian.org/images/cloud/bookworm/latest/SHA512SUMS"},
		"debian-12/arm64":    {"https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-arm64.qcow2", "https://cloud.debian.org/images/cloud/bookworm/latest/SHA512SUMS"},
		"rocky-9/amd64":      {"https://dl.rockylinux.org/pub/rocky/9/images/x86_64/Rocky-9-GenericCloud-Base.latest.x86_64.qcow2", "https://dl.rockylinux.org/pub/rocky/9/images/x86_64/CHECKSUM"},
		"rocky-9/arm64":      {"https://dl.rockylinux.org/pub/rocky/9/images/aarch64/Rocky-9-GenericCloud-Base.latest.aarch64.qcow2", "https://dl.rockylinux.org/pub/rocky/9/images/aarch64/CHECKSUM"},
		"almalinux-9/amd64":  {"https://repo.almalinux.org/almalinux/9/cloud/x86_64/images/AlmaLinux-9-GenericCloud-latest.x86_64.qcow2", "https://repo.almalinux.org/almalinux/9/cloud/x86_64/images/CHECKSUM"},
		"almalinux-9/arm64":  {"https://repo.almalinux.org/almalinux/9/cloud/aarch64/images/AlmaLinux-9-GenericCloud-latest.aarch64.qcow2", "https://repo.almalinux.org/almalinux/9/cloud/aarch64/images/CHECKSUM"},
	}
	got := map[string][2]string{}
	for _, name := range c.Names() {
		for _, arch := range []string{"amd64", "arm64"} {
			s, err := c.Resolve(name, arch, Mirrors{})
			if err != nil {
				t.Fatalf("Resolve(%s, %s) = %v", name, arch, err)
			}
			got[name+"/"+arch] = [2]string{s.URL, s.ChecksumURL}
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("resolved catalog (-want +got):\n%s", diff)
	}
}

func TestCatalogMirrors(t *testing.T) {
	c, err := DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	m := Mirrors{Base: "http://mirror.lan/upstream/", PerImage: map[string]string{
		"debian":      "http://debmirror.lan/",
		"debian-12":   "http://old.lan/cloud",
		"almalinux-9": "file:///srv/alma/",
	}}
	for _, tc := range []struct{ name, url, sums string }{
		{"ubuntu-24.04", "http://mirror.lan/upstream/releases/24.04/release/ubuntu-24.04-server-cloudimg-amd64.img", "http://mirror.lan/upstream/releases/24.04/release/SHA256SUMS"},
		{"debian-13", "http://debmirror.lan/images/cloud/trixie/latest/debian-13-genericcloud-amd64.qcow2", "http://debmirror.lan/images/cloud/trixie/latest/SHA512SUMS"},
		{"debian-12", "http://old.lan/cloud/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2", "http://old.lan/cloud/images/cloud/bookworm/latest/SHA512SUMS"},
		{"almalinux-9", "file:///srv/alma/almalinux/9/cloud/x86_64/images/AlmaLinux-9-GenericCloud-latest.x86_64.qcow2", "file:///srv/alma/almalinux/9/cloud/x86_64/images/CHECKSUM"},
	} {
		s, err := c.Resolve(tc.name, "", m)
		if err != nil {
			t.Fatalf("Resolve(%s) = %v", tc.name, err)
		}
		if s.URL != tc.url || s.ChecksumURL != tc.sums || s.Arch != "amd64" {
			t.Errorf("Resolve(%s) = %+v, want %s and %s", tc.name, s, tc.url, tc.sums)
		}
	}
	for _, bad := range []string{"mirror.lan", "ftp://mirror.lan/", "http://mirror.lan/?x=1", "http:///nohost"} {
		if _, err := c.Resolve("ubuntu-24.04", "amd64", Mirrors{Base: bad}); !errors.Is(err, ErrBadURL) {
			t.Errorf("Resolve with mirror %q = %v, want ErrBadURL", bad, err)
		}
	}
}

func TestParseCatalogRejects(t *testing.T) {
	good := "images:\n- name: a\n  family: f\n  upstream: https://h/\n  path: x/{arch}.img\n  checksumFile: SUMS\n  arches: {amd64: amd64}\n"
	if _, err := ParseCatalog([]byte(good)); err != nil {
		t.Fatalf("ParseCatalog(good) = %v", err)
	}
	for name, doc := range map[string]string{
		"unknown field": strings.Replace(good, "family: f", "famly: f", 1),
		"http upstream": strings.Replace(good, "https://h/", "http://h/", 1),
		"no arch token": strings.Replace(good, "{arch}", "amd64", 1),
		"absolute path": strings.Replace(good, "x/{arch}", "/x/{arch}", 1),
		"checksum path": strings.Replace(good, "SUMS", "../SUMS", 1),
		"bad arch":      strings.Replace(good, "amd64: amd64", "ppc64el: ppc64el", 1),
		"bad name":      strings.Replace(good, "name: a", "name: A/B", 1),
		"duplicate":     good + strings.TrimPrefix(good, "images:\n"),
	} {
		if _, err := ParseCatalog([]byte(doc)); err == nil {
			t.Errorf("ParseCatalog(%s) = nil error", name)
		}
	}
}
