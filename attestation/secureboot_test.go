package attestation

import (
	"bytes"
	"debug/pe"
	"encoding/asn1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	gattest "github.com/google/go-attestation/attest"
	"github.com/machina-metal/machina/internal/peertest"
)

// The recorded log: OVMF 2022.11 with Secure Boot on and Microsoft keys
// (OVMF_CODE_4M.ms.fd), swtpm TPM 2.0, network boot of Debian 12's signed
// shim (shim-signed 1.51~1+deb12u1+16.1-2~deb12u1) and grubnetx64
// (grub-efi-amd64-signed 1+2.06+13+deb12u2) over TFTP, GRUB loading
// Debian's signed kernel linux-image-6.1.0-57-amd64 (6.1.192-3) as
// /vmlinuz and a 1 MB busybox initrd as /evrd that printed
// /sys/kernel/security/tpm0/binary_bios_measurements. Its PCR 4
// EV_EFI_BOOT_SERVICES_APPLICATION digests are shim (the firmware), GRUB
// (shim) and the kernel twice (shim, verifying for GRUB); PCR 9 EV_IPL
// holds the files GRUB read, after their commands in PCR 8.
const (
	recordedSecureBootLog = "testdata/debian12_secureboot_shim_grub_eventlog"
	recShim               = "80a66d53a945d2286fcadd780fae1c225aa732079cd67b5225dc78aaab4e2ff8"
	recGRUB               = "f85e271fd67bfb46fc14e90af0962f311de7e6a77ce46d210244835ccac469ed"
	recKernelPE           = "61e79ca0acd7e9f18984bea7b44650801ed54fd95a8786c16c583b86acf9d538"
	recKernelFile         = "85667e6c72245133bd7e3e80bac7d16b26fda15c0a3c68faa4b713850ea526cd"
	recInitrd             = "91ed0415949bded1cf090e8b0ab58ce1eb7ce93746d7c02605d30696a3901bab"
	recGRUBCfg            = "3e02deb7853ccb5460a60c7909f2f455ca90fdefb2d2958f1eaa78d823dbe9a3"
)

func hexes(t *testing.T, s ...string) [][]byte {
	t.Helper()
	var out [][]byte
	for _, h := range s {
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func recordedEvents(t *testing.T) []gattest.Event {
	t.Helper()
	b, err := os.ReadFile(recordedSecureBootLog)
	if err != nil {
		t.Fatal(err)
	}
	el, err := gattest.ParseEventLog(b)
	if err != nil {
		t.Fatal(err)
	}
	return el.Events(gattest.HashSHA256)
}

// TestMatchChainSecureBootLog matches the recorded shim → GRUB → kernel
// log against the chain the controller computes: shim, GRUB and the
// kernel by Authenticode in PCR 4, the kernel and initrd files by SHA-256
// in PCR 9 (GRUB's grub.cfg there is not matched). A kernel or initrd
// other than the served one is refused, and so is a chain without GRUB.
func TestMatchChainSecureBootLog(t *testing.T) {
	events := recordedEvents(t)
	good := BootChain{Applications: hexes(t, recShim, recGRUB, recKernelPE), Kernels: hexes(t, recKernelFile), Initrds: hexes(t, recInitrd)}
	var res Result
	if err := matchChain(events, good, &res); err != nil {
		t.Fatalf("matchChain(served chain) = %v", err)
	}
	if !slices.Equal(res.Applications, []string{recShim, recGRUB, recKernelPE, recKernelPE}) || !slices.Equal(res.Kernels, []string{recKernelFile}) {
		t.Fatalf("result applications %v kernels %v", res.Applications, res.Kernels)
	}
	for name, c := range map[string]struct {
		chain BootChain
		want  string
	}{
		"other kernel file":  {BootChain{Applications: good.Applications, Kernels: hexes(t, recGRUBCfg), Initrds: good.Initrds}, "kernel " + recKernelFile},
		"other initrd":       {BootChain{Applications: good.Applications, Kernels: good.Kernels, Initrds: hexes(t, recKernelFile)}, "initrd " + recInitrd},
		"grub not served":    {BootChain{Applications: hexes(t, recShim, recKernelPE), Kernels: good.Kernels, Initrds: good.Initrds}, "boot application " + recGRUB},
		"kernel PE not seen": {BootChain{Applications: hexes(t, recShim, recGRUB), Kernels: good.Kernels, Initrds: good.Initrds}, "boot application " + recKernelPE},
	} {
		t.Run(name, func(t *testing.T) {
			err := matchChain(events, c.chain, &Result{})
			if !errors.Is(err, ErrBootChain) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("matchChain = %v, want ErrBootChain naming %q", err, c.want)
			}
		})
	}
}

// TestGRUBFilesCommands: the PCR 8 commands decide which PCR 9 file is
// the kernel and which an initrd (linuxefi/initrdefi too, initrd options
// skipped); a file no command named is neither.
func TestGRUBFilesCommands(t *testing.T) {
	var g grubFiles
	for _, c := range []string{"grub_cmd: linuxefi (http,10.0.0.1:80)/k console=ttyS0\x00", "grub_cmd: initrd --newc:x (http,10.0.0.1:80)/i /j\x00", "kernel_cmdline: /k\x00", "grub_cmd: linux\x00"} {
		g.command([]byte(c))
	}
	for path, want := range map[string]string{"(http,10.0.0.1:80)/k": "kernel", "(http,10.0.0.1:80)/i": "initrd", "/j": "initrd", "/grub/grub.cfg": "", "--newc:x": ""} {
		if got := g.kind([]byte(path + "\x00")); got != want {
			t.Errorf("kind(%q) = %q, want %q", path, got, want)
		}
	}
}

// TestAuthenticodeRecordedDigests: the Authenticode SHA-256 computed for
// Debian's signed shim and GRUB network image is the digest their
// signature signs (SpcIndirectDataContent's messageDigest), and, for the
// package versions the recorded log was made with, the digest OVMF and
// shim measured into PCR 4.
func TestAuthenticodeRecordedDigests(t *testing.T) {
	peertest.File(t, "/usr/lib/shim/shimx64.efi.signed", "shim-signed")
	peertest.File(t, "/usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed", "grub-efi-amd64-signed")
	for _, f := range []struct{ path, recorded string }{
		{"/usr/lib/shim/shimx64.efi.signed", recShim},
		{"/usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed", recGRUB},
	} {
		img, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatalf("%v (Debian packages shim-signed, grub-efi-amd64-signed)", err)
		}
		got, err := Authenticode(img)
		if err != nil {
			t.Fatal(err)
		}
		signed := signedDigest(t, img)
		if !bytes.Equal(got, signed) {
			t.Errorf("%s: Authenticode %x, signature signs %x", f.path, got, signed)
		}
		if hex.EncodeToString(signed) != f.recorded {
			t.Logf("%s: not the recorded package version (signed digest %x, recorded %s)", f.path, signed, f.recorded)
		} else if hex.EncodeToString(got) != f.recorded {
			t.Errorf("%s: Authenticode %x, recorded PCR 4 digest %s", f.path, got, f.recorded)
		}
	}
	if _, err := Authenticode([]byte("MZ not a PE image")); err == nil {
		t.Error("Authenticode accepted a non-PE input")
	}
}

// signedDigest reads the messageDigest of an image's Authenticode
// signature: WIN_CERTIFICATE → PKCS#7 ContentInfo → SignedData →
// contentInfo (SpcIndirectDataContent) → DigestInfo.digest.
func signedDigest(t *testing.T, img []byte) []byte {
	t.Helper()
	f, err := pe.NewFile(bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	dd := f.OptionalHeader.(*pe.OptionalHeader64).DataDirectory[pe.IMAGE_DIRECTORY_ENTRY_SECURITY]
	win := img[dd.VirtualAddress : dd.VirtualAddress+dd.Size]
	n := binary.LittleEndian.Uint32(win)
	var ci struct {
		OID     asn1.ObjectIdentifier
		Content asn1.RawValue `asn1:"explicit,tag:0"`
	}
	if _, err := asn1.Unmarshal(win[8:n], &ci); err != nil {
		t.Fatalf("pkcs7: %v", err)
	}
	var sd struct {
		Version    int
		Algorithms asn1.RawValue
		Inner      struct {
			OID     asn1.ObjectIdentifier
			Content asn1.RawValue `asn1:"explicit,tag:0"`
		}
		Rest []asn1.RawValue `asn1:"optional"`
	}
	if _, err := asn1.UnmarshalWithParams(ci.Content.Bytes, &sd, ""); err != nil {
		t.Fatalf("signed data: %v", err)
	}
	var spc struct {
		Data   asn1.RawValue
		Digest struct {
			Alg    asn1.RawValue
			Digest []byte
		}
	}
	if _, err := asn1.Unmarshal(sd.Inner.Content.FullBytes, &spc); err != nil {
		// Content is the EXPLICIT [0]'s inner value.
		if _, err2 := asn1.Unmarshal(sd.Inner.Content.Bytes, &spc); err2 != nil {
			t.Fatalf("spc indirect data: %v / %v", err, err2)
		}
	}
	return spc.Digest.Digest
}
