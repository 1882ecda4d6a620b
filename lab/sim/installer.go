package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	v1 "github.com/machina-metal/machina/api/v1"
)

// installerBoot is an iPXE script's installer boot: the installer's kernel
// and initrd and the kernel arguments the controller gave it.
type installerBoot struct {
	kernel, initrd string
	args           map[string]string
}

// parseInstallerScript finds an installer boot (a kernel under /install/)
// in an iPXE script.
func parseInstallerScript(script string) (installerBoot, bool) {
	var b installerBoot
	for _, line := range strings.Split(script, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "kernel" && strings.Contains(f[1], "/install/"):
			b.kernel = f[1]
			b.args = map[string]string{}
			for _, a := range f[2:] {
				k, v, _ := strings.Cut(a, "=")
				b.args[k] = v
			}
		case len(f) >= 2 && f[0] == "initrd" && b.kernel != "":
			b.initrd = f[1]
		}
	}
	return b, b.kernel != "" && b.initrd != ""
}

// Installed reports which installer ("autoinstall" or "kickstart") last
// installed the machine's disk ("" if none did) and the kernel and initrd
// bytes it booted.
func (m *Machine) Installed() (kind string, kernelAndInitrd []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.installed, m.installerBoot
}

// install follows an installer boot as the distribution installer would,
// over the controller's real endpoints: it fetches the kernel and initrd,
// then the installer's own inputs (Ubuntu: the ISO from url= and the NoCloud
// meta-data and user-data from ds=nocloud-net;s=; RHEL: .treeinfo and the
// stage2 image from inst.stage2 and the kickstart from inst.ks), checks the
// document parses and holds the first-boot join command and the completion
// callback, "installs" by writing the OS marker to the first disk, and POSTs
// the callback. No installer code runs: this proves the protocol only.
func (m *Machine) install(ctx context.Context, b installerBoot) error {
	get := func(u string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		resp, err := m.lab.http.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: HTTP %d", redactInstall(u), resp.StatusCode)
		}
		return body, nil
	}
	var bootFiles []string
	for _, u := range []string{b.kernel, b.initrd} {
		body, err := get(u)
		if err != nil {
			return fmt.Errorf("installer boot files: %w", err)
		}
		if len(body) == 0 {
			return fmt.Errorf("installer boot file %s is empty", redactInstall(u))
		}
		bootFiles = append(bootFiles, string(body))
	}
	var kind, hostname, join, joinToken, callback string
	switch {
	case has(b.args, "autoinstall") && strings.HasPrefix(b.args["ds"], "nocloud-net;s="):
		kind = "autoinstall"
		iso, err := get(b.args["url"])
		if err != nil {
			return fmt.Errorf("casper url=: %w", err)
		}
		if len(iso) < 32774 || string(iso[32769:32774]) != "CD001" {
			return errors.New("casper url= is not an ISO 9660 image")
		}
		seed := strings.TrimPrefix(b.args["ds"], "nocloud-net;s=")
		if _, err := get(seed + "meta-data"); err != nil {
			return err
		}
		ud, err := get(seed + "user-data")
		if err != nil {
			return err
		}
		if hostname, join, joinToken, callback, err = parseAutoinstall(ud); err != nil {
			return err
		}
	case b.args["inst.ks"] != "" && b.args["inst.stage2"] != "":
		kind = "kickstart"
		for _, p := range []string{".treeinfo", "images/install.img"} {
			if _, err := get(b.args["inst.stage2"] + p); err != nil {
				return fmt.Errorf("inst.stage2: %w", err)
			}
		}
		ks, err := get(b.args["inst.ks"])
		if err != nil {
			return err
		}
		if hostname, join, joinToken, callback, err = parseKickstart(ks); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown installer kernel arguments %v", keys(b.args))
	}
	if !strings.Contains(join, "MACHINA_JOIN_TOKEN") {
		return fmt.Errorf("%s document has no real join command: %q", kind, join)
	}
	if !strings.HasPrefix(callback, m.lab.controllerURL()+"/install/done/") {
		return fmt.Errorf("%s document's callback %q is not the controller's", kind, redactInstall(callback))
	}
	// "Install": the OS on the first disk.
	f, err := os.OpenFile(filepath.Join(m.devDir, "sda"), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt([]byte(osMarker), 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write the installed OS: %w", err)
	}
	m.mu.Lock()
	m.lastSeed = &v1.Seed{Hostname: hostname, JoinCommand: join, JoinToken: joinToken}
	m.installed = kind
	m.installerBoot = bootFiles
	m.mu.Unlock()
	// The installer's last step: curl -X POST to the callback.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, callback, nil)
	if err != nil {
		return err
	}
	resp, err := m.lab.http.Do(req)
	if err != nil {
		return fmt.Errorf("completion callback: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("completion callback: HTTP %d", resp.StatusCode)
	}
	m.log.Info("installed by the distribution installer (simulated)", "installer", kind)
	return nil
}

// parseAutoinstall reads what the installer would from an autoinstall
// user-data: the hostname, the first-boot runcmd, the join token written to
// v1.JoinTokenPath (write_files) and the curl of the last late-command.
func parseAutoinstall(ud []byte) (hostname, join, token, callback string, err error) {
	if !bytes.HasPrefix(ud, []byte("#cloud-config\n")) {
		return "", "", "", "", errors.New("user-data is not #cloud-config")
	}
	var doc struct {
		Autoinstall struct {
			Version  int `json:"version"`
			UserData struct {
				Hostname string     `json:"hostname"`
				Runcmd   [][]string `json:"runcmd"`
				Files    []struct {
					Path        string `json:"path"`
					Permissions string `json:"permissions"`
					Content     string `json:"content"`
				} `json:"write_files"`
			} `json:"user-data"`
			LateCommands [][]string `json:"late-commands"`
		} `json:"autoinstall"`
	}
	if err := yaml.Unmarshal(ud, &doc); err != nil {
		return "", "", "", "", fmt.Errorf("user-data: %w", err)
	}
	a := doc.Autoinstall
	if a.Version != 1 || len(a.UserData.Runcmd) == 0 || len(a.UserData.Runcmd[0]) != 3 || len(a.LateCommands) == 0 {
		return "", "", "", "", errors.New("user-data lacks autoinstall version 1, the join runcmd or late-commands")
	}
	for _, f := range a.UserData.Files {
		if f.Path == v1.JoinTokenPath {
			if f.Permissions != "0600" {
				return "", "", "", "", fmt.Errorf("user-data writes the join token with mode %q, want 0600", f.Permissions)
			}
			token = f.Content
		}
	}
	last := a.LateCommands[len(a.LateCommands)-1]
	return a.UserData.Hostname, a.UserData.Runcmd[0][2], token, curlPostURL(last[len(last)-1]), nil
}

// parseKickstart reads the hostname (network --hostname=), the join script
// (the machina-join heredoc), the join token (the heredoc to
// v1.JoinTokenPath) and the callback (curl in the last %post).
func parseKickstart(ks []byte) (hostname, join, token, callback string, err error) {
	s := string(ks)
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "network ") {
			for _, f := range strings.Fields(l) {
				if v, ok := strings.CutPrefix(f, "--hostname="); ok {
					hostname = v
				}
			}
		}
	}
	const open = "cat > /usr/local/sbin/machina-join <<'MACHINA_JOIN_EOF'\n#!/bin/sh\n"
	i := strings.Index(s, open)
	j := strings.Index(s, "\nMACHINA_JOIN_EOF\n")
	if i < 0 || j < i {
		return "", "", "", "", errors.New("kickstart has no machina-join script")
	}
	join = s[i+len(open) : j]
	if ti := strings.Index(s, v1.JoinTokenPath+" <<'MACHINA_TOKEN_EOF'\n"); ti >= 0 {
		rest := s[ti+len(v1.JoinTokenPath+" <<'MACHINA_TOKEN_EOF'\n"):]
		if te := strings.Index(rest, "\nMACHINA_TOKEN_EOF\n"); te >= 0 {
			token = rest[:te]
		}
	}
	k := strings.LastIndex(s, "%post --nochroot")
	if k < 0 || !strings.HasSuffix(s, "%end\n") {
		return "", "", "", "", errors.New("kickstart's last section is not the completion callback")
	}
	lines := strings.Split(strings.TrimSuffix(s[k:], "\n%end\n"), "\n")
	return hostname, join, token, curlPostURL(lines[len(lines)-1]), nil
}

// curlPostURL returns the URL of a "curl ... -X POST ... URL" command, or "".
func curlPostURL(cmd string) string {
	f := strings.Fields(cmd)
	if len(f) < 2 || f[0] != "curl" || !strings.Contains(cmd, "-X POST") {
		return ""
	}
	return f[len(f)-1]
}

// redactInstall hides the token in an installer URL.
func redactInstall(u string) string {
	for _, p := range []string{"/install/done/", "/install/"} {
		if i := strings.Index(u, p); i >= 0 {
			rest := u[i+len(p):]
			if j := strings.Index(rest, "/"); j >= 0 {
				return u[:i+len(p)] + "TOKEN" + rest[j:]
			}
			return u[:i+len(p)] + "TOKEN"
		}
	}
	return u
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func has(m map[string]string, k string) bool { _, ok := m[k]; return ok }
