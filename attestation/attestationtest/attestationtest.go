// Package attestationtest runs a software TPM 2.0 for tests of attestation: a
// swtpm process (Debian packages swtpm and swtpm-tools) with an EK and,
// optionally, an EK certificate from a throw-away CA made by swtpm_localca,
// reached over a Unix socket in the test's temporary directory with
// go-tpm's linuxudstpm transport (one connection per command, as swtpm
// serves them).
//
// A TPM under swtpm has no firmware and so no event log. This package is a
// TEST FIXTURE GENERATOR: [Log] writes a TCG crypto-agile event log (TCG PC
// Client Platform Firmware Profile §10.2.1-10.2.2: a SHA-1 format
// Spec ID event, then TCG_PCR_EVENT2 records with a SHA-256 digest) for
// events the test chooses, and [SWTPM.Measure] extends the same digests
// into the TPM's PCRs (TPM2_PCR_Extend), so the quote and the log agree as
// they do on a machine whose firmware measured its boot. A recorded
// firmware log can be replayed into the PCRs too ([SWTPM.Replay]). It is
// test code: no product package imports it (internal/archtest).
package attestationtest

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-attestation/attest"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpm2/transport/linuxudstpm"
	"github.com/google/go-tpm/tpmutil"

	"github.com/machina-metal/machina/internal/peertest"
)

// SWTPM is one running swtpm.
type SWTPM struct {
	// Dir holds the TPM state, the socket and the CA.
	Dir string
	// Sock is the Unix socket swtpm serves TPM commands on.
	Sock string
	// CA is the EK certificate chain's root and intermediate (nil without
	// an EK certificate).
	CARoot, CAIssuer *x509.Certificate
	// EventLog is what the command channels' MeasurementLog returns.
	EventLog []byte
}

// Start manufactures a TPM 2.0 (swtpm_setup: EK, and with ekCert an EK
// certificate signed by a CA in the test's temporary directory), starts
// swtpm on it and stops it (by PID) at the test's end. A missing swtpm
// fails the test naming its Debian package.
func Start(t testing.TB, ekCert bool) *SWTPM {
	t.Helper()
	peertest.Commands(t, "swtpm", "swtpm_setup", "swtpm_localca")
	dir := t.TempDir()
	s := &SWTPM{Dir: dir, Sock: filepath.Join(dir, "tpm.sock")}
	state, ca := filepath.Join(dir, "state"), filepath.Join(dir, "ca")
	for _, d := range []string{state, ca} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	setupConf, caConf := filepath.Join(dir, "swtpm_setup.conf"), filepath.Join(dir, "swtpm-localca.conf")
	write(t, caConf, fmt.Sprintf("statedir = %s\nsigningkey = %s/signkey.pem\nissuercert = %s/issuercert.pem\ncertserial = %s/certserial\n", ca, ca, ca, ca))
	opts := filepath.Join(dir, "swtpm-localca.options")
	write(t, opts, "--platform-manufacturer Machina\n--platform-version 1.0\n--platform-model test\n")
	write(t, setupConf, fmt.Sprintf("create_certs_tool = /usr/bin/swtpm_localca\ncreate_certs_tool_config = %s\ncreate_certs_tool_options = %s\nactive_pcr_banks = sha256\n", caConf, opts))
	args := []string{"--tpm2", "--tpmstate", state, "--config", setupConf, "--createek"}
	if ekCert {
		args = append(args, "--create-ek-cert")
	}
	if out, err := exec.Command("swtpm_setup", args...).CombinedOutput(); err != nil {
		t.Fatalf("swtpm_setup: %v\n%s", err, out)
	}
	if ekCert {
		s.CARoot = readCert(t, filepath.Join(ca, "swtpm-localca-rootca-cert.pem"))
		s.CAIssuer = readCert(t, filepath.Join(ca, "issuercert.pem"))
	}
	cmd := exec.Command("swtpm", "socket", "--tpm2", "--tpmstate", "dir="+state,
		"--server", "type=unixio,path="+s.Sock, "--flags", "not-need-init,startup-clear")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start swtpm: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		// The socket file appears at bind(2), before listen(2): wait
		// for a connection to be taken.
		if c, err := net.Dial("unix", s.Sock); err == nil {
			_ = c.Close()
			break
		}
		select {
		case <-done:
			t.Fatalf("swtpm exited: %s", stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("swtpm: no socket after 30s: %s", stderr.String())
		}
	}
	return s
}

func write(t testing.TB, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func readCert(t testing.TB, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

// Channel is a go-attestation command channel to the swtpm; its
// MeasurementLog is the SWTPM's EventLog (the firmware's log on a real
// machine).
type Channel struct {
	tpm  transport.TPMCloser
	resp []byte
	log  func() []byte
}

// Write sends one TPM command and keeps its response for Read.
func (c *Channel) Write(p []byte) (int, error) {
	r, err := c.tpm.Send(p)
	if err != nil {
		return 0, err
	}
	c.resp = r
	return len(p), nil
}

// Read returns the last command's response. (transport.ToReadWriter's
// reader answers io.EOF with the last bytes, which tpmutil.RunCommandRaw
// takes for an error.)
func (c *Channel) Read(p []byte) (int, error) {
	if len(c.resp) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.resp)
	c.resp = c.resp[n:]
	return n, nil
}

// Close closes the transport.
func (c *Channel) Close() error { return c.tpm.Close() }

// MeasurementLog returns the event log the test wrote.
func (c *Channel) MeasurementLog() ([]byte, error) { return c.log(), nil }

// Channel opens a command channel to the swtpm.
func (s *SWTPM) Channel(t testing.TB) *Channel {
	t.Helper()
	tpm, err := linuxudstpm.Open(s.Sock)
	if err != nil {
		t.Fatalf("open swtpm socket: %v", err)
	}
	return &Channel{tpm: tpm, log: func() []byte { return s.EventLog }}
}

// Measure extends each event's SHA-256 digest into its PCR and appends the
// event to the SWTPM's EventLog (starting one when empty), as firmware
// does.
func (s *SWTPM) Measure(t testing.TB, events ...Event) {
	t.Helper()
	var l Log
	if len(s.EventLog) == 0 {
		s.EventLog = l.Header()
	}
	c := s.Channel(t)
	defer c.Close()
	for _, e := range events {
		if err := tpm2.PCRExtend(c, tpmutil.Handle(e.PCR), tpm2.AlgSHA256, e.Digest(), ""); err != nil {
			t.Fatalf("extend PCR %d: %v", e.PCR, err)
		}
		s.EventLog = append(s.EventLog, l.Event(e)...)
	}
}

// Replay extends the SHA-256 digests of a recorded firmware event log into
// the PCRs (as the firmware that wrote it did) and makes it the EventLog.
func (s *SWTPM) Replay(t testing.TB, log []byte) {
	t.Helper()
	el, err := attest.ParseEventLog(log)
	if err != nil {
		t.Fatalf("parse recorded log: %v", err)
	}
	c := s.Channel(t)
	defer c.Close()
	n := 0
	for _, e := range el.Events(attest.HashSHA256) {
		if e.Type == 0x3 { // EV_NO_ACTION is not extended (PFP §10.4.1)
			continue
		}
		if err := tpm2.PCRExtend(c, tpmutil.Handle(e.Index), tpm2.AlgSHA256, e.Digest, ""); err != nil {
			t.Fatalf("extend PCR %d: %v", e.Index, err)
		}
		n++
	}
	if n == 0 {
		t.Fatal("recorded log has no SHA-256 events")
	}
	s.EventLog = log
}

// Event is one measurement for Measure: the PCR, the event type (TCG PC
// Client PFP §10.4.1) and its data; the digest is the SHA-256 of Data
// unless Hash is set (an EFI application's Authenticode hash, which is
// not a hash of the event data).
type Event struct {
	PCR  int
	Type uint32
	Data []byte
	Hash []byte
}

// Digest is the SHA-256 the event extends.
func (e Event) Digest() []byte {
	if e.Hash != nil {
		return e.Hash
	}
	h := sha256.Sum256(e.Data)
	return h[:]
}

// Event types of the TCG PC Client PFP (§10.4.1) the tests use.
const (
	EvSeparator                  uint32 = 0x00000004
	EvEventTag                   uint32 = 0x00000006
	EvSCRTMVersion               uint32 = 0x00000008
	EvEFIBootServicesApplication uint32 = 0x80000003
	algSHA256                    uint16 = 0x000b
	specIDSignature                     = "Spec ID Event03\x00"
)

// Log writes TCG crypto-agile event log records (little-endian, PFP
// §10.2). The zero value is ready.
type Log struct{}

// Header is the log's first record: a TCG_PCClientPCREvent (SHA-1 format)
// of type EV_NO_ACTION carrying the TCG_EfiSpecIDEvent that announces one
// algorithm, SHA-256 (PFP §10.4.5.1).
func (Log) Header() []byte {
	var spec bytes.Buffer
	spec.WriteString(specIDSignature)
	le(&spec, uint32(0))  // platformClass
	spec.WriteByte(0)     // specVersionMinor
	spec.WriteByte(2)     // specVersionMajor
	spec.WriteByte(0)     // specErrata
	spec.WriteByte(2)     // uintnSize (UINT64)
	le(&spec, uint32(1))  // numberOfAlgorithms
	le(&spec, algSHA256)  // algorithmId
	le(&spec, uint16(32)) // digestSize
	spec.WriteByte(0)     // vendorInfoSize
	var b bytes.Buffer
	le(&b, uint32(0))          // PCRIndex
	le(&b, uint32(0x3))        // EV_NO_ACTION
	b.Write(make([]byte, 20))  // SHA-1 digest, zero
	le(&b, uint32(spec.Len())) // eventSize
	b.Write(spec.Bytes())
	return b.Bytes()
}

// Event is one TCG_PCR_EVENT2 record with the event's SHA-256 digest.
func (Log) Event(e Event) []byte {
	var b bytes.Buffer
	le(&b, uint32(e.PCR))
	le(&b, e.Type)
	le(&b, uint32(1)) // digests.count
	le(&b, algSHA256)
	b.Write(e.Digest())
	le(&b, uint32(len(e.Data)))
	b.Write(e.Data)
	return b.Bytes()
}

func le(b *bytes.Buffer, v any) { _ = binary.Write(b, binary.LittleEndian, v) }

// Boot is a typical boot's measurements for Measure: the firmware version
// in PCR 0, the separators of PCRs 0-7, the boot loader and the kernel as
// EFI applications in PCR 4 (their "Authenticode hashes" are the SHA-256
// of the given names), and the initrd in PCR 9.
func Boot(loader, kernel, initrd string) []Event {
	ev := []Event{{PCR: 0, Type: EvSCRTMVersion, Data: []byte("machina test firmware 1.0\x00")}}
	for i := range 8 {
		ev = append(ev, Event{PCR: i, Type: EvSeparator, Data: []byte{0, 0, 0, 0}})
	}
	ev = append(ev, App(loader), App(kernel), Initrd(initrd))
	return ev
}

// App is an EV_EFI_BOOT_SERVICES_APPLICATION in PCR 4 whose digest is the
// SHA-256 of name (the data is a stand-in UEFI_IMAGE_LOAD_EVENT).
func App(name string) Event {
	h := sha256.Sum256([]byte(name))
	return Event{PCR: 4, Type: EvEFIBootServicesApplication, Data: []byte("image:" + name), Hash: h[:]}
}

// Initrd is the Linux EFI stub's initrd measurement in PCR 9
// (EV_EVENT_TAG "Linux initrd"), with the SHA-256 of content.
func Initrd(content string) Event {
	h := sha256.Sum256([]byte(content))
	return Event{PCR: 9, Type: EvEventTag, Data: []byte("Linux initrd\x00"), Hash: h[:]}
}

// Sum is the SHA-256 of s.
func Sum(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}
