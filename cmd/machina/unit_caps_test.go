package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	ptftp "github.com/pin/tftp/v3"
	"golang.org/x/sys/unix"

	"github.com/machina-metal/machina/internal/peertest"
)

// packageUnit is the Debian package's unit, the one these tests hold to.
const packageUnit = "../../packaging/deb/machina.service"

// serviceKeys parses the [Service] section of a systemd unit file: each
// key's value (a later assignment replaces an earlier one, as systemd
// does for the keys read here).
func serviceKeys(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	keys := map[string]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: %q is not KEY=VALUE", path, line)
			}
			keys[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestUnitVerifies runs systemd-analyze verify (Debian package systemd) on
// the package's unit with the binary path pointing at an executable here,
// and on bootstrap's narrower unit: no error and no warning (an unknown
// address family or directive is only a warning there).
func TestUnitVerifies(t *testing.T) {
	sa := peertest.Command(t, "systemd-analyze")
	dir := t.TempDir()
	for name, f := range map[string]unitFeatures{"all.service": allFeatures, "none.service": {}, "netboot.service": {Netboot: true}} {
		unit, err := renderUnit("/bin/true", filepath.Join(dir, "machina.yaml"), "machina", f)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(sa, "verify", p).CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
		}
	}
}

// socketFamily matches a socket opened with a literal address family:
// unix.Socket(unix.AF_PACKET, ...) or syscall.Socket(syscall.AF_NETLINK, ...).
var socketFamily = regexp.MustCompile(`(?:unix|syscall)\.Socket\(\s*(?:unix|syscall)\.(AF_[A-Z0-9]+)`)

// TestUnitAddressFamiliesCoverCode: RestrictAddressFamilies cannot be
// reproduced without systemd as PID 1 (it is a seccomp filter systemd
// installs), so this checks it by reading the code instead: every address
// family a socket is opened with in the packages linked into machina
// (project and third-party, from go list -deps) is listed in the package's
// unit, and so are the standard library's (AF_INET, AF_INET6 for net;
// AF_NETLINK for net.Interfaces; AF_UNIX for Unix sockets). Before, the
// unit lacked AF_PACKET, which the VIP's gratuitous ARP opens.
func TestUnitAddressFamiliesCoverCode(t *testing.T) {
	allowed := strings.Fields(serviceKeys(t, packageUnit)["RestrictAddressFamilies"])
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}\t{{.Dir}}\t{{join .GoFiles \",\"}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	used := map[string][]string{"AF_INET": {"net"}, "AF_INET6": {"net"}, "AF_NETLINK": {"net.Interfaces"}, "AF_UNIX": {"net"}}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		parts := strings.Split(line, "\t")
		if len(parts) != 3 || parts[0] == "golang.org/x/sys/unix" || parts[2] == "" {
			continue // x/sys/unix defines the constants and opens nothing itself
		}
		for _, f := range strings.Split(parts[2], ",") {
			src, err := os.ReadFile(filepath.Join(parts[1], f))
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range socketFamily.FindAllSubmatch(src, -1) {
				fam := string(m[1])
				used[fam] = append(used[fam], parts[0]+"/"+f)
			}
		}
	}
	if _, ok := used["AF_PACKET"]; !ok {
		t.Errorf("no AF_PACKET socket found in the code (ha/vip.go opens one): the scan is broken")
	}
	for fam, where := range used {
		if !slices.Contains(allowed, fam) {
			t.Errorf("%s opens %s sockets, but %s's RestrictAddressFamilies=%s does not list it", strings.Join(where, ", "), fam, packageUnit, strings.Join(allowed, " "))
		}
	}
}

// setprivArgs turns the unit's User, capabilities and NoNewPrivileges into
// setpriv(1) options (util-linux): the process then runs with exactly the
// unit's capability sets (ambient and bounding), as systemd starts it.
func setprivArgs(t *testing.T, keys map[string]string, uid, gid int, drop string) []string {
	t.Helper()
	if keys["AmbientCapabilities"] != keys["CapabilityBoundingSet"] {
		t.Fatalf("unit: AmbientCapabilities=%q and CapabilityBoundingSet=%q differ", keys["AmbientCapabilities"], keys["CapabilityBoundingSet"])
	}
	set := "-all"
	for _, c := range strings.Fields(keys["AmbientCapabilities"]) {
		if c == drop {
			continue
		}
		set += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}
	args := []string{"--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(gid), "--clear-groups",
		"--inh-caps=" + set, "--ambient-caps=" + set, "--bounding-set=" + set}
	if keys["NoNewPrivileges"] == "yes" {
		args = append(args, "--no-new-privs")
	}
	return args
}

// netnsThread runs fn on an OS thread switched into the named network
// namespace and never switched back (the runtime discards the thread when
// the goroutine ends), and waits for it.
func netnsThread(t *testing.T, ns string, fn func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + ns)
		if err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
		}
		if err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func ipCmd(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// unitUser is the unit's User= when it exists here, else nobody: the
// point is an unprivileged user holding only the unit's capabilities.
func unitUser(t *testing.T, name string) (uid, gid int) {
	t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		u, err = user.Lookup("nobody")
	}
	if err != nil {
		t.Fatalf("no user %q and no nobody: %v", name, err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid
}

// TestUnitCapabilitiesRunHA runs the machina binary as an HA leader the way
// the package's unit starts it: an unprivileged user holding exactly the
// unit's capabilities (setpriv, from the unit file parsed here, so the test
// cannot drift from it), in a network namespace made for the test with a
// provisioning interface, etcd beside it. It proves that the leader adds
// the VIP (seen with ip addr), serves DHCP on port 67 (a client in a second
// namespace gets an offer from the VIP), TFTP on 69 (a download from the
// VIP) and HTTP on 80; then that the same run without CAP_NET_ADMIN fails
// with a message naming CAP_NET_ADMIN. Before, the unit lacked
// CAP_NET_ADMIN and AF_PACKET, and the leader got "operation not
// permitted" adding the address and exited.
func TestUnitCapabilitiesRunHA(t *testing.T) {
	peertest.Root(t, "network namespaces, setpriv")
	peertest.Commands(t, "ip", "setpriv", "etcd", "git")
	keys := serviceKeys(t, packageUnit)
	uid, gid := unitUser(t, keys["User"])

	base, err := os.MkdirTemp("", "machina-unit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil { // the service user reads the repo and TFTP root
		t.Fatal(err)
	}
	bin := buildMachina(t, base)

	// Namespaces: the controller's ("s", provisioning interface p0) and a
	// machine's ("c", interface c0 with the inventory's boot MAC).
	var sfx [3]byte
	_, _ = rand.Read(sfx[:])
	srv, cli := "munit-"+hex.EncodeToString(sfx[:])+"-s", "munit-"+hex.EncodeToString(sfx[:])+"-c"
	for _, ns := range []string{srv, cli} {
		ipCmd(t, "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	const mac = "52:54:00:aa:bb:01"
	ipCmd(t, "-n", srv, "link", "add", "p0", "type", "veth", "peer", "name", "c0", "netns", cli)
	ipCmd(t, "-n", cli, "link", "set", "c0", "address", mac)
	ipCmd(t, "-n", srv, "addr", "add", "10.91.0.1/24", "dev", "p0")
	ipCmd(t, "-n", srv, "link", "set", "p0", "up")
	ipCmd(t, "-n", cli, "link", "set", "c0", "up")

	// etcd inside the controller's namespace (its loopback: the ports are
	// free there, nothing else runs in it).
	etcdBin := peertest.Command(t, "etcd")
	// Its data on tmpfs where there is one: on a loaded machine etcd's
	// WAL fsyncs on disk can stall it past every timeout.
	shm := "/dev/shm"
	if fi, err := os.Stat(shm); err != nil || !fi.IsDir() {
		shm = ""
	}
	var etcd *exec.Cmd
	var etcdExited chan struct{}
	etcdStarts := 0
	// startEtcd (re)starts etcd on a fresh data folder, killing the one
	// before (our own child, by PID).
	startEtcd := func() {
		t.Helper()
		if etcd != nil {
			_ = etcd.Process.Kill()
			<-etcdExited
		}
		etcdStarts++
		data, err := os.MkdirTemp(shm, "machina-unit-etcd-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(data) })
		etcd = exec.Command("ip", "netns", "exec", srv, etcdBin, "--name", "e0", "--data-dir", data,
			"--heartbeat-interval", "100", "--election-timeout", "1000",
			"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
			"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
			"--initial-cluster", "e0=http://127.0.0.1:2380", "--logger", "zap", "--log-outputs", filepath.Join(base, fmt.Sprintf("etcd-%d.log", etcdStarts)))
		etcd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := etcd.Start(); err != nil {
			t.Fatal(err)
		}
		ex, cmd := make(chan struct{}), etcd
		go func() { _ = cmd.Wait(); close(ex) }()
		etcdExited = ex
	}
	startEtcd()
	t.Cleanup(func() { _ = etcd.Process.Kill(); <-etcdExited })

	// The inventory: one server whose boot MAC is the machine's.
	src := filepath.Join(base, "src")
	repo := filepath.Join(base, "inventory.git")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	inv := `servers:
  - name: r1-n01
    zone: zone-a
    site: lab1
    rack: r1
    bootMAC: "` + mac + `"
    bootMode: uefi
    bmc:
      driver: redfish
      address: https://127.0.0.1:9
      credentials: bmc-redfish
`
	if err := os.WriteFile(filepath.Join(src, "servers.yaml"), []byte(inv), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"init", "-q", "-b", "main", src}, {"-C", src, "add", "."},
		{"-C", src, "-c", "user.name=test", "-c", "user.email=test@example.invalid", "commit", "-q", "-m", "inventory"},
		{"clone", "-q", "--bare", src, repo}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	// The service user owns the repository it pushes status to (git also
	// refuses a repository owned by another user).
	if err := filepath.Walk(repo, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	}); err != nil {
		t.Fatal(err)
	}
	tftpRoot := filepath.Join(base, "tftp")
	want := bytes.Repeat([]byte("undionly"), 2048)
	if err := os.MkdirAll(tftpRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tftpRoot, "undionly.kpxe"), want, 0o644); err != nil {
		t.Fatal(err)
	}

	// serve starts machina serve as the unit would (less the capability
	// named by drop) and returns its log path and exit channel.
	serve := func(run int, drop string) (*exec.Cmd, string, chan error) {
		work := filepath.Join(base, fmt.Sprintf("work-%d", run))
		if err := os.MkdirAll(work, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(work, uid, gid); err != nil {
			t.Fatal(err)
		}
		logPath := filepath.Join(base, fmt.Sprintf("serve-%d.log", run))
		logf, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		args := append([]string{"netns", "exec", srv, peertest.Command(t, "setpriv")}, setprivArgs(t, keys, uid, gid, drop)...)
		args = append(args, bin, "serve", "--state", "etcd://127.0.0.1:2379/site", "--ha-id", "ctl1", "--ha-ttl", "3s",
			"--ha-admin-url", "https://10.91.0.1:8444", "--vip", "10.91.0.100/24", "--vip-interface", "p0",
			"--repo", "file://"+repo, "--work-dir", work, "--poll-interval", "1s", "--bmc-watch-interval", "-1s",
			"--listen", "0.0.0.0:80", "--admin-listen", "10.91.0.1:8444", "--join-listen", "10.91.0.1:8443",
			"--public-url", "http://10.91.0.100", "--join-url", "https://10.91.0.100:8443",
			"--dhcp-interface", "p0", "--dhcp-mode", "full", "--dhcp-subnet", "10.91.0.0/24", "--dhcp-pool", "10.91.0.150-10.91.0.160",
			"--tftp-root", tftpRoot, "--log-format", "text")
		cmd := exec.Command("ip", args...)
		cmd.Env = []string{"HOME=" + work, "PATH=/usr/bin:/bin"}
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		finished := make(chan struct{})
		go func() { err := cmd.Wait(); logf.Close(); close(finished); done <- err }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill() // our own child, by PID; an error once it has exited
			<-finished
		})
		return cmd, logPath, done
	}
	logOf := func(p string) string { b, _ := os.ReadFile(p); return string(b) }
	// etcdReady waits until etcd answers in the namespace: on a loaded
	// machine it can stall for seconds, and machina serve exits when it
	// cannot open the state at start (systemd's Restart= would retry).
	etcdctl := peertest.Command(t, "etcdctl")
	etcdReady := func() {
		t.Helper()
		for try := 1; ; try++ {
			deadline := time.Now().Add(20 * time.Second)
			for {
				out, err := exec.Command("ip", "netns", "exec", srv, etcdctl, "--endpoints", "127.0.0.1:2379", "--command-timeout", "5s", "endpoint", "health").CombinedOutput()
				if err == nil {
					return
				}
				if time.Now().After(deadline) {
					if try == 3 {
						t.Fatalf("etcd not healthy in 3 starts of 20s: %v\n%s\netcd log:\n%s", err, out, logOf(filepath.Join(base, fmt.Sprintf("etcd-%d.log", etcdStarts))))
					}
					t.Logf("etcd not healthy after 20s (%s); starting it again", bytes.TrimSpace(out))
					startEtcd()
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	}
	// startUp is serve, started again (as systemd's Restart=on-failure
	// would) when it exited because it could not open the state in etcd
	// at start; at most three tries.
	startUp := func(run int, drop string) (*exec.Cmd, string, chan error) {
		t.Helper()
		for try := 0; ; try++ {
			etcdReady()
			cmd, logPath, done := serve(run*10+try, drop)
			if try == 2 {
				return cmd, logPath, done
			}
			// Wait until it is past opening the state (elected, or exited).
			for {
				l := logOf(logPath)
				if strings.Contains(l, "elected leader") {
					return cmd, logPath, done
				}
				select {
				case err := <-done:
					if strings.Contains(logOf(logPath), "open state") {
						t.Logf("machina serve could not open the state (%v); starting it again", err)
					} else {
						// Exited for another reason: the caller judges.
						ch := make(chan error, 1)
						ch <- err
						return cmd, logPath, ch
					}
				case <-time.After(100 * time.Millisecond):
					continue
				}
				break
			}
		}
	}

	// Run 1: the unit's capabilities. The leader adds the VIP.
	cmd, logPath, done := startUp(1, "")
	deadline := time.Now().Add(90 * time.Second)
	for !strings.Contains(ipCmd(t, "-n", srv, "-4", "addr", "show", "dev", "p0"), "10.91.0.100/24") {
		select {
		case err := <-done:
			t.Fatalf("machina serve exited (%v) before adding the VIP:\n%s", err, logOf(logPath))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no VIP on p0 after 90s:\n%s", logOf(logPath))
		}
	}

	// DHCP: the machine gets an offer from the VIP (the inventory is read
	// into the state after the first fetch: retried until then).
	var offerFrom, offered net.IP
	err = netnsThread(t, cli, func() error {
		c, err := nclient4.New("c0", nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(1))
		if err != nil {
			return err
		}
		defer c.Close()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			offer, err := c.DiscoverOffer(ctx)
			cancel()
			if err == nil {
				offerFrom, offered = offer.ServerIdentifier(), offer.YourIPAddr
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no DHCP offer: %w", err)
			}
		}
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, logOf(logPath))
	}
	if o := offered.To4(); !offerFrom.Equal(net.IPv4(10, 91, 0, 100)) || o == nil || !bytes.Equal(o[:3], []byte{10, 91, 0}) || o[3] < 150 || o[3] > 160 {
		t.Errorf("DHCP offer of %s from %s; want a pool address from the VIP 10.91.0.100", offered, offerFrom)
	}

	// TFTP from the VIP, and HTTP on port 80.
	ipCmd(t, "-n", cli, "addr", "add", "10.91.0.2/24", "dev", "c0")
	var got bytes.Buffer
	err = netnsThread(t, cli, func() error {
		c, err := ptftp.NewClient("10.91.0.100:69")
		if err != nil {
			return err
		}
		c.SetTimeout(2 * time.Second)
		wt, err := c.Receive("undionly.kpxe", "octet")
		if err != nil {
			return err
		}
		_, err = wt.WriteTo(&got)
		return err
	})
	if err != nil || !bytes.Equal(got.Bytes(), want) {
		t.Errorf("TFTP from the VIP: %d bytes, %v; want %d bytes\n%s", got.Len(), err, len(want), logOf(logPath))
	}
	err = netnsThread(t, cli, func() error {
		conn, err := net.DialTimeout("tcp", "10.91.0.100:80", 5*time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	})
	if err != nil {
		t.Errorf("HTTP port 80 on the VIP: %v", err)
	}

	// Stop (SIGTERM, as systemctl stop): the leader resigns and removes
	// the VIP.
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("machina serve did not stop on SIGTERM:\n%s", logOf(logPath))
	}

	// Run 2: the same without CAP_NET_ADMIN. It is elected, cannot add
	// the VIP, and says which capability it needs.
	_, logPath2, done2 := startUp(2, "CAP_NET_ADMIN")
	select {
	case <-done2:
	case <-time.After(90 * time.Second):
		t.Fatalf("machina serve without CAP_NET_ADMIN still runs after 90s:\n%s", logOf(logPath2))
	}
	l := logOf(logPath2)
	if !strings.Contains(l, "needs CAP_NET_ADMIN") {
		t.Errorf("without CAP_NET_ADMIN the log does not name it:\n%s", l)
	}
	for _, line := range strings.Split(l, "\n") {
		if strings.Contains(line, "CAP_NET_ADMIN") {
			t.Logf("without CAP_NET_ADMIN: %s", line)
			break
		}
	}
	if strings.Contains(ipCmd(t, "-n", srv, "-4", "addr", "show", "dev", "p0"), "10.91.0.100") {
		t.Error("the VIP is on p0 without CAP_NET_ADMIN")
	}
}
