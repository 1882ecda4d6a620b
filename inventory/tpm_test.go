package inventory

import (
	"strings"
	"testing"
	"testing/fstest"
)

// TestTPMPinAndAttestationPolicy: servers.yaml tpm.ek takes a sha256:
// fingerprint and nothing else; profiles.yaml attestation takes required,
// optional or off.
func TestTPMPinAndAttestationPolicy(t *testing.T) {
	ek := "sha256:" + strings.Repeat("0a", 32)
	load := func(tpm, attestation string) error {
		_, err := Load(fstest.MapFS{
			ServersFile:  {Data: []byte("servers:\n  - name: n01\n    zone: z\n    bootMAC: \"52:54:00:00:00:01\"\n" + tpm)},
			ProfilesFile: {Data: []byte("profiles:\n  - name: p\n    zone: z\n    image: i\n    deploy: autoinstall\n" + attestation)},
			ImagesFile:   {Data: []byte("images:\n  - name: i\n    url: http://mirror.lan/i.raw\n    checksum: sha256:" + strings.Repeat("a", 64) + "\n")},
		}, Limits{})
		return err
	}
	if err := load("    tpm: {ek: \""+ek+"\"}\n", "    attestation: optional\n"); err != nil {
		t.Fatalf("valid pin and policy: %v", err)
	}
	if _, err := Load(fstest.MapFS{
		ServersFile:  {Data: []byte("servers:\n  - name: n01\n    zone: z\n    bootMAC: \"52:54:00:00:00:01\"\n")},
		ProfilesFile: {Data: []byte("profiles:\n  - name: p\n    zone: z\n    image: i\n    attestation: required\n    sshKeys: [\"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1\"]\n")},
		ImagesFile:   {Data: []byte("images:\n  - name: i\n    url: http://mirror.lan/i.raw\n    checksum: sha256:" + strings.Repeat("a", 64) + "\n")},
	}, Limits{}); err != nil {
		t.Errorf("attestation: required with an image deploy: %v", err)
	}
	// required needs an image deploy: an installer fetches its documents
	// (SSH keys, join token) with no attestation.
	if err := load("", "    attestation: required\n"); err == nil || !strings.Contains(err.Error(), "deploy") {
		t.Errorf("attestation: required with deploy: autoinstall = %v, want refused naming deploy", err)
	}
	res, err := Load(fstest.MapFS{ServersFile: {Data: []byte("servers:\n  - name: n01\n    zone: z\n    bootMAC: \"52:54:00:00:00:01\"\n    tpm: {ek: \"" + ek + "\"}\n")}}, Limits{})
	if err != nil || res.Inventory.Server("n01").TPM == nil || res.Inventory.Server("n01").TPM.EK != ek {
		t.Fatalf("pinned EK not loaded: %v", err)
	}
	for name, c := range map[string][2]string{
		"short EK":       {"    tpm: {ek: \"sha256:abcd\"}\n", ""},
		"upper-case hex": {"    tpm: {ek: \"sha256:" + strings.Repeat("0A", 32) + "\"}\n", ""},
		"no ek":          {"    tpm: {}\n", ""},
		"unknown field":  {"    tpm: {ek: \"" + ek + "\", pcr: 7}\n", ""},
		"bad policy":     {"", "    attestation: sometimes\n"},
	} {
		if err := load(c[0], c[1]); err == nil {
			t.Errorf("%s: loaded, want refused", name)
		}
	}
}
