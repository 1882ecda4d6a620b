package ipxe

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/macaddr"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// seqTokens issues deterministic tokens so scripts can be golden-tested; the
// real single-use behaviour is tested with boot.MemTokens below.
type seqTokens struct {
	mu     sync.Mutex
	n      int
	issued []string
}

func (s *seqTokens) Issue(_ context.Context, mac net.HardwareAddr, purpose string, ttl time.Duration) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	s.issued = append(s.issued, fmt.Sprintf("%s/%s/%v", mac, purpose, ttl))
	return fmt.Sprintf("TOKEN-%d", s.n), nil
}

func (s *seqTokens) Consume(context.Context, net.HardwareAddr, string, string) error {
	return boot.ErrTokenInvalid
}

func mustMAC(t testing.TB, s string) net.HardwareAddr {
	t.Helper()
	m, err := macaddr.ParseUnicast(s)
	if err != nil {
		t.Fatal(err)
	}
	return m.HardwareAddr()
}

func newTestHandler(t *testing.T, cfg Config) (*Handler, *httptest.Server) {
	t.Helper()
	if cfg.ControllerURL == "" {
		cfg.ControllerURL = "http://10.99.0.1:8080"
	}
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return h, srv
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read golden (run with -update to create): %v", err)
	}
	if d := cmp.Diff(string(want), got); d != "" {
		t.Errorf("script %s differs from golden (-want +got):\n%s", name, d)
	}
}

func TestScriptsGolden(t *testing.T) {
	var look boot.MemLookup
	lifecycles := []boot.Lifecycle{boot.LifecycleCommissioning, boot.LifecycleDeploying, boot.LifecycleReady,
		boot.LifecycleAllocated, boot.LifecycleDeployed, boot.LifecycleNew, boot.LifecycleFailed, boot.LifecycleRetired}
	for i, l := range lifecycles {
		if err := look.Set(boot.Assignment{MAC: net.HardwareAddr{0x52, 0x54, 0, 0, 0, byte(i + 1)}, Name: fmt.Sprintf("r1-n%02d", i+1), Lifecycle: l}); err != nil {
			t.Fatal(err)
		}
	}
	toks := &seqTokens{}
	_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: toks, TokenTTL: 10 * time.Minute})
	for i, l := range lifecycles {
		for _, pf := range []Platform{PlatformBIOS, PlatformEFI} {
			t.Run(string(l)+"-"+string(pf), func(t *testing.T) {
				// iPXE's ${net0/mac:hexhyp} form, upper case: normalised by the handler.
				mac := fmt.Sprintf("52-54-00-00-00-%02X", i+1)
				code, body := get(t, srv.URL+"/boot/ipxe?mac="+mac+"&platform="+string(pf)+"&arch=x86_64")
				if code != 200 {
					t.Fatalf("GET = %d %q", code, body)
				}
				// token numbers depend on order; normalise them for the golden file
				body = normaliseTokens(body)
				golden(t, string(l)+"-"+string(pf), body)
			})
		}
	}
	if len(toks.issued) != 4 {
		t.Fatalf("issued %d tokens (%v), want 4 (commissioning and deploying, BIOS and EFI)", len(toks.issued), toks.issued)
	}
	if toks.issued[0] != "52:54:00:00:00:01/commission/10m0s" || toks.issued[2] != "52:54:00:00:00:02/deploy/10m0s" {
		t.Fatalf("issued = %v", toks.issued)
	}
}

func normaliseTokens(s string) string {
	i := strings.Index(s, "machina.token=TOKEN-")
	if i < 0 {
		return s
	}
	j := i + len("machina.token=TOKEN-")
	k := j
	for k < len(s) && s[k] >= '0' && s[k] <= '9' {
		k++
	}
	return s[:j] + "N" + s[k:]
}

func TestInventoryModeUsedWithoutPlatform(t *testing.T) {
	var look boot.MemLookup
	_ = look.Set(boot.Assignment{MAC: mustMAC(t, "52:54:00:00:01:01"), Lifecycle: boot.LifecycleReady, Mode: boot.ModeUEFI})
	_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: &seqTokens{}})
	_, body := get(t, srv.URL+"/boot/ipxe?mac=52:54:00:00:01:01")
	if !strings.HasSuffix(body, "\nexit 0\n") {
		t.Fatalf("uefi inventory mode script = %q, want exit", body)
	}
}

func TestChainAndUnknown(t *testing.T) {
	var look boot.MemLookup
	_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: &seqTokens{}})
	code, body := get(t, srv.URL+"/boot/ipxe")
	if code != 200 {
		t.Fatalf("GET without mac = %d", code)
	}
	golden(t, "chain", body)
	code, body = get(t, srv.URL+"/boot/ipxe?mac=52:54:00:aa:bb:cc&platform=efi")
	if code != 200 {
		t.Fatalf("GET unknown = %d", code)
	}
	golden(t, "unknown", body)
	if got := look.DiscoveredMACs(); len(got) != 0 {
		t.Fatalf("auto-enrol off but discovered %v", got)
	}
}

func TestAutoEnroll(t *testing.T) {
	var look boot.MemLookup
	var events []Event
	var mu sync.Mutex
	_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: &seqTokens{}, Enroller: &look, AutoEnroll: true,
		OnEvent: func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() }})
	code, body := get(t, srv.URL+"/boot/ipxe?mac=52-54-00-AA-BB-CC&platform=pcbios")
	if code != 200 || !strings.Contains(body, "machina.mode=commission") {
		t.Fatalf("auto-enrolled script = %d %q, want commissioning ramdisk", code, body)
	}
	d := look.DiscoveredMACs()
	if len(d) != 1 || d[0].MAC.String() != "52:54:00:aa:bb:cc" || d[0].Source != "ipxe" || !d[0].IP.IsLoopback() {
		t.Fatalf("discovered = %+v", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 1 || events[0].Kind != EventDiscovered {
		t.Fatalf("events = %+v", events)
	}
}

func TestBadInput(t *testing.T) {
	var look boot.MemLookup
	_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: &seqTokens{}})
	for _, q := range []string{
		"mac=00:00:00:00:00:00", "mac=ff:ff:ff:ff:ff:ff", "mac=01:00:5e:00:00:01", "mac=..%2F..%2Fetc",
		"mac=52:54:00:00:00:01%0Aboot", "mac=52:54:00:00:00:01&arch=$%7Bx%7D", "mac=" + strings.Repeat("a", 4096),
		"mac=52:54:00:00:00:01&arch=X86_64", "mac=52:54:00:00:00:01&arch=arm-64", "mac=52:54:00:00:00:01&arch=" + strings.Repeat("a", 17),
		"mac=52:54:00:00:00:01&arch=arm64%0A",
	} {
		code, _ := get(t, srv.URL+"/boot/ipxe?"+q)
		if code != http.StatusBadRequest {
			t.Errorf("GET ?%s = %d, want 400", q, code)
		}
	}
	resp, err := http.Post(srv.URL+"/boot/ipxe?mac=52:54:00:00:00:01", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST = %d, want 405", resp.StatusCode)
	}
}

// TestSafeArch: the arch parameter's rule, ^[a-z0-9_]{0,16}$ (the regexp
// it replaced), on its edges.
func TestSafeArch(t *testing.T) {
	for arch, want := range map[string]bool{
		"": true, "i386": true, "x86_64": true, "arm64": true, "arm32": true, strings.Repeat("a", 16): true,
		strings.Repeat("a", 17): false, "X86_64": false, "arm-64": false, "arm64\n": false, "a b": false, "${buildarch}": false, "\xff": false,
	} {
		if got := safeArch(arch); got != want {
			t.Errorf("safeArch(%q) = %v, want %v", arch, got, want)
		}
	}
}

// TestScriptHead: the script route's fast path (ServeHTTP)
// answers HEAD as the mux's GET route does, and leaves other paths and
// methods to the mux.
func TestScriptHead(t *testing.T) {
	var look boot.MemLookup
	_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: &seqTokens{}})
	resp, err := http.Head(srv.URL + "/boot/ipxe")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") == "" {
		t.Fatalf("HEAD /boot/ipxe = %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, path := range []string{"/boot/ipxe/", "/boot/ipxe/x", "/boot/ipx"} {
		if code, _ := get(t, srv.URL+path); code != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", path, code)
		}
	}
}

func TestNewRejectsUnsafeConfig(t *testing.T) {
	var look boot.MemLookup
	for _, c := range []Config{
		{Lookup: &look, Tokens: &seqTokens{}, ControllerURL: "http://x/${evil}"},
		{Lookup: &look, Tokens: &seqTokens{}, ControllerURL: "ftp://x"},
		{Lookup: &look, Tokens: &seqTokens{}, ControllerURL: "http://x", KernelArgs: "a\nshell"},
		{Lookup: &look, Tokens: &seqTokens{}, ControllerURL: "http://x", KernelURL: "http://x/a b"},
		{Lookup: &look, Tokens: &seqTokens{}, ControllerURL: "http://x", AutoEnroll: true},
		{Tokens: &seqTokens{}, ControllerURL: "http://x"},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) = nil error", c)
		}
	}
}

func TestRateLimits(t *testing.T) {
	var look boot.MemLookup
	for i := 1; i <= 3; i++ {
		_ = look.Set(boot.Assignment{MAC: net.HardwareAddr{0x52, 0x54, 0, 0, 2, byte(i)}, Lifecycle: boot.LifecycleReady})
	}
	var mu sync.Mutex
	var events []Event
	_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: &seqTokens{},
		PerMAC: Limit{Burst: 2, Every: time.Hour}, PerIP: Limit{Burst: 5, Every: time.Hour},
		OnEvent: func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() }})
	codes := []int{}
	for _, m := range []string{"01", "01", "01", "02", "02", "03"} {
		c, _ := get(t, srv.URL+"/boot/ipxe?mac=52:54:00:00:02:"+m)
		codes = append(codes, c)
	}
	// 1st, 2nd ok; 3rd per-MAC limited (still costs an IP token); 4th, 5th ok;
	// 6th: IP bucket of 5 is empty.
	want := []int{200, 200, 429, 200, 200, 429}
	if d := cmp.Diff(want, codes); d != "" {
		t.Fatalf("status codes (-want +got):\n%s", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2 || events[0].Reason != "per-mac" || events[1].Reason != "per-ip" {
		t.Fatalf("events = %+v", events)
	}
}

func TestRequireToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var look boot.MemLookup
		mac := mustMAC(t, "52:54:00:00:03:01")
		_ = look.Set(boot.Assignment{MAC: mac, Lifecycle: boot.LifecycleCommissioning})
		toks := boot.NewMemTokens()
		var events []Event
		h, err := New(Config{Lookup: &look, Tokens: toks, ControllerURL: "http://10.99.0.1:8080", TokenTTL: time.Minute,
			OnEvent: func(e Event) { events = append(events, e) }})
		if err != nil {
			t.Fatal(err)
		}
		var served []Grant
		report := h.RequireToken(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			g, _ := GrantFrom(r.Context())
			served = append(served, g)
			w.WriteHeader(http.StatusNoContent)
		}), PurposeCommission)
		do := func(hd http.Handler, method, target, tok string) *httptest.ResponseRecorder {
			req := httptest.NewRequest(method, target, nil)
			req.RemoteAddr = "10.99.0.50:40000"
			if tok != "" {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
			rec := httptest.NewRecorder()
			hd.ServeHTTP(rec, req)
			return rec
		}
		script := do(h, "GET", "/boot/ipxe?mac=52-54-00-00-03-01&platform=efi", "").Body.String()
		_, after, ok := strings.Cut(script, "machina.token=")
		if !ok {
			t.Fatalf("no token in script %q", script)
		}
		tok := strings.Fields(after)[0]

		if c := do(report, "POST", "/report?mac=52:54:00:00:03:02", tok).Code; c != 403 {
			t.Fatalf("other mac = %d, want 403", c)
		}
		if c := do(report, "POST", "/report?mac=52:54:00:00:03:01", tok).Code; c != 204 {
			t.Fatalf("first use = %d, want 204", c)
		}
		if c := do(report, "POST", "/report?mac=52:54:00:00:03:01", tok).Code; c != 403 {
			t.Fatalf("reuse = %d, want 403", c)
		}
		script = do(h, "GET", "/boot/ipxe?mac=52-54-00-00-03-01&platform=efi", "").Body.String()
		_, after, _ = strings.Cut(script, "machina.token=")
		tok2 := strings.Fields(after)[0]
		time.Sleep(2 * time.Minute) // synctest's fake clock
		if c := do(report, "POST", "/report?mac=52:54:00:00:03:01", tok2).Code; c != 403 {
			t.Fatalf("expired = %d, want 403", c)
		}
		if c := do(report, "POST", "/report?mac=52:54:00:00:03:01", "").Code; c != 403 {
			t.Fatalf("no token = %d, want 403", c)
		}
		if c := do(report, "POST", "/report?mac=bogus", tok2).Code; c != 400 {
			t.Fatalf("bad mac = %d, want 400", c)
		}
		if len(served) != 1 || served[0].MAC.String() != mac.String() || served[0].Purpose != PurposeCommission {
			t.Fatalf("served = %+v", served)
		}
		var reasons []string
		for _, e := range events {
			if e.Kind != EventTokenRejected || e.IP.String() != "10.99.0.50" {
				t.Fatalf("event %+v", e)
			}
			if strings.Contains(e.Reason, tok) || strings.Contains(e.Reason, tok2) {
				t.Fatal("event leaks the token")
			}
			reasons = append(reasons, e.Reason)
		}
		want := []string{"token invalid", "token already used", "token expired", "no bearer token"}
		if d := cmp.Diff(want, reasons); d != "" {
			t.Fatalf("event reasons (-want +got):\n%s", d)
		}
	})
}

// rangeGet asks url for bytes 2-4 of a file holding "0123456789".
func rangeGet(t *testing.T, url string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Range", "bytes=2-4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 206 || string(b) != "234" {
		t.Fatalf("range GET %s = %d %q, want 206 \"234\"", url, resp.StatusCode, b)
	}
}

func TestServeISO(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "machina-bios.iso"), []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "evil.iso")); err != nil {
		t.Fatal(err)
	}
	var look boot.MemLookup
	h, srv := newTestHandler(t, Config{Lookup: &look, Tokens: &seqTokens{}, ISODir: dir, BinDir: dir})
	defer h.Close()
	rangeGet(t, srv.URL+"/boot/iso/machina-bios.iso")
	if c, body := get(t, srv.URL+"/boot/bin/machina-bios.iso"); c != 200 || body != "0123456789" {
		t.Fatalf("GET /boot/bin/ = %d %q", c, body)
	}
	for _, p := range []string{"/boot/iso/evil.iso", "/boot/iso/..%2F..%2Fetc%2Fpasswd", "/boot/iso/missing.iso", "/boot/bin/evil.iso", "/boot/bin/.hidden"} {
		if c, _ := get(t, srv.URL+p); c != 404 {
			t.Errorf("GET %s = %d, want 404", p, c)
		}
	}
}

// TestServeRamdisk: /boot/ramdisk/ serves the ramdisk folder with Range,
// and refuses symlinks out of it (it followed them when it
// was http.FileServer(http.Dir)).
func TestServeRamdisk(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	for name, body := range map[string]string{filepath.Join(dir, "vmlinuz"): "0123456789", filepath.Join(outside, "secret"): "secret"} {
		if err := os.WriteFile(name, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"initrd.cpio.gz": filepath.Join(outside, "secret"), "out": outside} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	var look boot.MemLookup
	h, srv := newTestHandler(t, Config{Lookup: &look, Tokens: &seqTokens{}, RamdiskDir: dir})
	defer h.Close()
	rangeGet(t, srv.URL+"/boot/ramdisk/vmlinuz")
	for _, p := range []string{"/boot/ramdisk/initrd.cpio.gz", "/boot/ramdisk/out/secret", "/boot/ramdisk/", "/boot/ramdisk/..%2f" + filepath.Base(outside) + "%2fsecret"} {
		if c, body := get(t, srv.URL+p); c != 404 || strings.Contains(body, "secret") {
			t.Errorf("GET %s = %d %q, want 404", p, c, body)
		}
	}
}

// TestWipeScriptGolden: a released server (ready, Wipe) boots the ramdisk
// in wipe mode with a wipe-purpose token; without Wipe it boots its disk.
func TestWipeScriptGolden(t *testing.T) {
	var look boot.MemLookup
	if err := look.Set(boot.Assignment{MAC: mustMAC(t, "52:54:00:00:00:21"), Name: "r1-n21", Lifecycle: boot.LifecycleReady, Wipe: true}); err != nil {
		t.Fatal(err)
	}
	toks := &seqTokens{}
	_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: toks, TokenTTL: 10 * time.Minute})
	for _, pf := range []Platform{PlatformBIOS, PlatformEFI} {
		code, body := get(t, srv.URL+"/boot/ipxe?mac=52:54:00:00:00:21&platform="+string(pf))
		if code != 200 {
			t.Fatalf("GET = %d %q", code, body)
		}
		golden(t, "ready-wipe-"+string(pf), normaliseTokens(body))
	}
	if d := cmp.Diff([]string{"52:54:00:00:00:21/wipe/10m0s", "52:54:00:00:00:21/wipe/10m0s"}, toks.issued); d != "" {
		t.Errorf("issued tokens (-want +got):\n%s", d)
	}
}

// TestInstallerScriptsGolden: a deploying server whose profile deploys with
// the distribution installer boots the installer's kernel and initrd from
// its ISO, with the install token in every URL, `initrd=NAME` on UEFI, and
// the installer's arguments (Ubuntu: url= of the ISO, autoinstall,
// ds=nocloud-net;s= unquoted; RHEL: inst.stage2, inst.repo, inst.ks).
func TestInstallerScriptsGolden(t *testing.T) {
	var look boot.MemLookup
	for i, kind := range []string{InstallerAutoinstall, InstallerKickstart} {
		img := map[string]string{InstallerAutoinstall: "ubuntu-24.04-live", InstallerKickstart: "rhel-9.4-dvd"}[kind]
		if err := look.Set(boot.Assignment{MAC: net.HardwareAddr{0x52, 0x54, 0, 0, 0, byte(0x31 + i)}, Name: fmt.Sprintf("r1-n%02d", 31+i),
			Lifecycle: boot.LifecycleDeploying, Installer: kind, InstallerImage: img}); err != nil {
			t.Fatal(err)
		}
	}
	toks := &seqTokens{}
	_, srv := newTestHandler(t, Config{Lookup: &look, Tokens: toks, TokenTTL: 10 * time.Minute, InstallTokenTTL: 90 * time.Minute})
	n := 0
	for i, kind := range []string{InstallerAutoinstall, InstallerKickstart} {
		for _, pf := range []Platform{PlatformBIOS, PlatformEFI} {
			n++
			code, body := get(t, fmt.Sprintf("%s/boot/ipxe?mac=52:54:00:00:00:%02x&platform=%s", srv.URL, 0x31+i, pf))
			if code != 200 {
				t.Fatalf("GET = %d %q", code, body)
			}
			if want := fmt.Sprintf("/install/TOKEN-%d/", n); !strings.Contains(body, want) {
				t.Errorf("%s %s: no %s in\n%s", kind, pf, want, body)
			}
			golden(t, "installer-"+kind+"-"+string(pf), body)
		}
	}
	if len(toks.issued) != 4 || toks.issued[0] != "52:54:00:00:00:31/install/1h30m0s" {
		t.Errorf("issued = %v, want 4 install tokens", toks.issued)
	}
	// Unsafe image names never reach a script.
	if _, err := Render(ScriptParams{MAC: "52:54:00:00:00:01", Lifecycle: boot.LifecycleDeploying, Platform: PlatformEFI, Controller: "http://10.0.0.1",
		Token: "abc", Installer: InstallerAutoinstall, InstallerImage: "x y${evil}"}); err == nil {
		t.Error("Render accepted an unsafe installer image name")
	}
}

// TestSafeArgMatchesCharacterClass: the byte loop that replaced the regexp
// accepts exactly the strings `^[A-Za-z0-9 ._,:=/@+-]*$` accepts: every
// single byte, and strings mixing allowed and refused ones.
func TestSafeArgMatchesCharacterClass(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9 ._,:=/@+-]*$`)
	cases := []string{"", "console=ttyS0,115200 quiet", "a$b", "x\ny", "é", "tok-EN_1.2:3=4/5@6+7", "a\tb", "'q'", "\x00"}
	for b := range 256 {
		cases = append(cases, string([]byte{byte(b)}), "ok"+string([]byte{byte(b)})+"ok")
	}
	for _, s := range cases {
		if got, want := safeArg(s), re.MatchString(s); got != want {
			t.Errorf("safeArg(%q) = %v, the character class says %v", s, got, want)
		}
	}
}

// TestRenderConfigChecked: the handler's render (configuration checked by
// New) gives Render's bytes, and still refuses a request's unsafe name,
// arch or token.
func TestRenderConfigChecked(t *testing.T) {
	base := ScriptParams{MAC: "52:54:00:00:00:01", Name: "r1-n01", Lifecycle: boot.LifecycleCommissioning, Platform: PlatformEFI,
		Controller: "http://10.0.0.1:8080", KernelURL: "http://10.0.0.1:8080/boot/ramdisk/vmlinuz",
		InitrdURL: "http://10.0.0.1:8080/boot/ramdisk/initrd.cpio.gz", KernelArgs: "console=ttyS0", Arch: "x86_64", Token: "tok-1"}
	for _, l := range []boot.Lifecycle{boot.LifecycleCommissioning, boot.LifecycleDeploying, boot.LifecycleDeployed} {
		for _, pf := range []Platform{PlatformBIOS, PlatformEFI} {
			p := base
			p.Lifecycle, p.Platform = l, pf
			want, err := Render(p)
			if err != nil {
				t.Fatal(err)
			}
			got, err := render(p, true)
			if err != nil || string(got) != string(want) {
				t.Errorf("%s %s: render(configChecked) = %q, %v; Render = %q", l, pf, got, err, want)
			}
		}
	}
	for name, mod := range map[string]func(*ScriptParams){
		"name":     func(p *ScriptParams) { p.Name = "a$b" },
		"name sp":  func(p *ScriptParams) { p.Name = "a b" },
		"arch":     func(p *ScriptParams) { p.Arch = "x86 64" },
		"token":    func(p *ScriptParams) { p.Token = "t ok" },
		"no token": func(p *ScriptParams) { p.Token = "" },
		"platform": func(p *ScriptParams) { p.Platform = "bogus" },
	} {
		p := base
		mod(&p)
		if b, err := render(p, true); err == nil {
			t.Errorf("%s: render(configChecked) = %q, want an error", name, b)
		}
	}
}
