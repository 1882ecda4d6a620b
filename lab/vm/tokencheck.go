package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The join-token check: the deployed host's enrolment token
// must never be on a command line (/proc/PID/cmdline, what `ps` shows to
// every local user) or in cloud-init's logs. The lab logs in to each
// deployed VM over SSH (the lab's own key is in the profile's sshKeys; the
// seed gives user machina passwordless sudo) as soon as sshd answers,
// which on these VMs is before or while cloud-init's final stage runs the
// join, and runs tokenCheckScript as root.

// tokenCheckScript reads the token the host was given (the write_files
// entry of its NoCloud user-data, which cloud-init keeps root-only in
// /var/lib/cloud/instance/user-data.txt) into a 0600 temp file, so that
// no process of the check itself carries it, then samples every
// process's argv every 0.2 s until the node is joined (or 10 minutes),
// and finally greps cloud-init's logs, the runcmd script cloud-init ran
// (whose lines are the argv of the join's processes) and the journal. It
// prints one "RESULT ..." line; "HIT ..." lines name a command line that
// carried the token.
const tokenCheckScript = `set -u
tf=$(mktemp); chmod 600 "$tf"
sed -n 's/^ *content: "\(.*\)"$/\1/p' /var/lib/cloud/instance/user-data.txt 2>/dev/null | head -n1 > "$tf"
[ -s "$tf" ] || { echo "RESULT notoken"; rm -f "$tf"; exit 0; }
tok=$(cat "$tf")
hits=0; seen=0; n=0; joined=0
[ -e /var/lib/machina-node/node.json ] && joined=1
while [ "$n" -lt 3000 ]; do
  for f in /proc/[0-9]*/cmdline; do
    c=$( { tr '\0' ' ' < "$f"; } 2>/dev/null) || continue
    case $c in *"$tok"*) hits=$((hits+1)); echo "HIT ${c%%"$tok"*}<token>";; esac
    case $c in *install.sh*|*"machina-node join"*) seen=1;; esac
  done
  n=$((n+1))
  [ -e /var/lib/machina-node/node.json ] && [ ! -e /var/lib/machina/join-token ] && break
  sleep 0.2
done
logs=$(grep -lFf "$tf" /var/log/cloud-init*.log 2>/dev/null | tr '\n' ,)
runcmd=clean; grep -qFf "$tf" /var/lib/cloud/instance/scripts/runcmd 2>/dev/null && runcmd=token
journal=clean; journalctl -b --no-pager -q 2>/dev/null | grep -qFf "$tf" && journal=token
tokfile=absent; [ -e /var/lib/machina/join-token ] && tokfile=present
node=absent; [ -e /var/lib/machina-node/node.json ] && node=present
rm -f "$tf"
echo "RESULT hits=$hits samples=$n seenJoin=$seen joinedBeforeCheck=$joined logs=[$logs] runcmd=$runcmd journal=$journal tokenFile=$tokfile node=$node"
`

// sshKey creates the lab's SSH key pair (ssh-keygen, ed25519, no
// passphrase) and returns the private key path and the public key line.
func (l *lab) sshKey(ctx context.Context) (string, string, error) {
	dir := filepath.Join(l.dir, "ssh")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	key := filepath.Join(dir, "id_ed25519")
	if out, err := exec.CommandContext(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vmlab@machina", "-f", key).CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("vm lab: ssh-keygen: %w: %s", err, out)
	}
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		return "", "", err
	}
	return key, strings.TrimSpace(string(pub)), nil
}

func (l *lab) ssh(ctx context.Context, ip string, stdin string, remote ...string) (string, error) {
	args := []string{"-i", l.sshKeyPath, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
		"-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=4", "-o", "LogLevel=ERROR", "machina@" + ip}
	cmd := l.ns.Command(ctx, "ssh", append(args, remote...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// findHost returns the address of the VM named name on the lab bridge: a
// neighbour of the bridge (ip neigh; the VM's MAC first) that answers SSH
// with that hostname.
func (l *lab) findHost(ctx context.Context, m *machine) (string, error) {
	out, err := exec.CommandContext(ctx, "ip", "-n", l.ns.Name, "neigh", "show", "dev", l.ns.Bridge).Output()
	if err != nil {
		return "", fmt.Errorf("ip neigh: %w", err)
	}
	var first, rest []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.Contains(f[0], ".") {
			continue
		}
		if strings.Contains(line, m.mac) {
			first = append(first, f[0])
		} else {
			rest = append(rest, f[0])
		}
	}
	for _, ip := range append(first, rest...) {
		c, cancel := context.WithTimeout(ctx, 40*time.Second)
		hn, err := l.ssh(c, ip, "", "hostname")
		cancel()
		if err == nil && strings.TrimSpace(hn) == m.name {
			return ip, nil
		}
	}
	return "", errors.New("no bridge neighbour answers SSH as " + m.name)
}

// checkToken waits until m answers SSH (up to d) and runs tokenCheckScript
// on it; it returns the RESULT line, or an error naming what carried the
// token.
func (l *lab) checkToken(ctx context.Context, m *machine, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	var (
		ip, out string
		err     error
	)
	// The session can die while the host joins: the join moves the NIC's
	// address onto bridge br-lab, which may get a MAC of its own (then the
	// host is found again by hostname). A second session still checks the
	// logs, the runcmd script, the journal and the token file (its live
	// sampling then ends at once: the node has joined).
	for {
		if ip, err = l.findHost(ctx, m); err == nil {
			c, cancel := context.WithTimeout(ctx, 12*time.Minute)
			out, err = l.ssh(c, ip, tokenCheckScript, "sudo", "sh", "-s")
			cancel()
			if err == nil {
				break
			}
			l.log.Warn("join token check session ended; trying again", "vm", m.name, "ip", ip, "err", err)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("vm lab: token check on %s (%s): %w: %s", m.name, ip, err, out)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(3 * time.Second):
		}
	}
	var result string
	var hits []string
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "RESULT "):
			result = line
		case strings.HasPrefix(line, "HIT "):
			hits = append(hits, line)
		}
	}
	switch {
	case result == "":
		return "", fmt.Errorf("vm lab: token check on %s printed no result: %s", m.name, out)
	case strings.Contains(result, "notoken"):
		return "", fmt.Errorf("vm lab: token check on %s: no join token in the host's user-data write_files", m.name)
	case len(hits) > 0 || !strings.Contains(result, " hits=0 "):
		return "", fmt.Errorf("vm lab: %s: the join token was on a command line: %s %s", m.name, strings.Join(hits, "; "), result)
	case !strings.Contains(result, "logs=[]"):
		return "", fmt.Errorf("vm lab: %s: the join token is in cloud-init's logs: %s", m.name, result)
	case !strings.Contains(result, "runcmd=clean") || !strings.Contains(result, "journal=clean"):
		return "", fmt.Errorf("vm lab: %s: the join token is in the runcmd script or the journal: %s", m.name, result)
	case !strings.Contains(result, "tokenFile=absent") || !strings.Contains(result, "node=present"):
		return "", fmt.Errorf("vm lab: %s: token file not removed or node not joined: %s", m.name, result)
	}
	return result, nil
}
