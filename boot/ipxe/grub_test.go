package ipxe

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/boot"
)

// TestGRUBScriptsGolden renders every lifecycle through GET /boot/grub as
// the embedded GRUB configuration asks for it (${net_default_mac} in colon
// form, ${grub_platform}, ${grub_cpu}), and pins the bytes.
func TestGRUBScriptsGolden(t *testing.T) {
	var look boot.MemLookup
	lifecycles := []boot.Lifecycle{boot.LifecycleCommissioning, boot.LifecycleDeploying, boot.LifecycleReady, boot.LifecycleDeployed}
	for i, l := range lifecycles {
		if err := look.Set(boot.Assignment{MAC: net.HardwareAddr{0x52, 0x54, 0, 0, 0xa, byte(i + 1)}, Name: fmt.Sprintf("a1-n%02d", i+1), Lifecycle: l, Mode: boot.ModeUEFI}); err != nil {
			t.Fatal(err)
		}
	}
	_ = look.Set(boot.Assignment{MAC: net.HardwareAddr{0x52, 0x54, 0, 0, 0xa, 9}, Name: "a1-n09", Lifecycle: boot.LifecycleReady, Wipe: true})
	toks := &seqTokens{}
	_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: toks, TokenTTL: 10 * time.Minute})
	for i, l := range lifecycles {
		t.Run(string(l), func(t *testing.T) {
			code, body := get(t, srv.URL+fmt.Sprintf("/boot/grub?mac=52:54:00:00:0a:%02x&platform=efi&arch=arm64", i+1))
			if code != 200 {
				t.Fatalf("GET = %d %q", code, body)
			}
			golden(t, "grub-"+string(l), normaliseTokens(body))
		})
	}
	_, body := get(t, srv.URL+"/boot/grub?mac=52:54:00:00:0a:09&platform=efi&arch=arm64")
	golden(t, "grub-ready-wipe", normaliseTokens(body))
	if len(toks.issued) != 3 || !strings.HasSuffix(toks.issued[0], "/commission/10m0s") || !strings.HasSuffix(toks.issued[2], "/wipe/10m0s") {
		t.Fatalf("issued = %v, want commission, deploy and wipe tokens", toks.issued)
	}
	_, body = get(t, srv.URL+"/boot/grub")
	golden(t, "grub-chain", body)
	_, body = get(t, srv.URL+"/boot/grub?mac=52:54:00:aa:bb:cc&arch=arm64")
	golden(t, "grub-unknown", body)
}

// TestARM64IPXEUsesARM64Ramdisk: an iPXE reporting ${buildarch} arm64 gets
// the arm64 kernel, initrd and console, on the UEFI kernel line, whatever
// platform the inventory or the query says; x86_64 keeps the default ramdisk.
func TestARM64IPXEUsesARM64Ramdisk(t *testing.T) {
	var look boot.MemLookup
	_ = look.Set(boot.Assignment{MAC: mustMAC(t, "52:54:00:00:0b:01"), Lifecycle: boot.LifecycleCommissioning, Mode: boot.ModeBIOS})
	_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: &seqTokens{}})
	_, body := get(t, srv.URL+"/boot/ipxe?mac=52:54:00:00:0b:01&platform=pcbios&arch=arm64")
	for _, want := range []string{
		"kernel http://10.99.0.1:8080/boot/ramdisk/arm64/vmlinuz initrd=initrd.cpio.gz console=tty0 console=ttyAMA0 machina.url=",
		"initrd http://10.99.0.1:8080/boot/ramdisk/arm64/initrd.cpio.gz\n",
		"platform=efi",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("arm64 script lacks %q:\n%s", want, body)
		}
	}
	_, body = get(t, srv.URL+"/boot/ipxe?mac=52:54:00:00:0b:01&platform=pcbios&arch=x86_64")
	if !strings.Contains(body, "kernel http://10.99.0.1:8080/boot/ramdisk/vmlinuz console=tty0 console=ttyS0 ") {
		t.Errorf("x86_64 script:\n%s", body)
	}
}

func TestRenderGRUBRefuses(t *testing.T) {
	ok := ScriptParams{MAC: "52:54:00:00:0a:01", Lifecycle: boot.LifecycleCommissioning, Platform: PlatformEFI, Arch: "arm64",
		Controller: "http://10.0.0.1:8080", KernelURL: "http://10.0.0.1:8080/k", InitrdURL: "http://10.0.0.1:8080/i", Token: "tok12345"}
	if _, err := RenderGRUB(ok); err != nil {
		t.Fatalf("RenderGRUB(ok) = %v", err)
	}
	for name, mut := range map[string]func(*ScriptParams){
		"https kernel": func(p *ScriptParams) { p.KernelURL = "https://10.0.0.1/k" },
		"bad initrd":   func(p *ScriptParams) { p.InitrdURL = "http://10.0.0.1/i$x" },
		"token quote":  func(p *ScriptParams) { p.Token = `a"b` },
		"no token":     func(p *ScriptParams) { p.Token = "" },
		"name semi":    func(p *ScriptParams) { p.Name = "a;reboot" },
		"args brace":   func(p *ScriptParams) { p.KernelArgs = "x={y}" },
		"installer":    func(p *ScriptParams) { p.Lifecycle, p.Installer = boot.LifecycleDeploying, "autoinstall" },
		"bad mac":      func(p *ScriptParams) { p.MAC = "zz" },
	} {
		p := ok
		mut(&p)
		if b, err := RenderGRUB(p); err == nil {
			t.Errorf("%s: RenderGRUB = %q, want an error", name, b)
		}
	}
}
