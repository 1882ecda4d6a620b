// Package deploy owns what the controller hands a machine to install it:
// allocation, the cloud-init NoCloud seed content and the installer
// documents. This file renders the installer documents for sites that must
// use the distribution installer: an Ubuntu autoinstall user-data
// (subiquity) and a RHEL-family kickstart (anaconda). Every input is
// validated before it reaches a template; strings in YAML are emitted as
// JSON strings (valid YAML 1.2 flow scalars).
//
// No installer run is proven by the tests here: they check the rendered
// documents against golden files and by parsing them (docs/claims.md).
package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	v1 "github.com/machina-metal/machina/api/v1"
)

// ErrInvalidInstaller is wrapped by every validation error of the renderers.
var ErrInvalidInstaller = errors.New("invalid installer config")

// ErrUnsupportedHint is returned when the installer cannot express the disk
// hint (autoinstall cannot match a WWN; kickstart cannot match a serial).
var ErrUnsupportedHint = errors.New("disk hint not expressible for this installer")

// DiskChoice selects the install disk, like the ramdisk's root-device hint:
// at most one of Serial, WWN and ByPath; MinSizeBytes bounds the size. The
// zero value means "the smallest non-removable disk that fits".
type DiskChoice struct {
	Serial       string
	WWN          string // "0x5000c500a1b2c3d4" or "naa.5000c500a1b2c3d4"
	ByPath       string // by-path name, e.g. "pci-0000:00:17.0-ata-1"
	MinSizeBytes int64
}

// InstallerConfig is the profile-derived input of both renderers.
type InstallerConfig struct {
	// Hostname is an RFC 1123 label.
	Hostname string
	// SSHKeys are the OpenSSH public keys of user "machina"; at least one.
	SSHKeys []string
	Disk    DiskChoice
	// JoinCommand runs once at first boot; one line. Empty means v1.JoinPlaceholder.
	JoinCommand string
	// CompletionURL, when set, is POSTed (curl -fsS -X POST) by the
	// installer as its very last step, before the reboot: the controller's
	// single-use completion callback that moves the server deploying →
	// deployed. An http or https URL of [A-Za-z0-9:/._~%-] only (no query,
	// quotes or shell characters).
	CompletionURL string
}

var (
	hostRe   = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	keyRe    = regexp.MustCompile(`^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}( [A-Za-z0-9@._+-]{1,100})?$`)
	serialRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	wwnRe    = regexp.MustCompile(`^(0x|naa\.|eui\.)?[0-9a-fA-F]{16,32}$`)
	byPathRe = regexp.MustCompile(`^[a-z0-9][a-z0-9:._-]{2,127}$`)
	cbURLRe  = regexp.MustCompile(`^https?://[A-Za-z0-9.:\[\]-]+(/[A-Za-z0-9._~%-]*)*$`)
)

func (c InstallerConfig) validate() (join string, err error) {
	if !hostRe.MatchString(c.Hostname) {
		return "", fmt.Errorf("%w: hostname %q", ErrInvalidInstaller, c.Hostname)
	}
	if len(c.SSHKeys) == 0 {
		return "", fmt.Errorf("%w: no ssh keys (password login is disabled)", ErrInvalidInstaller)
	}
	for i, k := range c.SSHKeys {
		if !keyRe.MatchString(k) {
			return "", fmt.Errorf("%w: ssh key %d", ErrInvalidInstaller, i)
		}
	}
	d := c.Disk
	n := 0
	for _, s := range []string{d.Serial, d.WWN, d.ByPath} {
		if s != "" {
			n++
		}
	}
	switch {
	case n > 1:
		return "", fmt.Errorf("%w: set at most one of serial, wwn, byPath", ErrInvalidInstaller)
	case d.Serial != "" && !serialRe.MatchString(d.Serial):
		return "", fmt.Errorf("%w: serial %q", ErrInvalidInstaller, d.Serial)
	case d.WWN != "" && !wwnRe.MatchString(d.WWN):
		return "", fmt.Errorf("%w: wwn %q", ErrInvalidInstaller, d.WWN)
	case d.ByPath != "" && (!byPathRe.MatchString(d.ByPath) || strings.Contains(d.ByPath, "..")):
		return "", fmt.Errorf("%w: byPath %q (a /dev/disk/by-path name without the directory)", ErrInvalidInstaller, d.ByPath)
	case d.MinSizeBytes < 0:
		return "", fmt.Errorf("%w: negative minimum size", ErrInvalidInstaller)
	}
	if c.CompletionURL != "" && (!cbURLRe.MatchString(c.CompletionURL) || len(c.CompletionURL) > 1024) {
		return "", fmt.Errorf("%w: completion URL %q", ErrInvalidInstaller, c.CompletionURL)
	}
	join = c.JoinCommand
	if join == "" {
		join = v1.JoinPlaceholder
	}
	hasCtrl := strings.ContainsFunc(join, func(r rune) bool { return r != '\t' && (r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0)) })
	if hasCtrl || len(join) > 4096 || strings.Contains(join, "MACHINA_JOIN_EOF") || !utf8.ValidString(join) {
		return "", fmt.Errorf("%w: join command must be one line under 4 KiB without control characters", ErrInvalidInstaller)
	}
	return join, nil
}

func q(s string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // strings always encode
	return strings.TrimSuffix(b.String(), "\n")
}

// RenderAutoinstall renders an Ubuntu Server autoinstall document (the
// user-data the installer reads, "#cloud-config" with an "autoinstall" key,
// schema version 1). Disk: storage layout "direct" with a match on serial,
// id_path (by-path) or size "smallest"; a WWN hint is ErrUnsupportedHint.
// The installed system gets user machina (passwordless sudo, keys only),
// ssh_pwauth false, disable_root true, and the join command at first boot.
func RenderAutoinstall(c InstallerConfig) ([]byte, error) {
	join, err := c.validate()
	if err != nil {
		return nil, fmt.Errorf("render autoinstall: %w", err)
	}
	var match string
	switch {
	case c.Disk.WWN != "":
		return nil, fmt.Errorf("render autoinstall: %w: wwn", ErrUnsupportedHint)
	case c.Disk.Serial != "":
		match = "serial: " + q(c.Disk.Serial)
	case c.Disk.ByPath != "":
		match = "id_path: " + q(c.Disk.ByPath)
	default:
		match = "size: smallest"
	}
	var b strings.Builder
	b.WriteString("#cloud-config\n# Rendered by Machina (deploy.RenderAutoinstall).\nautoinstall:\n  version: 1\n")
	b.WriteString("  locale: en_US.UTF-8\n  keyboard:\n    layout: us\n")
	b.WriteString("  network:\n    version: 2\n    ethernets:\n      all:\n        match:\n          name: \"e*\"\n        dhcp4: true\n")
	b.WriteString("  storage:\n    layout:\n      name: direct\n      match:\n        " + match + "\n")
	b.WriteString("  ssh:\n    install-server: true\n    allow-pw: false\n    authorized-keys:\n")
	for _, k := range c.SSHKeys {
		b.WriteString("      - " + q(k) + "\n")
	}
	b.WriteString("  user-data:\n    hostname: " + q(c.Hostname) + "\n")
	b.WriteString("    users:\n      - name: machina\n        shell: /bin/bash\n        sudo: \"ALL=(ALL) NOPASSWD:ALL\"\n        lock_passwd: true\n        ssh_authorized_keys:\n")
	for _, k := range c.SSHKeys {
		b.WriteString("          - " + q(k) + "\n")
	}
	b.WriteString("    ssh_pwauth: false\n    disable_root: true\n")
	b.WriteString("    runcmd:\n      - [sh, -c, " + q(join) + "]\n")
	if c.Disk.MinSizeBytes > 0 {
		// subiquity's match has no minimum size: refuse smaller disks in early-commands.
		b.WriteString("  early-commands:\n    - [sh, -c, " + q(minSizeCheck(c.Disk.MinSizeBytes)) + "]\n")
	}
	if c.CompletionURL != "" {
		// The last step before the reboot: tell the controller the install
		// finished (it then boots the server from its disk).
		b.WriteString("  late-commands:\n    - [sh, -c, " + q(callback(c.CompletionURL)) + "]\n")
	}
	b.WriteString("  shutdown: reboot\n")
	return []byte(b.String()), nil
}

// callback is the shell command that reports the end of the install.
func callback(url string) string {
	return "curl -fsS -X POST --retry 10 --retry-delay 3 --retry-connrefused " + url
}

// minSizeCheck is a shell command that fails unless some non-removable disk
// has at least n bytes (lsblk -b prints sizes in bytes).
func minSizeCheck(n int64) string {
	return fmt.Sprintf("lsblk -dbno SIZE,RM,TYPE | awk '$2==0 && $3==\"disk\" && $1>=%d {ok=1} END {exit !ok}'", n)
}

// kickstartCommands lists the commands RenderKickstart emits outside
// sections; the tests check every rendered command line against it.
var kickstartCommands = []string{
	"text", "lang", "keyboard", "timezone", "network", "rootpw", "user", "sshkey", "firewall", "selinux",
	"zerombr", "clearpart", "ignoredisk", "autopart", "bootloader", "reboot", "%include",
}

// RenderKickstart renders a RHEL 9-family kickstart. Disk: a WWN or by-path
// hint becomes "ignoredisk --only-use=" with the /dev/disk/by-id or by-path
// name; without a hint a %pre script picks the smallest non-removable disk of
// at least MinSizeBytes and fails the install if there is none; a serial hint
// is ErrUnsupportedHint (anaconda cannot match serials). Root is locked,
// user machina gets the keys and passwordless sudo, sshd refuses passwords
// and root, and a oneshot unit runs the join command at first boot.
func RenderKickstart(c InstallerConfig) ([]byte, error) {
	join, err := c.validate()
	if err != nil {
		return nil, fmt.Errorf("render kickstart: %w", err)
	}
	var b strings.Builder
	b.WriteString("# Rendered by Machina (deploy.RenderKickstart).\n")
	b.WriteString("text\nlang en_US.UTF-8\nkeyboard us\ntimezone UTC --utc\n")
	b.WriteString("network --bootproto=dhcp --activate --hostname=" + c.Hostname + "\n")
	b.WriteString("rootpw --lock\nuser --name=machina --groups=wheel --lock\n")
	for _, k := range c.SSHKeys {
		b.WriteString("sshkey --username=machina " + q(k) + "\n")
	}
	b.WriteString("firewall --enabled --ssh\nselinux --enforcing\n")
	switch {
	case c.Disk.Serial != "":
		return nil, fmt.Errorf("render kickstart: %w: serial", ErrUnsupportedHint)
	case c.Disk.WWN != "":
		w := strings.ToLower(c.Disk.WWN)
		w = strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(w, "0x"), "naa."), "eui.")
		dev := "/dev/disk/by-id/wwn-0x" + w
		b.WriteString("zerombr\nignoredisk --only-use=" + dev + "\nclearpart --all --initlabel --drives=" + dev + "\n")
	case c.Disk.ByPath != "":
		dev := "/dev/disk/by-path/" + c.Disk.ByPath
		b.WriteString("zerombr\nignoredisk --only-use=" + dev + "\nclearpart --all --initlabel --drives=" + dev + "\n")
	default:
		b.WriteString("%include /tmp/machina-disk.ks\n")
	}
	b.WriteString("autopart --type=plain --nohome\nbootloader --timeout=1\nreboot\n\n")
	b.WriteString("%packages\n@^minimal-environment\nopenssh-server\n%end\n\n")
	if c.Disk.WWN == "" && c.Disk.ByPath == "" {
		b.WriteString("%pre --interpreter=/bin/sh --erroronfail\n")
		b.WriteString("# Smallest non-removable disk of at least the minimum size; no fallback.\n")
		fmt.Fprintf(&b, "disk=$(lsblk -dbno NAME,SIZE,RM,TYPE | awk '$3==0 && $4==\"disk\" && $2>=%d' | sort -k2,2n | awk 'NR==1{print $1}')\n", c.Disk.MinSizeBytes)
		b.WriteString("[ -n \"$disk\" ] || { echo 'machina: no disk fits' >&2; exit 1; }\n")
		b.WriteString("printf 'zerombr\\nignoredisk --only-use=%s\\nclearpart --all --initlabel --drives=%s\\n' \"$disk\" \"$disk\" > /tmp/machina-disk.ks\n")
		b.WriteString("%end\n\n")
	}
	b.WriteString("%post --interpreter=/bin/sh --erroronfail --log=/root/machina-post.log\n")
	b.WriteString("printf 'machina ALL=(ALL) NOPASSWD:ALL\\n' > /etc/sudoers.d/machina\nchmod 0440 /etc/sudoers.d/machina\n")
	b.WriteString("mkdir -p /etc/ssh/sshd_config.d\nprintf 'PasswordAuthentication no\\nKbdInteractiveAuthentication no\\nPermitRootLogin no\\n' > /etc/ssh/sshd_config.d/01-machina.conf\n")
	b.WriteString("cat > /usr/local/sbin/machina-join <<'MACHINA_JOIN_EOF'\n#!/bin/sh\n" + join + "\nMACHINA_JOIN_EOF\n")
	b.WriteString("chmod 0700 /usr/local/sbin/machina-join\n")
	b.WriteString("cat > /etc/systemd/system/machina-join.service <<'MACHINA_UNIT_EOF'\n[Unit]\nDescription=Machina first-boot join\nWants=network-online.target\nAfter=network-online.target\nConditionPathExists=!/var/lib/machina/joined\n\n[Service]\nType=oneshot\nExecStart=/usr/local/sbin/machina-join\nExecStartPost=/bin/sh -c 'mkdir -p /var/lib/machina && touch /var/lib/machina/joined'\n\n[Install]\nWantedBy=multi-user.target\nMACHINA_UNIT_EOF\n")
	b.WriteString("systemctl enable machina-join.service\n%end\n")
	if c.CompletionURL != "" {
		// Last: anaconda runs %post sections in order, this one in the
		// installer's own environment (curl is in the RHEL installer image).
		b.WriteString("\n%post --nochroot --interpreter=/bin/sh --erroronfail --log=/mnt/sysimage/root/machina-callback.log\n")
		b.WriteString(callback(c.CompletionURL) + "\n%end\n")
	}
	return []byte(b.String()), nil
}
