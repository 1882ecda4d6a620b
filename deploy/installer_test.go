package deploy

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	v1 "github.com/machina-metal/machina/api/v1"
)

var update = flag.Bool("update", false, "rewrite golden files")

var baseCfg = InstallerConfig{
	Hostname: "r1-n01",
	SSHKeys:  []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkUjIg1YmN3qkI3QVh2dGZ1bHd0cWZ6eHJ0a2Z4 ops@site"},
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("%s differs (-want +got):\n%s", p, d)
	}
}

// autoinstallDoc is the subset of the autoinstall schema the renderer sets;
// UnmarshalStrict fails on anything else, so the test notices new keys.
type autoinstallDoc struct {
	Autoinstall struct {
		Version  int               `json:"version"`
		Locale   string            `json:"locale"`
		Keyboard map[string]string `json:"keyboard"`
		Network  map[string]any    `json:"network"`
		Storage  struct {
			Layout struct {
				Name  string         `json:"name"`
				Match map[string]any `json:"match"`
			} `json:"layout"`
		} `json:"storage"`
		SSH struct {
			InstallServer bool     `json:"install-server"`
			AllowPW       bool     `json:"allow-pw"`
			Keys          []string `json:"authorized-keys"`
		} `json:"ssh"`
		UserData struct {
			Hostname string `json:"hostname"`
			Users    []struct {
				Name       string   `json:"name"`
				Shell      string   `json:"shell"`
				Sudo       string   `json:"sudo"`
				LockPasswd bool     `json:"lock_passwd"`
				Keys       []string `json:"ssh_authorized_keys"`
			} `json:"users"`
			SSHPwauth   bool       `json:"ssh_pwauth"`
			DisableRoot bool       `json:"disable_root"`
			Runcmd      [][]string `json:"runcmd"`
		} `json:"user-data"`
		EarlyCommands [][]string `json:"early-commands"`
		LateCommands  [][]string `json:"late-commands"`
		Shutdown      string     `json:"shutdown"`
	} `json:"autoinstall"`
}

func TestRenderAutoinstall(t *testing.T) {
	for _, c := range []struct {
		name  string
		disk  DiskChoice
		match map[string]any
	}{
		{"smallest", DiskChoice{MinSizeBytes: 100 << 30}, map[string]any{"size": "smallest"}},
		{"serial", DiskChoice{Serial: "S45NNE0M123456"}, map[string]any{"serial": "S45NNE0M123456"}},
		{"bypath", DiskChoice{ByPath: "pci-0000:3b:00.0-nvme-1"}, map[string]any{"id_path": "pci-0000:3b:00.0-nvme-1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := baseCfg
			cfg.Disk = c.disk
			out, err := RenderAutoinstall(cfg)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, "autoinstall-"+c.name, out)
			if !strings.HasPrefix(string(out), "#cloud-config\n") {
				t.Error("missing #cloud-config")
			}
			var doc autoinstallDoc
			if err := yaml.UnmarshalStrict(out, &doc); err != nil {
				t.Fatalf("autoinstall does not parse as the expected YAML: %v", err)
			}
			a := doc.Autoinstall
			if a.Version != 1 || a.Storage.Layout.Name != "direct" || a.SSH.AllowPW || !a.SSH.InstallServer {
				t.Errorf("autoinstall = %+v", a)
			}
			if d := cmp.Diff(c.match, a.Storage.Layout.Match); d != "" {
				t.Errorf("disk match (-want +got):\n%s", d)
			}
			u := a.UserData
			if len(u.Users) != 1 || u.Users[0].Name != "machina" || u.Users[0].Sudo != "ALL=(ALL) NOPASSWD:ALL" || !u.Users[0].LockPasswd ||
				u.SSHPwauth || !u.DisableRoot || u.Hostname != "r1-n01" || cmp.Diff(baseCfg.SSHKeys, u.Users[0].Keys) != "" {
				t.Errorf("user-data = %+v", u)
			}
			// Placeholder until the join issue supplies the command (stated on purpose).
			if len(u.Runcmd) != 1 || u.Runcmd[0][2] != v1.JoinPlaceholder {
				t.Errorf("runcmd = %v", u.Runcmd)
			}
			if (c.disk.MinSizeBytes > 0) != (len(a.EarlyCommands) == 1) {
				t.Errorf("early-commands = %v for min size %d", a.EarlyCommands, c.disk.MinSizeBytes)
			}
		})
	}
	cfg := baseCfg
	cfg.Disk = DiskChoice{WWN: "0x5000c500a1b2c3d4"}
	if _, err := RenderAutoinstall(cfg); !errors.Is(err, ErrUnsupportedHint) {
		t.Errorf("wwn hint: err = %v, want ErrUnsupportedHint", err)
	}
}

// checkKickstart is a line-level check: outside sections each line is a
// known command; sections open with %pre/%post/%packages and close with %end;
// heredocs inside %post are closed.
func checkKickstart(t *testing.T, ks string) {
	t.Helper()
	known := map[string]bool{}
	for _, c := range kickstartCommands {
		known[c] = true
	}
	section := ""
	heredoc := ""
	for i, line := range strings.Split(ks, "\n") {
		switch {
		case heredoc != "":
			if line == heredoc {
				heredoc = ""
			}
		case line == "" || strings.HasPrefix(line, "#") && section == "":
		case strings.HasPrefix(line, "%pre") || strings.HasPrefix(line, "%post") || line == "%packages":
			if section != "" {
				t.Errorf("line %d: %s inside %s", i+1, line, section)
			}
			section = strings.Fields(line)[0]
		case line == "%end":
			if section == "" {
				t.Errorf("line %d: %%end outside a section", i+1)
			}
			section = ""
		case section != "":
			if j := strings.Index(line, "<<'"); j >= 0 {
				heredoc = strings.TrimSuffix(line[j+3:], "'")
			}
		default:
			if !known[strings.Fields(line)[0]] {
				t.Errorf("line %d: unknown kickstart command %q", i+1, line)
			}
		}
	}
	if section != "" || heredoc != "" {
		t.Errorf("unterminated section %q / heredoc %q", section, heredoc)
	}
}

func TestRenderKickstart(t *testing.T) {
	for _, c := range []struct {
		name string
		disk DiskChoice
		want string
	}{
		{"smallest", DiskChoice{MinSizeBytes: 100 << 30}, "%include /tmp/machina-disk.ks"},
		{"wwn", DiskChoice{WWN: "naa.5000C500A1B2C3D4"}, "ignoredisk --only-use=/dev/disk/by-id/wwn-0x5000c500a1b2c3d4"},
		{"bypath", DiskChoice{ByPath: "pci-0000:00:17.0-ata-1"}, "ignoredisk --only-use=/dev/disk/by-path/pci-0000:00:17.0-ata-1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := baseCfg
			cfg.Disk = c.disk
			out, err := RenderKickstart(cfg)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, "kickstart-"+c.name, out)
			ks := string(out)
			checkKickstart(t, ks)
			for _, must := range []string{c.want, "rootpw --lock", "user --name=machina --groups=wheel --lock",
				`sshkey --username=machina "` + baseCfg.SSHKeys[0] + `"`, "PasswordAuthentication no", "PermitRootLogin no",
				"NOPASSWD:ALL", v1.JoinPlaceholder, "systemctl enable machina-join.service"} {
				if !strings.Contains(ks, must) {
					t.Errorf("kickstart lacks %q", must)
				}
			}
			if c.disk.MinSizeBytes > 0 && !strings.Contains(ks, "$2>=107374182400") {
				t.Error("the pre script does not enforce the minimum size")
			}
		})
	}
	cfg := baseCfg
	cfg.Disk = DiskChoice{Serial: "X1"}
	if _, err := RenderKickstart(cfg); !errors.Is(err, ErrUnsupportedHint) {
		t.Errorf("serial hint: err = %v, want ErrUnsupportedHint", err)
	}
}

func TestRenderersValidate(t *testing.T) {
	for name, c := range map[string]InstallerConfig{
		"hostname":   {Hostname: "bad host", SSHKeys: baseCfg.SSHKeys},
		"no keys":    {Hostname: "h"},
		"key inject": {Hostname: "h", SSHKeys: []string{"ssh-ed25519 AAAA\n%post\nrm -rf /"}},
		"two hints":  {Hostname: "h", SSHKeys: baseCfg.SSHKeys, Disk: DiskChoice{Serial: "a", ByPath: "pci-0000:00:01.0"}},
		"bypath dev": {Hostname: "h", SSHKeys: baseCfg.SSHKeys, Disk: DiskChoice{ByPath: "/dev/sda"}},
		"bypath dot": {Hostname: "h", SSHKeys: baseCfg.SSHKeys, Disk: DiskChoice{ByPath: "pci-..-x"}},
		"wwn":        {Hostname: "h", SSHKeys: baseCfg.SSHKeys, Disk: DiskChoice{WWN: "0x12; reboot"}},
		"join":       {Hostname: "h", SSHKeys: baseCfg.SSHKeys, JoinCommand: "a\nMACHINA_JOIN_EOF\nrm -rf /"},
		"callback":   {Hostname: "h", SSHKeys: baseCfg.SSHKeys, CompletionURL: "http://10.0.0.1/x; reboot"},
		"callback q": {Hostname: "h", SSHKeys: baseCfg.SSHKeys, CompletionURL: "http://10.0.0.1/x?a=$(id)"},
		"callback f": {Hostname: "h", SSHKeys: baseCfg.SSHKeys, CompletionURL: "file:///etc/passwd"},
	} {
		for rname, r := range map[string]func(InstallerConfig) ([]byte, error){"autoinstall": RenderAutoinstall, "kickstart": RenderKickstart} {
			if _, err := r(c); !errors.Is(err, ErrInvalidInstaller) {
				t.Errorf("%s/%s: err = %v, want ErrInvalidInstaller", rname, name, err)
			}
		}
	}
}

func FuzzRenderAutoinstall(f *testing.F) {
	f.Add("r1-n01", baseCfg.SSHKeys[0], "pci-0000:00:17.0-ata-1", "echo hi")
	f.Fuzz(func(t *testing.T, host, key, byPath, join string) {
		cfg := InstallerConfig{Hostname: host, SSHKeys: []string{key}, Disk: DiskChoice{ByPath: byPath}, JoinCommand: join}
		out, err := RenderAutoinstall(cfg)
		if err != nil {
			return
		}
		var doc autoinstallDoc
		if err := yaml.UnmarshalStrict(out, &doc); err != nil {
			t.Fatalf("accepted input renders invalid YAML: %v\n%s", err, out)
		}
		if doc.Autoinstall.UserData.Hostname != host || doc.Autoinstall.SSH.Keys[0] != key {
			t.Fatalf("values changed in rendering")
		}
	})
}

// installJoin is a first-boot join command of the shape join renders (URL,
// pinned fingerprint and script checksum, enrolment token).
const installJoin = "curl -fsS --cacert /dev/null https://10.99.0.1:8443/install.sh -o /tmp/i.sh && MACHINA_JOIN_TOKEN=tok123 sh /tmp/i.sh"

// TestRenderWithJoinAndCallback: the documents the controller serves carry
// the real first-boot join command and, as the installer's last step, the
// POST to the single-use completion callback.
func TestRenderWithJoinAndCallback(t *testing.T) {
	cfg := baseCfg
	cfg.JoinCommand = installJoin
	cfg.CompletionURL = "http://10.99.0.1:8080/install/done/cbTOKEN_abc-123"
	want := "curl -fsS -X POST --retry 10 --retry-delay 3 --retry-connrefused " + cfg.CompletionURL

	out, err := RenderAutoinstall(cfg)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "autoinstall-callback", out)
	var doc autoinstallDoc
	if err := yaml.UnmarshalStrict(out, &doc); err != nil {
		t.Fatalf("autoinstall does not parse: %v", err)
	}
	a := doc.Autoinstall
	if len(a.UserData.Runcmd) != 1 || a.UserData.Runcmd[0][2] != installJoin {
		t.Errorf("runcmd = %v, want the join command", a.UserData.Runcmd)
	}
	if d := cmp.Diff([][]string{{"sh", "-c", want}}, a.LateCommands); d != "" {
		t.Errorf("late-commands (-want +got):\n%s", d)
	}

	out, err = RenderKickstart(cfg)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "kickstart-callback", out)
	ks := string(out)
	checkKickstart(t, ks)
	if !strings.Contains(ks, "#!/bin/sh\n"+installJoin+"\nMACHINA_JOIN_EOF\n") {
		t.Error("kickstart lacks the join command in machina-join")
	}
	last := ks[strings.LastIndex(ks, "%post"):]
	if !strings.HasPrefix(last, "%post --nochroot") || !strings.Contains(last, "\n"+want+"\n%end\n") || !strings.HasSuffix(ks, "%end\n") {
		t.Errorf("the last section is not the callback:\n%s", last)
	}
}
