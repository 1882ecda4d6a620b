package inventory

import (
	"strings"
	"testing"
	"testing/fstest"
)

// TestArchValidation: servers.yaml arch is amd64 or arm64; arm64 with
// bootMode bios is refused; a profile whose image architecture no server
// it may take can have is refused naming the profile's image line; an
// arm64 image with only unstated servers is a warning; amd64 images with
// unstated servers (every site before arch existed) stay silent.
func TestArchValidation(t *testing.T) {
	server := func(name, mac, extra string) string {
		return "  - name: " + name + "\n    zone: z\n    bootMAC: \"" + mac + "\"\n    bmc: {driver: ipmi, address: \"10.0.0." + mac[len(mac)-1:] + "\", credentials: c}\n" + extra
	}
	images := "images:\n  - name: x86\n    url: http://mirror.lan/x.raw\n    checksum: sha256:" + strings.Repeat("a", 64) +
		"\n  - name: arm\n    arch: arm64\n    url: http://mirror.lan/a.raw\n    checksum: sha256:" + strings.Repeat("b", 64) + "\n"
	load := func(servers, image string) (*Result, error) {
		return Load(fstest.MapFS{
			ServersFile:  {Data: []byte("servers:\n" + servers)},
			ImagesFile:   {Data: []byte(images)},
			ProfilesFile: {Data: []byte("profiles:\n  - name: p\n    zone: z\n    image: " + image + "\n    deploy: autoinstall\n")},
		}, Limits{})
	}
	for _, tc := range []struct {
		name, servers, image, wantErr, wantWarn string
	}{
		{"amd64 unstated", server("n1", "52:54:00:00:00:01", ""), "x86", "", ""},
		{"arm64 stated", server("n1", "52:54:00:00:00:01", "    arch: arm64\n") + server("n2", "52:54:00:00:00:02", ""), "arm", "", ""},
		{"arm64 unstated", server("n1", "52:54:00:00:00:01", ""), "arm", "", `profiles.yaml:4:12: warning: profiles[0].image: image "arm" is arm64 and no server this profile may take in zone "z" states arch: arm64`},
		{"all other arch", server("n1", "52:54:00:00:00:01", "    arch: amd64\n") + server("n2", "52:54:00:00:00:02", "    arch: amd64\n"), "arm", `profiles.yaml:4:12: profiles[0].image: image "arm" is arm64, but every server this profile may take in zone "z" states arch amd64`, ""},
		{"x86 image, arm servers", server("n1", "52:54:00:00:00:01", "    arch: arm64\n"), "x86", `image "x86" is amd64, but every server this profile may take in zone "z" states arch arm64`, ""},
		{"arm64 bios", server("n1", "52:54:00:00:00:01", "    arch: arm64\n    bootMode: bios\n"), "arm", `servers.yaml:7:15: servers[0].bootMode: an arm64 server boots UEFI only`, ""},
		{"bad arch", server("n1", "52:54:00:00:00:01", "    arch: riscv64\n"), "x86", `servers[0].arch`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := load(tc.servers, tc.image)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Load = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load = %v, want valid", err)
			}
			var warns []string
			for _, w := range res.Warnings {
				warns = append(warns, w.Error())
			}
			got := strings.Join(warns, "\n")
			if tc.wantWarn == "" && strings.Contains(got, "arch") || tc.wantWarn != "" && !strings.Contains(got, tc.wantWarn) {
				t.Fatalf("warnings = %q, want %q", got, tc.wantWarn)
			}
		})
	}
}
