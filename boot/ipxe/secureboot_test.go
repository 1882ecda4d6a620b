package ipxe

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/machina-metal/machina/boot"
)

// TestSecureBootGRUBScript: a Secure Boot server's GRUB (Debian's signed
// grubnetx64 reports ${grub_cpu} x86_64) gets the amd64 ramdisk with the
// very kernel arguments of the iPXE path (less iPXE's initrd=, which GRUB's
// initrd command makes needless); once deployed it chainloads the disk's
// \EFI\BOOT\BOOTX64.EFI and never gets an iPXE script; its /boot/ipxe
// request is refused without a token.
func TestSecureBootGRUBScript(t *testing.T) {
	var look boot.MemLookup
	commission := net.HardwareAddr{0x52, 0x54, 0, 0, 0x5b, 1}
	deployed := net.HardwareAddr{0x52, 0x54, 0, 0, 0x5b, 2}
	plain := net.HardwareAddr{0x52, 0x54, 0, 0, 0x5b, 3}
	_ = look.Set(boot.Assignment{MAC: commission, Name: "sb1", Lifecycle: boot.LifecycleCommissioning, Mode: boot.ModeUEFI, SecureBoot: true})
	_ = look.Set(boot.Assignment{MAC: deployed, Name: "sb2", Lifecycle: boot.LifecycleDeployed, Mode: boot.ModeUEFI, SecureBoot: true})
	_ = look.Set(boot.Assignment{MAC: plain, Name: "plain", Lifecycle: boot.LifecycleCommissioning, Mode: boot.ModeUEFI})
	toks := &seqTokens{}
	_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: toks})

	code, body := get(t, srv.URL+"/boot/grub?mac=52:54:00:00:5b:01&platform=efi&arch=x86_64")
	if code != 200 {
		t.Fatalf("GET /boot/grub = %d %q", code, body)
	}
	_, ipxeBody := get(t, srv.URL+"/boot/ipxe?mac=52:54:00:00:5b:03&platform=efi&arch=x86_64")
	ipxeKernel := lineWith(ipxeBody, "kernel ")
	grubKernel := lineWith(body, "linux ")
	// The same arguments, token aside: iPXE's "kernel URL initrd=NAME ARGS"
	// against GRUB's "linux (http,HOST:PORT)/PATH ARGS".
	wantArgs := strings.Replace(argsOf(ipxeKernel), "initrd=initrd.cpio.gz ", "", 1)
	wantArgs = strings.Replace(wantArgs, "machina.mac=52:54:00:00:5b:03", "machina.mac=52:54:00:00:5b:01", 1)
	if got := argsOf(grubKernel); normaliseTokens(got) != normaliseTokens(wantArgs) || !strings.HasPrefix(grubKernel, "linux (http,10.99.0.1:8080)/boot/ramdisk/vmlinuz ") {
		t.Errorf("GRUB kernel line\n %q\nwant the iPXE path's arguments\n %q", grubKernel, wantArgs)
	}
	if !strings.Contains(body, "initrd (http,10.99.0.1:8080)/boot/ramdisk/initrd.cpio.gz\nboot\n") || strings.Contains(body, "arm64") {
		t.Errorf("GRUB script:\n%s", body)
	}

	_, body = get(t, srv.URL+"/boot/grub?mac=52:54:00:00:5b:02&platform=efi&arch=x86_64")
	for _, want := range []string{"search --no-floppy --file --set=machina_esp /EFI/BOOT/BOOTX64.EFI", "chainloader ($machina_esp)/EFI/BOOT/BOOTX64.EFI\n\tboot\n", "\nexit\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("deployed GRUB script lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "ipxe") || strings.Contains(body, "linux ") {
		t.Errorf("deployed GRUB script boots something else:\n%s", body)
	}

	issued := len(toks.issued)
	code, body = get(t, srv.URL+"/boot/ipxe?mac=52:54:00:00:5b:01&platform=efi&arch=x86_64")
	if code != 200 || !strings.Contains(body, "Secure Boot") || strings.Contains(body, "kernel ") || strings.Contains(body, "machina.token") {
		t.Errorf("secure boot server's iPXE script = %d\n%s", code, body)
	}
	if len(toks.issued) != issued {
		t.Errorf("a token was issued for the refused iPXE request: %v", toks.issued)
	}
}

func lineWith(script, prefix string) string {
	for _, l := range strings.Split(script, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// argsOf drops a kernel line's command and kernel path.
func argsOf(line string) string {
	f := strings.SplitN(line, " ", 3)
	if len(f) < 3 {
		return ""
	}
	return f[2]
}

// TestTFTPScript: the Secure Boot chain's GRUB gets its script by TFTP:
// the commissioning ramdisk from the TFTP server's own paths (no http in
// that GRUB) with a token and the iPXE path's arguments; a deployed server
// the disk chainload; an unknown MAC `exit`; a bad MAC an error.
func TestTFTPScript(t *testing.T) {
	var look boot.MemLookup
	_ = look.Set(boot.Assignment{MAC: net.HardwareAddr{0x52, 0x54, 0, 0, 0x5b, 1}, Name: "sb1", Lifecycle: boot.LifecycleCommissioning, SecureBoot: true})
	_ = look.Set(boot.Assignment{MAC: net.HardwareAddr{0x52, 0x54, 0, 0, 0x5b, 2}, Name: "sb2", Lifecycle: boot.LifecycleDeployed, SecureBoot: true})
	toks := &seqTokens{}
	h, _ := newTestHandler(t, Config{Lookup: &look, Tokens: toks})
	ctx, peer := context.Background(), netip.MustParseAddr("10.99.0.100")
	b, err := h.TFTPScript(ctx, "52:54:00:00:5b:01", peer)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"arch=x86_64", "linux /machina/ramdisk/vmlinuz console=tty0 console=ttyS0 machina.url=http://10.99.0.1:8080 machina.mac=52:54:00:00:5b:01 machina.mode=commission machina.token=",
		"\ninitrd /machina/ramdisk/initrd.cpio.gz\nboot\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q:\n%s", want, s)
		}
	}
	if len(toks.issued) != 1 {
		t.Errorf("tokens issued: %v", toks.issued)
	}
	if b, err = h.TFTPScript(ctx, "52:54:00:00:5b:02", peer); err != nil || !strings.Contains(string(b), "chainloader ($machina_esp)/EFI/BOOT/BOOTX64.EFI") {
		t.Errorf("deployed: %q, %v", b, err)
	}
	if b, err = h.TFTPScript(ctx, "52:54:00:00:5b:09", peer); err != nil || !strings.Contains(string(b), "exit") || strings.Contains(string(b), "linux") {
		t.Errorf("unknown: %q, %v", b, err)
	}
	if _, err = h.TFTPScript(ctx, "52:54:00:00:5b:01/../x", peer); err == nil {
		t.Error("a bad MAC was taken")
	}
	if _, err := RenderGRUB(ScriptParams{MAC: "52:54:00:00:5b:01", Lifecycle: boot.LifecycleCommissioning, Arch: "x86_64", Controller: "http://10.0.0.1:8080",
		KernelPath: "/k$x", InitrdPath: "/i", Token: "tok12345"}); err == nil {
		t.Error("RenderGRUB took a kernel path with '$'")
	}
}
