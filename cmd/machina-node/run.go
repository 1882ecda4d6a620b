package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join/node"
)

const (
	envToken = "MACHINA_JOIN_TOKEN"
	defDir   = "/var/lib/machina-node"
	unitName = "machina-node.service"
)

const usage = `usage: machina-node COMMAND [flags]
  join --url URL --fingerprint HEX [--dir DIR] [--token-file FILE]
       enrol this host (token from $MACHINA_JOIN_TOKEN or --token-file;
       host name from $MACHINA_NODE_HOSTNAME, default the kernel's),
       then apply the networks and storage pools named on the token
  run [--dir DIR]           heartbeat to the controller over mutual TLS
  install-unit [--dir DIR] [--unit-dir DIR] [--no-enable]
                            install (and enable, start) the systemd unit
  facts                     print the host facts a join reports
`

// run is machina-node's testable main: exit 0 on success, 1 when a join
// is refused or a step fails, 2 on usage errors.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	var err error
	switch args[0] {
	case "join":
		err = cmdJoin(ctx, args[1:], stdout, stderr)
	case "run":
		err = cmdRun(ctx, args[1:], stderr, log)
	case "install-unit":
		err = cmdInstallUnit(ctx, args[1:], stdout, stderr)
	case "facts":
		var f v1.HostFacts
		if f, err = node.Facts(""); err == nil {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			err = enc.Encode(f)
		}
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "machina-node: unknown command %q\n%s", args[0], usage)
		return 2
	}
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "machina-node:", err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

type usageError struct{ error }

func cmdJoin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("join", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", os.Getenv("MACHINA_JOIN_URL"), "join listener URL, https://HOST[:PORT]")
	fp := fs.String("fingerprint", os.Getenv("MACHINA_CA_FINGERPRINT"), "pinned CA public-key SHA-256 (hex)")
	dir := fs.String("dir", defDir, "state directory for the node key and certificate")
	tokenFile := fs.String("token-file", "", "read the enrolment token from this file instead of $"+envToken)
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *url == "" || *fp == "" {
		return usageError{errors.New("join: --url and --fingerprint are required")}
	}
	tok := os.Getenv(envToken)
	if *tokenFile != "" {
		data, err := os.ReadFile(*tokenFile)
		if err != nil {
			return usageError{fmt.Errorf("join: %w", err)}
		}
		tok = strings.TrimSpace(string(data))
	}
	if tok == "" {
		return usageError{errors.New("join: no enrolment token: set " + envToken + " or pass --token-file")}
	}
	facts, err := node.Facts("")
	if err != nil {
		return err
	}
	if hn := os.Getenv("MACHINA_NODE_HOSTNAME"); hn != "" {
		facts.Hostname = hn // validated by the controller like any hostname
	}
	resp, err := node.Join(ctx, node.JoinConfig{URL: *url, Fingerprint: *fp, Token: tok, Dir: *dir, Facts: facts})
	if err != nil {
		return err
	}
	for _, c := range resp.Checks {
		state := "ok"
		if !c.OK {
			state = "FAILED"
			if !c.Required {
				state = "failed (not required)"
			}
		}
		fmt.Fprintf(stdout, "check %-8s %s: %s\n", c.Name, state, c.Detail)
	}
	c, err := node.Load(*dir)
	if err != nil {
		return err
	}
	var reportErr error
	// A network change that cuts the host off its controller is rolled
	// back by itself: a heartbeat over mutual TLS is the management path.
	done := node.Apply(ctx, resp, nil, nil, node.Guard{Reach: reachBy(c.Beat), Every: time.Second}, func(s v1.JoinStep) {
		mark := "ok"
		if !s.OK {
			mark = "FAILED"
		}
		fmt.Fprintf(stdout, "%s %s: %s\n", s.Step, mark, s.Message)
		reportErr = errors.Join(reportErr, c.Step(ctx, s))
	})
	if err := c.Done(ctx, done); err != nil {
		return errors.Join(reportErr, err)
	}
	if !done.OK {
		return fmt.Errorf("join: %s", done.Reason)
	}
	fmt.Fprintf(stdout, "joined as %s\n", resp.Host)
	return reportErr
}

// reachBy is the join's management-path check (node.Guard.Reach): one
// heartbeat, bounded by 5 s. Any answer of the controller proves the path,
// a refusal too (429 when heartbeats come faster than its rate).
func reachBy(beat func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := beat(ctx)
		if errors.Is(err, node.ErrRefused) {
			return nil
		}
		return err
	}
}

func cmdRun(ctx context.Context, args []string, stderr io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", defDir, "state directory written by join")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	c, err := node.Load(*dir)
	if err != nil {
		return err
	}
	c.Version = version
	log.Info("heartbeating", "host", c.Host(), "interval", c.Heartbeat(), "version", version)
	return c.Run(ctx, func(err error) { log.Warn("heartbeat failed", "err", err) })
}

// unitFile is the systemd unit install-unit writes; @DIR@ is the state dir
// and @BIN@ the machina-node path.
const unitFile = `[Unit]
Description=Machina node agent (heartbeats to the Machina controller)
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
ExecStart=@BIN@ run --dir @DIR@
Restart=always
RestartSec=5s
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
ReadOnlyPaths=@DIR@
PrivateTmp=yes

[Install]
WantedBy=multi-user.target
`

func cmdInstallUnit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("install-unit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", defDir, "state directory written by join")
	unitDir := fs.String("unit-dir", "/etc/systemd/system", "where to write "+unitName)
	noEnable := fs.Bool("no-enable", false, "write the unit only; do not run systemctl")
	_ = fs.String("url", "", "ignored (the URL is in the state directory)")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install-unit: %w", err)
	}
	for _, p := range []string{bin, *dir} {
		if !filepath.IsAbs(p) || strings.ContainsAny(p, " \t\n\"'\\%$") {
			return usageError{fmt.Errorf("install-unit: path %q must be absolute without spaces, quotes or %%", p)}
		}
	}
	text := strings.NewReplacer("@BIN@", bin, "@DIR@", *dir).Replace(unitFile)
	if err := os.MkdirAll(*unitDir, 0o755); err != nil {
		return fmt.Errorf("install-unit: %w", err)
	}
	path := filepath.Join(*unitDir, unitName)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return fmt.Errorf("install-unit: %w", err)
	}
	fmt.Fprintln(stdout, "wrote", path)
	if *noEnable {
		return nil
	}
	for _, a := range [][]string{{"daemon-reload"}, {"enable", "--now", unitName}} {
		out, err := exec.CommandContext(ctx, "systemctl", a...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("install-unit: systemctl %s: %w: %s", strings.Join(a, " "), err, strings.TrimSpace(string(out)))
		}
	}
	fmt.Fprintln(stdout, "enabled and started", unitName)
	return nil
}
