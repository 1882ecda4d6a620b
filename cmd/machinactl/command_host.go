package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join/node"
	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"
)

// sshTarget is one USER@HOST[:PORT] of `host add`.
type sshTarget struct {
	Spec, User, Addr string
}

var (
	sshUserRE = regexp.MustCompile(`^[a-z_][a-z0-9_.-]{0,31}$`)
	sshHostRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$`)
)

// parseTarget accepts USER@HOST, USER@HOST:PORT and USER@[IPv6]:PORT.
func parseTarget(s string) (sshTarget, error) {
	user, hostport, ok := strings.Cut(s, "@")
	if !ok || !sshUserRE.MatchString(user) {
		return sshTarget{}, fmt.Errorf("%q: want USER@HOST[:PORT] with a POSIX user name", s)
	}
	host, port := hostport, "22"
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		host, port = h, p
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return sshTarget{}, fmt.Errorf("%q: bad port %q", s, port)
	}
	if net.ParseIP(host) == nil && !sshHostRE.MatchString(host) {
		return sshTarget{}, fmt.Errorf("%q: %q is not a host name or IP address", s, host)
	}
	return sshTarget{Spec: s, User: user, Addr: net.JoinHostPort(host, port)}, nil
}

// readTargets reads one USER@HOST per line; blank lines and # comments are skipped.
func readTargets(r io.Reader) ([]sshTarget, error) {
	var out []sshTarget
	sc := bufio.NewScanner(io.LimitReader(r, 4<<20))
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		if line == "" {
			continue
		}
		t, err := parseTarget(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, t)
	}
	return out, sc.Err()
}

// installer is what `host add` copies to each host.
type installer struct {
	info   v1.JoinInfo
	script []byte
}

// fetchInstaller gets the join info over the admin API and the install
// script from the join listener (TLS pinned to the CA), and checks the
// script's SHA-256 against the pinned one.
func fetchInstaller(ctx context.Context, c *v1.Client) (installer, error) {
	info, err := c.JoinInfo(ctx)
	if err != nil {
		return installer{}, err
	}
	u, err := url.Parse(info.JoinURL)
	if err != nil {
		return installer{}, fmt.Errorf("join URL %q: %w", info.JoinURL, err)
	}
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: node.PinnedTLS(info.CAFingerprint, u.Hostname())}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, info.JoinURL+"/join/install.sh", nil)
	if err != nil {
		return installer{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return installer{}, fmt.Errorf("fetch install script: %w", err)
	}
	defer resp.Body.Close()
	script, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return installer{}, fmt.Errorf("fetch install script: status %d: %v", resp.StatusCode, err)
	}
	sum := sha256.Sum256(script)
	if got := hex.EncodeToString(sum[:]); got != info.ScriptSHA256 {
		return installer{}, fmt.Errorf("install script checksum mismatch: got %s, want %s", got, info.ScriptSHA256)
	}
	return installer{info: info, script: script}, nil
}

var tokenSafeRE = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)

// remoteScript is fed to `sh -s` on the host: it writes the CA and the
// install script into a private temp dir (heredocs: nothing in argv),
// re-checks the script's SHA-256 there, and runs it with the token in the
// environment.
func (in installer) remoteScript(token string) (string, error) {
	if !tokenSafeRE.MatchString(token) {
		return "", errors.New("token has unexpected characters")
	}
	for _, b := range [][]byte{in.script, []byte(in.info.CA)} {
		if bytes.Contains(b, []byte("MACHINA_EOF")) {
			return "", errors.New("installer contains the heredoc delimiter")
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "set -eu\numask 077\nd=\"$(mktemp -d /tmp/machina-install.XXXXXX)\"\ntrap 'rm -rf \"$d\"' EXIT\n")
	fmt.Fprintf(&b, "cat > \"$d/ca.pem\" <<'MACHINA_EOF'\n%sMACHINA_EOF\n", strings.TrimSuffix(in.info.CA, "\n")+"\n")
	fmt.Fprintf(&b, "cat > \"$d/install.sh\" <<'MACHINA_EOF'\n%sMACHINA_EOF\n", strings.TrimSuffix(string(in.script), "\n")+"\n")
	fmt.Fprintf(&b, "[ \"$(sha256sum \"$d/install.sh\" | cut -d' ' -f1)\" = '%s' ] || { echo 'machina-install: copied script checksum mismatch' >&2; exit 1; }\n", in.info.ScriptSHA256)
	fmt.Fprintf(&b, "MACHINA_JOIN_TOKEN='%s' sh \"$d/install.sh\" --join '%s' --ca \"$d/ca.pem\" --fingerprint '%s'\n", token, in.info.JoinURL, in.info.CAFingerprint)
	return b.String(), nil
}

// sshClientConfig builds the client config: known_hosts checked, keys
// from the identity file and the SSH agent.
func sshClientConfig(identity, knownHostsFile string, timeout time.Duration) (func(user string) *ssh.ClientConfig, func(), error) {
	hk, err := knownhosts.New(knownHostsFile)
	if err != nil {
		return nil, nil, fmt.Errorf("known_hosts %s: %w", knownHostsFile, err)
	}
	var methods []ssh.AuthMethod
	var signers []ssh.Signer
	if identity != "" {
		data, err := os.ReadFile(identity)
		if err != nil {
			return nil, nil, fmt.Errorf("identity: %w", err)
		}
		s, err := ssh.ParsePrivateKey(data)
		if err != nil {
			return nil, nil, fmt.Errorf("identity %s: %w (passphrase-protected keys: use ssh-agent)", identity, err)
		}
		signers = append(signers, s)
	}
	closer := func() {}
	if sock := os.Getenv("SSH_AUTH_SOCK"); sock != "" {
		if conn, err := net.Dial("unix", sock); err == nil {
			ag := agent.NewClient(conn)
			closer = func() { conn.Close() }
			methods = append(methods, ssh.PublicKeysCallback(func() ([]ssh.Signer, error) {
				as, err := ag.Signers()
				return append(append([]ssh.Signer(nil), signers...), as...), err
			}))
		}
	}
	if len(methods) == 0 {
		if len(signers) == 0 {
			return nil, nil, errors.New("no SSH key: pass --identity or run ssh-agent")
		}
		methods = append(methods, ssh.PublicKeys(signers...))
	}
	return func(user string) *ssh.ClientConfig {
		return &ssh.ClientConfig{User: user, Auth: methods, HostKeyCallback: hk, Timeout: timeout}
	}, closer, nil
}

// hostResult is one row of the result table.
type hostResult struct {
	Target string
	OK     bool
	Detail string
}

// addHost creates a fresh token, connects, copies and runs the installer.
func addHost(ctx context.Context, c *v1.Client, req v1.EnrolmentRequest, in installer, cfg *ssh.ClientConfig, t sshTarget, timeout time.Duration) hostResult {
	res := hostResult{Target: t.Spec}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tok, err := c.CreateEnrolmentToken(ctx, req)
	if err != nil {
		res.Detail = "create token: " + err.Error()
		return res
	}
	script, err := in.remoteScript(tok.Token)
	if err != nil {
		res.Detail = err.Error()
		return res
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", t.Addr)
	if err != nil {
		res.Detail = "connect: " + err.Error()
		return res
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	sc, chans, reqs, err := ssh.NewClientConn(conn, t.Addr, cfg)
	if err != nil {
		conn.Close()
		res.Detail = "ssh: " + err.Error()
		return res
	}
	client := ssh.NewClient(sc, chans, reqs)
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		res.Detail = "ssh session: " + err.Error()
		return res
	}
	defer sess.Close()
	var out capped
	sess.Stdout, sess.Stderr = &out, &out
	sess.Stdin = strings.NewReader(script)
	cmd := "sh -s"
	if t.User != "root" {
		cmd = "sudo -n sh -s"
	}
	err = sess.Run(cmd)
	res.Detail = lastLine(strings.ReplaceAll(out.String(), tok.Token, "[token]"))
	if err != nil {
		if res.Detail == "" {
			res.Detail = err.Error()
		} else {
			res.Detail = err.Error() + ": " + res.Detail
		}
		return res
	}
	res.OK = true
	return res
}

// capped keeps the last 64 KiB written.
type capped struct {
	mu  sync.Mutex
	buf []byte
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(c.buf, p...)
	if len(c.buf) > 64<<10 {
		c.buf = c.buf[len(c.buf)-64<<10:]
	}
	return len(p), nil
}

func (c *capped) String() string { c.mu.Lock(); defer c.mu.Unlock(); return string(c.buf) }

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// newHostCmd is `machinactl host add USER@HOST... [--file hosts.txt] [--parallel N]`.
func newHostCmd(e *env) *cobra.Command {
	var apiURL string
	cmd := &cobra.Command{Use: "host", Short: "Join existing machines to the fleet"}
	cmd.PersistentFlags().StringVar(&apiURL, "api", apiFlagDefault(), "admin API base URL (env "+envAPI+"); the token comes from "+envToken)
	cmd.AddCommand(hostAddCmd(e, &apiURL), hostListCmd(e, &apiURL), hostFenceCmd(e, &apiURL), hostUnfenceCmd(e, &apiURL))
	return cmd
}

// hostAddCmd is `machinactl host add`.
func hostAddCmd(e *env, apiURL *string) *cobra.Command {
	var tf tokenFlags
	var file, identity, knownHosts string
	var parallel int
	var timeout time.Duration
	home, _ := os.UserHomeDir()
	add := &cobra.Command{
		Use:   "add [USER@HOST[:PORT]...] [--file hosts.txt] [--parallel N]",
		Short: "Install machina-node over SSH and join each host with a fresh enrolment token",
		Long: "Connects with SSH (host keys checked against known_hosts, keys from --identity or ssh-agent),\n" +
			"copies the CA and the install script (checksum verified) and runs it with a fresh single-use token\n" +
			"passed on stdin, as root or with `sudo -n`. Prints a result table; exits 1 if any host failed.",
		RunE: func(cmd *cobra.Command, args []string) error {
			targets, err := hostTargets(args, file)
			if err != nil {
				return err
			}
			if len(targets) == 0 {
				return &exitError{code: 2, err: fmt.Errorf("host add: %w", errNoHosts)}
			}
			if parallel < 1 {
				return &exitError{code: 2, err: errors.New("host add: --parallel must be at least 1")}
			}
			req, err := tf.request()
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("host add: %w", err)}
			}
			c, err := e.apiClient(*apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("host add: %w", err)}
			}
			mk, closeAgent, err := sshClientConfig(identity, knownHosts, 30*time.Second)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("host add: %w", err)}
			}
			defer closeAgent()
			in, err := fetchInstaller(cmd.Context(), c)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("host add: %w", err)}
			}
			results := make([]hostResult, len(targets))
			sem := make(chan struct{}, parallel)
			var wg sync.WaitGroup
			for i, t := range targets {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sem <- struct{}{}
					defer func() { <-sem }()
					results[i] = addHost(cmd.Context(), c, req, in, mk(t.User), t, timeout)
				}()
			}
			wg.Wait()
			failed := printHostResults(e.stdout, results)
			if failed > 0 {
				return &exitError{code: 1, err: fmt.Errorf("host add: %d of %d hosts failed", failed, len(results))}
			}
			return nil
		},
	}
	tf.register(add)
	add.Flags().StringVar(&file, "file", "", "read USER@HOST[:PORT] targets from this file, one per line")
	add.Flags().IntVar(&parallel, "parallel", 4, "hosts installed at once")
	add.Flags().StringVar(&identity, "identity", "", "SSH private key file (unencrypted; else ssh-agent)")
	add.Flags().StringVar(&knownHosts, "known-hosts", filepath.Join(home, ".ssh", "known_hosts"), "known_hosts file the host keys must match")
	add.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "per-host limit for connecting and installing")
	return add
}

// hostTargets are the hosts named on the command line and in file
// ("" for none), in that order.
func hostTargets(args []string, file string) ([]sshTarget, error) {
	var targets []sshTarget
	for _, a := range args {
		t, err := parseTarget(a)
		if err != nil {
			return nil, &exitError{code: 2, err: fmt.Errorf("host add: %w", err)}
		}
		targets = append(targets, t)
	}
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return nil, &exitError{code: 2, err: fmt.Errorf("host add: %w", err)}
		}
		more, err := readTargets(f)
		f.Close()
		if err != nil {
			return nil, &exitError{code: 2, err: fmt.Errorf("host add: %s: %w", file, err)}
		}
		targets = append(targets, more...)
	}
	return targets, nil
}

// printHostResults prints the result table of host add and returns how
// many hosts failed.
func printHostResults(w io.Writer, results []hostResult) int {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tRESULT\tDETAIL")
	failed := 0
	for _, r := range results {
		word := "ok"
		if !r.OK {
			word = "FAILED"
			failed++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Target, word, r.Detail)
	}
	tw.Flush()
	return failed
}

// hostListCmd is `machinactl host list`.
func hostListCmd(e *env, apiURL *string) *cobra.Command {
	list := &cobra.Command{
		Use:   "list",
		Short: "List joined hosts: site, rack, join status and online/offline from heartbeats",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := e.apiClient(*apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("host list: %w", err)}
			}
			hs, err := c.Hosts(cmd.Context())
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("host list: %w", err)}
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "HOST\tSITE\tRACK\tJOIN\tSTATE\tLAST SEEN\tTAGS")
			for _, h := range hs.Items {
				online, seen := "offline", "-"
				switch {
				case h.Fenced != nil && h.Fenced.NotHeld != nil:
					online = "fenced, still heartbeating: fence did not hold"
				case h.Fenced != nil:
					online = "fenced"
				case h.Lost != nil:
					online = h.Lost.Summary
				case h.Online:
					online = "online"
				}
				if !h.LastSeen.IsZero() {
					seen = h.LastSeen.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Name, hostCell(h.Site), hostCell(h.Rack), hostCell(h.JoinStatus), online, seen, hostCell(strings.Join(h.Tags, ",")))
			}
			return tw.Flush()
		},
	}
	return list
}

// hostFenceCmd is `machinactl host fence`.
func hostFenceCmd(e *env, apiURL *string) *cobra.Command {
	var reason string
	fenceCmd := &cobra.Command{
		Use:   "fence NAME --reason TEXT",
		Short: "Power a host's server off through its BMC or fencing device, succeeding only when it reads back off",
		Long: `fence powers the server under host NAME off (a hard off: Redfish ForceOff,
IPMI chassis power off) through the fencing device servers.yaml names for it
(fence: {driver, address, credentials}) or else its BMC, and answers only once
the power reads back off. The host is marked fenced: the reconciler never powers
the server on again until machinactl host unfence NAME. Audited as an event with
the admin token's name and the reason. Exit 0 when fenced, 1 when the power did
not read back off (nothing is marked), 2 for usage or API errors.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return &exitError{code: 2, err: errors.New("host fence: --reason is required (it is recorded with your token's name)")}
			}
			c, err := e.apiClient(*apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("host fence: %w", err)}
			}
			res, err := c.FenceHost(cmd.Context(), args[0], reason)
			if err != nil {
				var se *v1.APIError
				if errors.As(err, &se) && se.StatusCode == http.StatusBadGateway {
					return &exitError{code: 1, err: fmt.Errorf("host fence %s: %w", args[0], err)}
				}
				return &exitError{code: 2, err: fmt.Errorf("host fence %s: %w", args[0], err)}
			}
			fmt.Fprintf(e.stdout, "host %s fenced: server %s powered off through %s, read back off at %s (by %s)\n",
				res.Host, res.Server, res.Device, res.At.UTC().Format(time.RFC3339), res.Actor)
			return nil
		},
	}
	fenceCmd.Flags().StringVar(&reason, "reason", "", "why (required; recorded in the audit event)")
	return fenceCmd
}

// hostUnfenceCmd is `machinactl host unfence`.
func hostUnfenceCmd(e *env, apiURL *string) *cobra.Command {
	var reason string
	unfenceCmd := &cobra.Command{
		Use:   "unfence NAME --reason TEXT",
		Short: "Clear a host's fence so the reconciler may power its server on again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return &exitError{code: 2, err: errors.New("host unfence: --reason is required")}
			}
			c, err := e.apiClient(*apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("host unfence: %w", err)}
			}
			h, err := c.UnfenceHost(cmd.Context(), args[0], reason)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("host unfence %s: %w", args[0], err)}
			}
			fmt.Fprintf(e.stdout, "host %s unfenced: the reconciler may power server %s on again\n", h.Name, h.Server)
			return nil
		},
	}
	unfenceCmd.Flags().StringVar(&reason, "reason", "", "why (required; recorded in the audit event)")
	return unfenceCmd
}

// hostCell is s, or "-" when empty.
func hostCell(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
