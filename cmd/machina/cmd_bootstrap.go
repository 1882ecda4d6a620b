package main

import (
	"bytes"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"

	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/state"
	"github.com/spf13/cobra"
)

// unitTemplate is machina.service; packaging/deb/machina.service is its
// rendering with the package's paths (TestUnitMatchesPackage).
//
//go:embed machina.service.tmpl
var unitTemplate string

// MasterKeyBytes is the random length of a master key machina bootstrap
// makes: 32 bytes from crypto/rand, written as 64 lower-case hex digits
// and a newline to master.key (mode 0600). The state store takes the 64
// ASCII digits as the key (MACHINA_API_KEY_MASTER_KEY, or serve's
// --master-key-file) and derives its AES-256-GCM key from them with HKDF-SHA256;
// it accepts any key of at least state.MinMasterKeyLen (16) bytes.
const MasterKeyBytes = 32

// bootstrapConfig is what machina bootstrap writes; paths are absolute,
// already under --root.
type bootstrapConfig struct {
	root, configDir, stateDir, systemdDir string
	isoDir                                string
	user, tokenName                       string
	binary                                string
	repo, branch                          string
	listen, adminListen, joinListen       string
	provIface, dhcpPool, publicURL        string
	tftpRoot, ramdiskDir, nodeBinary      string
	adminNames                            []string
	printUnit                             bool
}

func (b *bootstrapConfig) configFile() string { return filepath.Join(b.configDir, "machina.yaml") }
func (b *bootstrapConfig) keyFile() string    { return filepath.Join(b.configDir, "master.key") }
func (b *bootstrapConfig) caFile() string     { return filepath.Join(b.configDir, "ca.pem") }
func (b *bootstrapConfig) stateFile() string  { return filepath.Join(b.stateDir, "state.db") }
func (b *bootstrapConfig) unitFile() string   { return filepath.Join(b.systemdDir, "machina.service") }

// unitFeatures are the features of machina serve that need privileges
// beyond an ordinary user's. The unit grants what the enabled ones need and
// nothing more (capabilities(7), systemd.exec(5) RestrictAddressFamilies).
type unitFeatures struct {
	// LowPorts: a listener below 1024 (DHCP 67, TFTP 69, HTTP 80):
	// CAP_NET_BIND_SERVICE.
	LowPorts bool
	// Netboot: DHCP (ports 67 and 4011, its socket bound to the
	// provisioning interface with SO_BINDTODEVICE) and the IPv6 router
	// advertisement (a raw ICMPv6 socket): CAP_NET_RAW, and LowPorts.
	Netboot bool
	// VIP: the HA provisioning virtual IP: adding the address over
	// rtnetlink needs CAP_NET_ADMIN, the gratuitous ARP on an AF_PACKET
	// socket CAP_NET_RAW and the AF_PACKET family.
	VIP bool
}

// allFeatures is what the Debian package's unit grants: the package
// cannot know which features a site turns on.
var allFeatures = unitFeatures{LowPorts: true, Netboot: true, VIP: true}

// caps returns the capabilities f needs, and why, one comment line each.
func (f unitFeatures) caps() (caps, why []string) {
	if f.LowPorts || f.Netboot {
		caps = append(caps, "CAP_NET_BIND_SERVICE")
		why = append(why, "CAP_NET_BIND_SERVICE: DHCP (67), TFTP (69) and any listener below 1024 (HTTP 80).")
	}
	if f.Netboot || f.VIP {
		caps = append(caps, "CAP_NET_RAW")
		why = append(why, "CAP_NET_RAW: DHCP's socket bound to the provisioning interface (SO_BINDTODEVICE),",
			"  the IPv6 router advertisement (raw ICMPv6), the VIP's gratuitous ARP (AF_PACKET).")
	}
	if f.VIP {
		caps = append(caps, "CAP_NET_ADMIN")
		why = append(why, "CAP_NET_ADMIN: the HA leader adds the provisioning virtual IP (--vip) over rtnetlink.")
	}
	if len(caps) == 0 {
		why = append(why, "No DHCP, TFTP, VIP or port below 1024 configured: no capability.")
	}
	return caps, why
}

// families returns the socket address families f needs: IPv4 and IPv6,
// netlink (the Go runtime reads interfaces and addresses over rtnetlink),
// Unix sockets (an SSH agent for Git over SSH), and AF_PACKET for the
// VIP's gratuitous ARP.
func (f unitFeatures) families() []string {
	fam := []string{"AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK"}
	if f.VIP {
		fam = append(fam, "AF_PACKET")
	}
	return fam
}

// renderUnit renders machina.service for the binary, config and user,
// granting what features needs.
func renderUnit(binary, config, user string, features unitFeatures) (string, error) {
	t, err := template.New("unit").Parse(unitTemplate)
	if err != nil {
		return "", err
	}
	caps, why := features.caps()
	var buf bytes.Buffer
	err = t.Execute(&buf, struct {
		Binary, Config, User, Caps, Families string
		Why                                  []string
	}{binary, config, user, strings.Join(caps, " "), strings.Join(features.families(), " "), why})
	return buf.String(), err
}

// unitFeatures is what the configuration bootstrap writes turns on: DHCP
// and TFTP with --provisioning-interface, low ports from the listeners. HA
// (--vip) is set up later by hand (docs/ha.md): its unit then needs the
// package's grants, or bootstrap --print-unit's.
func (b *bootstrapConfig) unitFeatures() unitFeatures {
	f := unitFeatures{Netboot: b.provIface != ""}
	for _, l := range []string{b.listen, b.adminListen, b.joinListen} {
		if _, p, err := net.SplitHostPort(l); err == nil {
			if n, err := strconv.Atoi(p); err == nil && n > 0 && n < 1024 {
				f.LowPorts = true
			}
		}
	}
	return f
}

// newBootstrapCmd is `machina bootstrap`.
func newBootstrapCmd(e *env) *cobra.Command {
	var b bootstrapConfig
	cmd := &cobra.Command{
		Use:   "bootstrap",
		Short: "Set up a controller host: state file, master key, CA, first admin token, /etc/machina/machina.yaml, systemd unit",
		Long: `Set up a fresh controller host. It creates, under --root (default /):
  /var/lib/machina/state.db      the state file (0600)
  /etc/machina/master.key        the master key sealing secrets: 64 hex digits (32 random bytes), 0600
  /etc/machina/ca.pem            the controller CA's certificate (the CA key is sealed in the state file);
                                 machinactl pins it: export MACHINA_CA=/etc/machina/ca.pem
  /var/lib/machina/iso           the iPXE ISOs for virtual-media boot (iso-dir; copy make ipxe-iso's output here)
  /etc/machina/machina.yaml      machina serve's configuration, from these flags and the detected interfaces
  /etc/systemd/system/machina.service  unless the Debian package already installed the unit
and a first admin token, printed once on stdout (never stored in clear, never logged).
It refuses to touch a host where any of these files exist.`,
		Example: "  machina bootstrap --repo https://git.example/site/inventory.git --provisioning-interface eno2 > admin.token",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBootstrap(e, &b)
		},
	}
	f := cmd.Flags()
	f.StringVar(&b.root, "root", "/", "prefix of every path bootstrap writes (tests, image builds)")
	f.StringVar(&b.configDir, "config-dir", "", "configuration folder (default ROOT/etc/machina)")
	f.StringVar(&b.stateDir, "state-dir", "", "state folder (default ROOT/var/lib/machina)")
	f.StringVar(&b.isoDir, "iso-dir", "", "folder of the iPXE ISOs that virtual-media boot mounts (default STATE-DIR/iso)")
	f.StringVar(&b.systemdDir, "systemd-dir", "", "where machina.service goes (default ROOT/etc/systemd/system, skipped when the package's unit exists)")
	f.StringVar(&b.user, "user", "machina", "service user owning the state and key when bootstrap runs as root and the user exists")
	f.StringVar(&b.tokenName, "admin-token-name", "admin", "name of the first admin token")
	f.StringVar(&b.binary, "binary", "/usr/bin/machina", "the machina executable the unit starts")
	f.StringVar(&b.repo, "repo", "", "inventory repository URL (file://, https://, ssh://); empty: serve runs the admin API only until you add repo: to machina.yaml")
	f.StringVar(&b.branch, "branch", "main", "inventory branch")
	f.StringVar(&b.listen, "listen", ":8080", "plain HTTP listener of the machine-facing endpoints (iPXE, ramdisk, images)")
	f.StringVar(&b.adminListen, "admin-listen", ":"+controller.DefaultAdminTLSPort, "TLS listener of the admin API and UI")
	f.StringVar(&b.joinListen, "join-listen", ":8443", "TLS join listener")
	f.StringVar(&b.provIface, "provisioning-interface", "", "interface on the provisioning network: DHCP (proxy mode unless --dhcp-pool), TFTP, and the public and join URLs on its IPv4 address")
	f.StringVar(&b.dhcpPool, "dhcp-pool", "", "full DHCP on --provisioning-interface with this pool FIRST-LAST (its subnet is the interface's)")
	f.StringVar(&b.publicURL, "public-url", "", "the controller's URL as machines reach it (default http://<provisioning address>:<listen port>)")
	f.StringVar(&b.tftpRoot, "tftp-root", "/usr/lib/ipxe", "TFTP folder with the iPXE binaries (Debian package ipxe)")
	f.StringVar(&b.ramdiskDir, "ramdisk-dir", "/usr/lib/machina/ramdisk", "folder with vmlinuz and initrd.cpio.gz")
	f.StringVar(&b.nodeBinary, "node-binary", "/usr/bin/machina-node", "machina-node executable served to installing hosts")
	f.StringSliceVar(&b.adminNames, "admin-name", nil, "extra DNS name or IP in the admin TLS certificate (repeatable)")
	f.BoolVar(&b.printUnit, "print-unit", false, "print machina.service for these paths and exit, writing nothing: the unit granting every feature (DHCP, TFTP, HA virtual IP) what it needs; packaging/deb/machina.service is this with the defaults")
	return cmd
}

// siteFiles are the files whose presence means a site exists.
func (b *bootstrapConfig) siteFiles() []string {
	return []string{b.configFile(), b.keyFile(), b.caFile(), b.stateFile()}
}

func runBootstrap(e *env, b *bootstrapConfig) (err error) {
	b.setDefaults()
	if b.printUnit {
		unit, err := renderUnit(b.binary, b.configFile(), b.user, allFeatures)
		if err != nil {
			return err
		}
		_, err = fmt.Fprint(e.stdout, unit)
		return err
	}
	writeUnit := b.findUnit(e)
	if !state.ValidName(b.tokenName) {
		return usageError{fmt.Errorf("bootstrap: --admin-token-name %q: want an RFC 1123 label", b.tokenName)}
	}
	if err := b.refuseExisting(writeUnit); err != nil {
		return err
	}
	yaml, err := b.renderConfig()
	if err != nil {
		return usageError{fmt.Errorf("bootstrap: %w", err)}
	}
	unit, err := renderUnit(b.binary, b.configFile(), b.user, b.unitFeatures())
	if err != nil {
		return fmt.Errorf("bootstrap: unit: %w", err)
	}

	// From here on, every file made is removed again if a later step fails.
	fm := &fileMaker{}
	defer func() {
		if err != nil {
			fm.undo()
		}
	}()
	if err := fm.mkdir(b.configDir, 0o755); err != nil {
		return err
	}
	if err := fm.mkdir(b.stateDir, 0o700); err != nil {
		return err
	}
	if err := fm.mkdir(b.isoDir, 0o750); err != nil {
		return err
	}
	ca, token, err := b.createState(fm)
	if err != nil {
		return err
	}
	if err := fm.write(b.caFile(), ca.PEM(), 0o644); err != nil {
		return err
	}
	if err := fm.write(b.configFile(), []byte(yaml), 0o640); err != nil {
		return err
	}
	if writeUnit {
		if err := fm.mkdir(b.systemdDir, 0o755); err != nil {
			return err
		}
		if err := fm.write(b.unitFile(), []byte(unit), 0o644); err != nil {
			return err
		}
	}
	owner := b.chownToServiceUser()
	fmt.Fprintln(e.stdout, token)
	b.printSummary(e.stderr, ca, writeUnit, owner)
	return nil
}

// setDefaults puts the config and state folders under --root (default /).
func (b *bootstrapConfig) setDefaults() {
	if b.root == "" {
		b.root = "/"
	}
	if b.configDir == "" {
		b.configDir = filepath.Join(b.root, "/etc/machina")
	}
	if b.stateDir == "" {
		b.stateDir = filepath.Join(b.root, "/var/lib/machina")
	}
	if b.isoDir == "" {
		b.isoDir = filepath.Join(b.stateDir, "iso")
	}
}

// findUnit picks the systemd unit folder (default /etc/systemd/system
// under --root) and reports whether to write the unit: not when a package
// installed one.
func (b *bootstrapConfig) findUnit(e *env) bool {
	if b.systemdDir != "" {
		return true
	}
	b.systemdDir = filepath.Join(b.root, "/etc/systemd/system")
	for _, p := range []string{"/lib/systemd/system/machina.service", "/usr/lib/systemd/system/machina.service"} {
		if _, err := os.Stat(filepath.Join(b.root, p)); err == nil {
			fmt.Fprintf(e.stderr, "systemd unit: %s (from the package)\n", filepath.Join(b.root, p))
			return false
		}
	}
	return true
}

// refuseExisting refuses an existing site before anything is written.
func (b *bootstrapConfig) refuseExisting(writeUnit bool) error {
	var existing []string
	for _, p := range append(b.siteFiles(), b.unitFile()) {
		if p == b.unitFile() && !writeUnit {
			continue
		}
		if _, err := os.Lstat(p); err == nil {
			existing = append(existing, p)
		}
	}
	if len(existing) == 0 {
		return nil
	}
	return fmt.Errorf("bootstrap: a site already exists here (%s); bootstrap never overwrites one. "+
		"To run it: machina serve --config %s (or systemctl start machina). "+
		"To start over: stop machina, keep a backup (machinactl state snapshot FILE), remove those files, then run machina bootstrap again; "+
		"or bootstrap elsewhere with --root DIR", strings.Join(existing, ", "), b.configFile())
}

// createState writes a fresh master key and creates the state file
// sealed with it, the controller CA and the first admin token.
func (b *bootstrapConfig) createState(fm *fileMaker) (*join.CA, string, error) {
	raw := make([]byte, MasterKeyBytes)
	if _, err := rand.Read(raw); err != nil {
		return nil, "", fmt.Errorf("bootstrap: master key: %w", err)
	}
	key := []byte(hex.EncodeToString(raw))
	if err := fm.write(b.keyFile(), append(append([]byte{}, key...), '\n'), 0o600); err != nil {
		return nil, "", err
	}
	fm.made = append(fm.made, b.stateFile())
	st, err := state.Open(b.stateFile(), state.Options{MasterKey: key})
	if err != nil {
		return nil, "", fmt.Errorf("bootstrap: %w", explainOpen(b.stateFile(), err))
	}
	ca, err := join.LoadOrCreateCA(st, nil)
	if err != nil {
		st.Close()
		return nil, "", fmt.Errorf("bootstrap: CA: %w", err)
	}
	token, _, err := st.CreateAdminToken(b.tokenName, "bootstrap")
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, "", fmt.Errorf("bootstrap: admin token: %w", err)
	}
	if err := os.Chmod(b.stateFile(), 0o600); err != nil {
		return nil, "", fmt.Errorf("bootstrap: %w", err)
	}
	return ca, token, nil
}

// printSummary tells the operator what was made and what to do next.
func (b *bootstrapConfig) printSummary(w io.Writer, ca *join.CA, writeUnit bool, owner string) {
	fmt.Fprintf(w, "machina bootstrap: site created\n")
	fmt.Fprintf(w, "  state file:   %s (0600)\n", b.stateFile())
	fmt.Fprintf(w, "  master key:   %s (0600, 64 hex digits; back it up apart from the state file: without it sealed secrets are lost)\n", b.keyFile())
	fmt.Fprintf(w, "  CA:           %s (fingerprint %s)\n", b.caFile(), ca.Fingerprint())
	fmt.Fprintf(w, "  config:       %s\n", b.configFile())
	fmt.Fprintf(w, "  ISO folder:   %s (virtual-media boot: put machina-ipxe-bios.iso and machina-ipxe-uefi.iso from make ipxe-iso here)\n", b.isoDir)
	if writeUnit {
		fmt.Fprintf(w, "  systemd unit: %s\n", b.unitFile())
	}
	if owner != "" {
		fmt.Fprintf(w, "  owner:        %s\n", owner)
	}
	fmt.Fprintf(w, "The admin token %q is the line printed on stdout, shown only this once.\n", b.tokenName)
	fmt.Fprintf(w, "Next: systemctl daemon-reload && systemctl enable --now machina\n")
	fmt.Fprintf(w, "      export MACHINA_API=%s MACHINA_CA=%s MACHINA_TOKEN=<the token>\n", b.adminURL(), b.caFile())
}

// fileMaker makes folders and files that are removed again (undo,
// newest first) when a later bootstrap step fails.
type fileMaker struct{ made []string }

func (fm *fileMaker) undo() {
	for i := len(fm.made) - 1; i >= 0; i-- {
		_ = os.Remove(fm.made[i])
	}
}

// mkdir makes dir and the parents that did not exist, recording them.
func (fm *fileMaker) mkdir(dir string, mode fs.FileMode) error {
	var fresh []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		fresh = append(fresh, d)
		if d == filepath.Dir(d) {
			break
		}
	}
	if err := os.MkdirAll(dir, mode); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	for i := len(fresh) - 1; i >= 0; i-- {
		fm.made = append(fm.made, fresh[i])
	}
	return nil
}

// write creates path (never over an existing file) with data and mode
// (not narrowed by the umask), recording it.
func (fm *fileMaker) write(path string, data []byte, mode fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	fm.made = append(fm.made, path)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("bootstrap: write %s: %w", path, err)
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("bootstrap: %w", err)
	}
	return f.Close()
}

// chownToServiceUser gives the state and key to the service user when
// bootstrap runs as root on the real root and the user exists; it returns
// what it did ("" when nothing).
func (b *bootstrapConfig) chownToServiceUser() string {
	if os.Geteuid() != 0 || filepath.Clean(b.root) != "/" {
		return ""
	}
	u, err := user.Lookup(b.user)
	if err != nil {
		return ""
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	for _, p := range []string{b.stateDir, b.isoDir, b.stateFile(), b.keyFile()} {
		_ = os.Chown(p, uid, gid)
	}
	_ = os.Chown(b.configFile(), 0, gid)
	return b.user + " (state folder, ISO folder, state file, master key; machina.yaml group-readable)"
}

// adminURL is the https URL machinactl uses, as far as bootstrap knows it.
func (b *bootstrapConfig) adminURL() string {
	host, port, err := net.SplitHostPort(b.adminListen)
	if err != nil {
		return "https://" + b.adminListen
	}
	if ip, err := netip.ParseAddr(host); host == "" || (err == nil && ip.IsUnspecified()) {
		host, _ = os.Hostname()
	}
	return "https://" + net.JoinHostPort(host, port)
}

// ifaceAddrs lists an interface's IPv4 prefixes.
func ifaceAddrs(ifc net.Interface) []netip.Prefix {
	addrs, err := ifc.Addrs()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			out = append(out, p)
		}
	}
	return out
}

// writeInterfaces lists the host's interfaces and IPv4 prefixes as
// comments (what the operator picks --provisioning-interface from).
func writeInterfaces(sb *strings.Builder) {
	ifs, _ := net.Interfaces()
	fmt.Fprintf(sb, "# Interfaces found at bootstrap:\n")
	for _, ifc := range ifs {
		var ps []string
		for _, p := range ifaceAddrs(ifc) {
			ps = append(ps, p.String())
		}
		fmt.Fprintf(sb, "#   %-12s %s %s\n", ifc.Name, ifc.HardwareAddr, strings.Join(ps, " "))
	}
}

// provisioning writes the DHCP and TFTP keys of the provisioning
// interface (full DHCP with --dhcp-pool, else proxy) and returns the
// public and join URLs on its address; only a comment without one.
func (b *bootstrapConfig) provisioning(sb *strings.Builder) (publicURL, joinURL string, err error) {
	q := strconv.Quote
	publicURL = b.publicURL
	if b.provIface != "" {
		ifc, err := net.InterfaceByName(b.provIface)
		if err != nil {
			return "", "", fmt.Errorf("--provisioning-interface %q: %w", b.provIface, err)
		}
		ps := ifaceAddrs(*ifc)
		if len(ps) == 0 {
			return "", "", fmt.Errorf("--provisioning-interface %s has no IPv4 address: give it its provisioning address first", b.provIface)
		}
		addr := ps[0].Addr().String()
		_, port, _ := net.SplitHostPort(b.listen)
		_, jport, _ := net.SplitHostPort(b.joinListen)
		if publicURL == "" {
			publicURL = "http://" + net.JoinHostPort(addr, port)
		}
		joinURL = "https://" + net.JoinHostPort(addr, jport)
		fmt.Fprintf(sb, "dhcp-interface:\n  - %s\n", q(b.provIface))
		if b.dhcpPool != "" {
			a, c, ok := strings.Cut(b.dhcpPool, "-")
			pa, err1 := netip.ParseAddr(a)
			pc, err2 := netip.ParseAddr(c)
			if !ok || err1 != nil || err2 != nil || !ps[0].Contains(pa) || !ps[0].Contains(pc) {
				return "", "", fmt.Errorf("--dhcp-pool %q: want FIRST-LAST inside %s", b.dhcpPool, ps[0].Masked())
			}
			fmt.Fprintf(sb, "dhcp-mode: full\ndhcp-subnet: %s\ndhcp-pool: %s\n", q(ps[0].Masked().String()), q(b.dhcpPool))
		} else {
			fmt.Fprintf(sb, "dhcp-mode: proxy   # PXE options only, beside the site's DHCP server\n")
		}
		fmt.Fprintf(sb, "tftp-root: %s\n", q(b.tftpRoot))
	} else if b.dhcpPool != "" {
		return "", "", errors.New("--dhcp-pool needs --provisioning-interface")
	} else {
		fmt.Fprintf(sb, "# dhcp-interface: [eno2]   (machina bootstrap --provisioning-interface IF fills DHCP, TFTP and the URLs)\n")
	}
	return publicURL, joinURL, nil
}

// renderConfig writes machina.yaml: every key is a machina serve flag.
func (b *bootstrapConfig) renderConfig() (string, error) {
	for _, a := range []struct{ flag, v string }{{"--listen", b.listen}, {"--admin-listen", b.adminListen}, {"--join-listen", b.joinListen}} {
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			return "", fmt.Errorf("%s %q: want HOST:PORT or :PORT", a.flag, a.v)
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "# machina serve configuration, written by machina bootstrap.\n")
	fmt.Fprintf(&sb, "# Keys are machina serve's flag names (machina serve --help); a flag or MACHINA_<FLAG>\n")
	fmt.Fprintf(&sb, "# overrides a key; an unknown key stops machina serve naming its line.\n")
	writeInterfaces(&sb)
	q := func(s string) string { return strconv.Quote(s) }
	fmt.Fprintf(&sb, "state: %s\n", q(filepath.Join(b.stateDir, "state.db")))
	fmt.Fprintf(&sb, "work-dir: %s\n", q(b.stateDir))
	fmt.Fprintf(&sb, "master-key-file: %s\n", q(b.keyFile()))
	fmt.Fprintf(&sb, "listen: %s\n", q(b.listen))
	fmt.Fprintf(&sb, "admin-listen: %s\n", q(b.adminListen))
	if len(b.adminNames) > 0 {
		fmt.Fprintf(&sb, "admin-name:\n")
		for _, n := range b.adminNames {
			fmt.Fprintf(&sb, "  - %s\n", q(n))
		}
	}
	fmt.Fprintf(&sb, "join-listen: %s\n", q(b.joinListen))
	if b.repo != "" {
		fmt.Fprintf(&sb, "repo: %s\nbranch: %s\n", q(b.repo), q(b.branch))
	} else {
		fmt.Fprintf(&sb, "# repo: https://git.example/site/inventory.git   (without it only the admin API runs)\n")
	}
	publicURL, joinURL, err := b.provisioning(&sb)
	if err != nil {
		return "", err
	}
	if publicURL != "" {
		fmt.Fprintf(&sb, "public-url: %s\n", q(publicURL))
	}
	if joinURL != "" {
		fmt.Fprintf(&sb, "join-url: %s\n", q(joinURL))
	}
	fmt.Fprintf(&sb, "# Virtual-media boot mounts the iPXE ISOs from here (/boot/iso/): machina-ipxe-bios.iso and\n")
	fmt.Fprintf(&sb, "# machina-ipxe-uefi.iso, built by make ipxe-iso.\n")
	fmt.Fprintf(&sb, "iso-dir: %s\n", q(b.isoDir))
	fmt.Fprintf(&sb, "ramdisk-dir: %s\n", q(b.ramdiskDir))
	fmt.Fprintf(&sb, "node-binary: %s\n", q(b.nodeBinary))
	fmt.Fprintf(&sb, "log-format: json\nlog-level: info\n")
	return sb.String(), nil
}
