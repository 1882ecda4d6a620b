package join

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

//go:embed install.sh
var installScript []byte

// InstallScript returns the install script the join listener serves at
// /join/install.sh and `machinactl bundle` ships (see install.sh for its
// arguments). It is the same bytes for every host, so its SHA-256 can be
// pinned.
func InstallScript() []byte { return append([]byte(nil), installScript...) }

// ScriptSHA256 returns the hex SHA-256 of InstallScript.
func ScriptSHA256() string {
	s := sha256.Sum256(installScript)
	return hex.EncodeToString(s[:])
}

// ErrFirstBoot is wrapped by FirstBootCommand's argument errors.
var ErrFirstBoot = errors.New("join: first-boot command")

var (
	hex64RE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	tokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)
	// URL characters allowed inside a single-quoted shell word: no quote,
	// backslash, whitespace or control character.
	urlRE = regexp.MustCompile(`^https://[A-Za-z0-9._:\[\]/-]+$`)
)

// CheckJoinURL accepts "https://HOST[:PORT][/PATH]" with no user info,
// query or fragment, and returns it without a trailing slash.
func CheckJoinURL(joinURL string) (string, error) {
	u, err := url.Parse(joinURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || !urlRE.MatchString(joinURL) {
		return "", fmt.Errorf("%w: join URL %q: want https://host[:port] without credentials or query", ErrFirstBoot, joinURL)
	}
	return strings.TrimSuffix(joinURL, "/"), nil
}

// FirstBootCommand renders the one-line POSIX sh command (under 4 KiB) the
// deployed host runs once at first boot (cloud-init runcmd) to join: it fetches the CA from
// joinURL/join/ca.pem, refuses to go on unless the SHA-256 of its
// SubjectPublicKeyInfo is caFingerprint, fetches joinURL/join/install.sh
// over TLS verified against that CA, refuses to run it unless its SHA-256
// is scriptSHA256, then runs it with the token in the environment
// (MACHINA_JOIN_TOKEN), never in argv. It needs curl, openssl and
// sha256sum, present in the Ubuntu, Debian and RHEL cloud images.
//
// caFingerprint and scriptSHA256 are 64 lower-case hex digits (CA.Fingerprint
// and ScriptSHA256); token is an enrolment token (URL-safe base64 with
// optional "mj_" prefix). Every argument is validated before it reaches the
// script; errors wrap ErrFirstBoot. The output carries the token: treat it
// as a secret (the NoCloud seed is readable by root only).
func FirstBootCommand(joinURL, caFingerprint, scriptSHA256, token string) (string, error) {
	u, err := CheckJoinURL(joinURL)
	if err != nil {
		return "", err
	}
	if !hex64RE.MatchString(caFingerprint) {
		return "", fmt.Errorf("%w: CA fingerprint %q: want 64 lower-case hex digits", ErrFirstBoot, caFingerprint)
	}
	if !hex64RE.MatchString(scriptSHA256) {
		return "", fmt.Errorf("%w: script SHA-256 %q: want 64 lower-case hex digits", ErrFirstBoot, scriptSHA256)
	}
	if !tokenRE.MatchString(token) {
		return "", fmt.Errorf("%w: token is not URL-safe base64 of 16-128 characters", ErrFirstBoot)
	}
	return render(u, caFingerprint, scriptSHA256, "MACHINA_JOIN_TOKEN='"+token+"'", "", ""), nil
}

func render(u, fp, sha, tokenSrc, tfDef, trapExtra string) string {
	return strings.NewReplacer("@URL@", u, "@FP@", fp, "@SHA@", sha, "@TOKENSRC@", tokenSrc, "@TFDEF@", tfDef, "@TRAPX@", trapExtra).Replace(firstBootTemplate)
}

var tokenFileRE = regexp.MustCompile(`^/[A-Za-z0-9._/-]+$`)

// FirstBootCommandFromFile is FirstBootCommand reading the token from
// tokenFile (an absolute path, e.g. a 0600 file written by cloud-init
// write_files) instead of carrying it, so the token never appears in a
// command line: runcmd runs [sh, -c, CMD], whose argv any local user can
// read while the join runs. The command removes tokenFile when it exits,
// whether the join succeeded or not (the token is single-use either way).
// This is the variant the controller's NoCloud seed and installer
// documents use. Errors wrap ErrFirstBoot.
func FirstBootCommandFromFile(joinURL, caFingerprint, scriptSHA256, tokenFile string) (string, error) {
	u, err := CheckJoinURL(joinURL)
	if err != nil {
		return "", err
	}
	if !hex64RE.MatchString(caFingerprint) || !hex64RE.MatchString(scriptSHA256) {
		return "", fmt.Errorf("%w: CA fingerprint and script SHA-256 must be 64 lower-case hex digits", ErrFirstBoot)
	}
	if !tokenFileRE.MatchString(tokenFile) || strings.Contains(tokenFile, "..") {
		return "", fmt.Errorf("%w: token file %q is not a clean absolute path", ErrFirstBoot, tokenFile)
	}
	return render(u, caFingerprint, scriptSHA256, `MACHINA_JOIN_TOKEN="$(cat "$tf")"`, `tf='`+tokenFile+`'; `, ` "$tf"`), nil
}

// RunCmd returns FirstBootCommand as cloud-init runcmd entries (NoCloud
// user-data "runcmd:"): one string entry, which cloud-init writes into its
// root-only runcmd script and runs with sh (so the token is not in argv,
// unlike an [sh, -c, CMD] list entry).
func RunCmd(joinURL, caFingerprint, scriptSHA256, token string) ([]string, error) {
	c, err := FirstBootCommand(joinURL, caFingerprint, scriptSHA256, token)
	if err != nil {
		return nil, err
	}
	return []string{c}, nil
}

// firstBootTemplate is one line: the NoCloud seed runs it as runcmd
// [sh, -c, CMD] and the autoinstall/kickstart installers embed it in a
// script, and both accept one line under 4 KiB.
const firstBootTemplate = `(set -eu; umask 077; u='@URL@'; @TFDEF@d="$(mktemp -d /tmp/machina-join.XXXXXX)"; trap 'rm -rf "$d"@TRAPX@' EXIT; ` +
	`curl -fsS -k --max-time 30 -o "$d/ca.pem" "$u/join/ca.pem" || { echo "machina-join: fetch CA from $u failed" >&2; exit 1; }; ` +
	`fp="$(openssl x509 -in "$d/ca.pem" -noout -pubkey | openssl pkey -pubin -outform DER | sha256sum | cut -d' ' -f1)"; ` +
	`if [ "$fp" != '@FP@' ]; then echo "machina-join: CA fingerprint mismatch: got $fp, want @FP@; refusing to talk to $u" >&2; exit 1; fi; ` +
	`curl -fsS --cacert "$d/ca.pem" --max-time 60 -o "$d/install.sh" "$u/join/install.sh" || { echo "machina-join: fetch install script from $u failed" >&2; exit 1; }; ` +
	`sum="$(sha256sum "$d/install.sh" | cut -d' ' -f1)"; ` +
	`if [ "$sum" != '@SHA@' ]; then echo "machina-join: install script checksum mismatch: got $sum, want @SHA@; refusing to run it" >&2; exit 1; fi; ` +
	`@TOKENSRC@ sh "$d/install.sh" --join "$u" --ca "$d/ca.pem" --fingerprint '@FP@')`

var (
	parseURLRE   = regexp.MustCompile(`u='(https://[A-Za-z0-9._:\[\]/-]+)'`)
	parseFPRE    = regexp.MustCompile(`if \[ "\$fp" != '([0-9a-f]{64})' \]`)
	parseTokenRE = regexp.MustCompile(`MACHINA_JOIN_TOKEN='([A-Za-z0-9_-]{16,128})'`)
	// parseTokenFileRE matches FirstBootCommandFromFile's tf='PATH'.
	parseTokenFileRE = regexp.MustCompile(`tf='(/[A-Za-z0-9._/-]+)'; `)
)

// ParseFirstBootCommand reads the join URL, pinned CA fingerprint and token
// back out of a command made by FirstBootCommand, for the simulated lab's
// first boot, which joins in-process instead of running the command with
// sh, curl and openssl. For a command made by FirstBootCommandFromFile it
// returns the token file's path as tokenFile and token "". Errors wrap
// ErrFirstBoot.
func ParseFirstBootCommand(cmd string) (joinURL, caFingerprint, token, tokenFile string, err error) {
	u, fp, tok, tf := parseURLRE.FindStringSubmatch(cmd), parseFPRE.FindStringSubmatch(cmd), parseTokenRE.FindStringSubmatch(cmd), parseTokenFileRE.FindStringSubmatch(cmd)
	if u == nil || fp == nil || (tok == nil) == (tf == nil) {
		return "", "", "", "", fmt.Errorf("%w: not a first-boot join command", ErrFirstBoot)
	}
	if tf != nil {
		return u[1], fp[1], "", tf[1], nil
	}
	return u[1], fp[1], tok[1], "", nil
}
