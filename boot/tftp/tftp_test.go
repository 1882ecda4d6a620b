package tftp

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/internal/netnstest"
	ptftp "github.com/pin/tftp/v3"
)

const scriptURL = "http://127.0.0.1:8080/boot/ipxe"

type fixture struct {
	srv    *Server
	addr   string
	root   string
	big    []byte
	secret string
}

// newFixture serves a temp directory with a 300 KiB binary, a nested file, a
// symlink inside the root and symlinks pointing out of it.
func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	return newFixtureTB(t, cfg)
}

func newFixtureB(b *testing.B) *fixture { return newFixtureTB(b, Config{MaxPerClient: 1000}) }

func clientB(b *testing.B, addr string) *ptftp.Client {
	c, err := ptftp.NewClient(addr)
	must(b, err)
	c.SetBlockSize(1428)
	c.RequestTSize(true)
	return c
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func newFixtureTB(t testing.TB, cfg Config) *fixture {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "root")
	must(t, os.MkdirAll(filepath.Join(root, "efi"), 0o755))
	big := make([]byte, 300*1024+17)
	_, _ = rand.Read(big)
	must(t, os.WriteFile(filepath.Join(root, "undionly.kpxe"), big, 0o644))
	must(t, os.WriteFile(filepath.Join(root, "efi", "snponly.efi"), []byte("efi bytes"), 0o644))
	secret := filepath.Join(base, "secret.txt")
	must(t, os.WriteFile(secret, []byte("do not serve"), 0o600))
	must(t, os.Symlink("undionly.kpxe", filepath.Join(root, "inside-link")))
	must(t, os.Symlink(secret, filepath.Join(root, "outside-abs")))
	must(t, os.Symlink("../secret.txt", filepath.Join(root, "outside-rel")))
	must(t, os.Symlink("..", filepath.Join(root, "up")))
	cfg.Root = root
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	cfg.ScriptURL = scriptURL
	s, err := New(cfg)
	must(t, err)
	must(t, s.Listen())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve = %v after cancel, want nil", err)
		}
	})
	return &fixture{srv: s, addr: s.Addr().String(), root: root, big: big, secret: secret}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func client(t *testing.T, addr string, blksize int, tsize bool) *ptftp.Client {
	t.Helper()
	c, err := ptftp.NewClient(addr)
	must(t, err)
	if blksize > 0 {
		c.SetBlockSize(blksize)
	}
	c.RequestTSize(tsize)
	c.SetRetries(3)
	return c
}

func fetch(t *testing.T, c *ptftp.Client, name string) ([]byte, int64, error) {
	t.Helper()
	wt, err := c.Receive(name, "octet")
	if err != nil {
		return nil, -1, err
	}
	size := int64(-1)
	if n, ok := wt.(ptftp.IncomingTransfer).Size(); ok {
		size = n
	}
	var b bytes.Buffer
	_, err = wt.WriteTo(&b)
	return b.Bytes(), size, err
}

func TestLibraryClientBlksizeTsize(t *testing.T) {
	f := newFixture(t, Config{})
	for _, bs := range []int{0, 512, 1428, 8192} {
		t.Run(fmt.Sprintf("blksize-%d", bs), func(t *testing.T) {
			got, size, err := fetch(t, client(t, f.addr, bs, true), "undionly.kpxe")
			must(t, err)
			if !bytes.Equal(got, f.big) {
				t.Fatalf("got %d bytes, want %d identical", len(got), len(f.big))
			}
			if size != int64(len(f.big)) {
				t.Fatalf("tsize = %d, want %d", size, len(f.big))
			}
		})
	}
	got, size, err := fetch(t, client(t, f.addr, 1428, true), AutoexecName)
	must(t, err)
	if !strings.HasPrefix(string(got), "#!ipxe\n") || !strings.Contains(string(got), "chain --autofree "+scriptURL+"?mac=${net0/mac:hexhyp}") || size != int64(len(got)) {
		t.Fatalf("autoexec.ipxe = %q (tsize %d)", got, size)
	}
	got, _, err = fetch(t, client(t, f.addr, 0, false), "efi/snponly.efi")
	if err != nil || string(got) != "efi bytes" {
		t.Fatalf("nested file = %q, %v", got, err)
	}
	got, _, err = fetch(t, client(t, f.addr, 0, false), "inside-link")
	if err != nil || !bytes.Equal(got, f.big) {
		t.Fatalf("symlink inside root: %d bytes, %v", len(got), err)
	}
}

// TestCachedFileFollowsChanges: files are served from the in-memory cache
// only while they are unchanged: a file rewritten in place (same size, new
// bytes), replaced by rename, or grown is served with its new contents on
// the next transfer, and a symlink swapped to point out of the root is
// still refused (every transfer opens the path through the root).
func TestCachedFileFollowsChanges(t *testing.T) {
	f := newFixture(t, Config{})
	c := client(t, f.addr, 1428, true)
	for i := range 2 { // the second fetch comes from the cache
		got, _, err := fetch(t, c, "undionly.kpxe")
		if err != nil || !bytes.Equal(got, f.big) {
			t.Fatalf("fetch %d: %d bytes, %v", i, len(got), err)
		}
	}
	p := filepath.Join(f.root, "undionly.kpxe")
	// Same size, new bytes, mtime forced to differ.
	next := bytes.Clone(f.big)
	next[0] ^= 0xff
	next[len(next)-1] ^= 0xff
	must(t, os.WriteFile(p, next, 0o644))
	must(t, os.Chtimes(p, time.Now().Add(time.Hour), time.Now().Add(time.Hour)))
	if got, _, err := fetch(t, c, "undionly.kpxe"); err != nil || !bytes.Equal(got, next) {
		t.Fatalf("after rewrite: %v, same as new contents: %v", err, bytes.Equal(got, next))
	}
	// Replaced by rename (new inode), grown.
	grown := append(bytes.Clone(next), []byte("tail")...)
	tmp := filepath.Join(f.root, ".new")
	must(t, os.WriteFile(tmp, grown, 0o644))
	must(t, os.Rename(tmp, p))
	if got, size, err := fetch(t, c, "undionly.kpxe"); err != nil || !bytes.Equal(got, grown) || size != int64(len(grown)) {
		t.Fatalf("after rename: %d bytes (tsize %d), %v; want %d", len(got), size, err, len(grown))
	}
	// A cached name turned into a symlink out of the root is refused.
	if _, _, err := fetch(t, c, "inside-link"); err != nil {
		t.Fatal(err)
	}
	must(t, os.Remove(filepath.Join(f.root, "inside-link")))
	must(t, os.Symlink(f.secret, filepath.Join(f.root, "inside-link")))
	if got, _, err := fetch(t, c, "inside-link"); err == nil {
		t.Fatalf("symlink out of the root served %q", got)
	}
}

func TestTraversalRefused(t *testing.T) {
	f := newFixture(t, Config{})
	for _, name := range []string{
		"../secret.txt", "efi/../../secret.txt", "/etc/passwd", f.secret, "../secret.txt\x00undionly.kpxe",
		"outside-abs", "outside-rel", "up/secret.txt", "efi\\..\\..\\secret.txt", "./undionly.kpxe", "efi//snponly.efi", "missing.bin", "efi",
	} {
		t.Run(strings.ReplaceAll(name, "/", "_"), func(t *testing.T) {
			got, _, err := fetch(t, client(t, f.addr, 0, false), name)
			if err == nil {
				t.Fatalf("%q served %d bytes", name, len(got))
			}
			if strings.Contains(err.Error(), f.root) || strings.Contains(err.Error(), "secret") && !strings.Contains(name, "secret") {
				t.Fatalf("error leaks host detail: %v", err)
			}
		})
	}
	if st := f.srv.Stats(); st.Refused == 0 || st.Served != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPerClientLimit(t *testing.T) {
	f := newFixture(t, Config{MaxPerClient: 2})
	// Two transfers started and left unread: the server holds them open
	// waiting for ACKs. The third from the same IP is refused.
	var open []ptftp.IncomingTransfer
	for range 2 {
		wt, err := client(t, f.addr, 512, false).Receive("undionly.kpxe", "octet")
		must(t, err)
		open = append(open, wt.(ptftp.IncomingTransfer))
	}
	_, _, err := fetch(t, client(t, f.addr, 512, false), "undionly.kpxe")
	if err == nil || !strings.Contains(err.Error(), ErrBusy.Error()) {
		t.Fatalf("third concurrent transfer = %v, want %q", err, ErrBusy)
	}
	for _, wt := range open {
		var b bytes.Buffer
		if _, err := wt.(io.WriterTo).WriteTo(&b); err != nil || b.Len() != len(f.big) {
			t.Fatalf("held transfer: %d bytes, %v", b.Len(), err)
		}
	}
	if _, _, err := fetch(t, client(t, f.addr, 512, false), "undionly.kpxe"); err != nil {
		t.Fatalf("after the held transfers finished: %v", err)
	}
	if st := f.srv.Stats(); st.Limited != 1 {
		t.Fatalf("stats %+v, want Limited 1", st)
	}
}

func TestCleanPath(t *testing.T) {
	for _, bad := range []string{"", "/x", "a/../b", "..", "a\x00", "a\\b", "a//b", "./a", strings.Repeat("a", 256)} {
		if _, err := CleanPath(bad); !errors.Is(err, ErrBadPath) {
			t.Errorf("CleanPath(%q) = %v, want ErrBadPath", bad, err)
		}
	}
	for _, ok := range []string{"undionly.kpxe", "efi/snponly.efi", "a..b"} {
		if _, err := CleanPath(ok); err != nil {
			t.Errorf("CleanPath(%q) = %v", ok, err)
		}
	}
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"undionly.kpxe", "../x", "/etc/passwd", "a/./b", "a\x00b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		clean, err := CleanPath(name)
		if err != nil {
			return
		}
		if !filepath.IsLocal(clean) || filepath.Clean(clean) != clean || strings.ContainsRune(clean, 0) {
			t.Fatalf("CleanPath(%q) = %q, which is not a clean local path", name, clean)
		}
	})
}

// TestTFTPHPAClient downloads with tftp-hpa's tftp client (a different TFTP
// implementation than the server's library) and checks traversal through it.
func TestTFTPHPAClient(t *testing.T) {
	bin := netnstest.RequireCommand(t, "tftp")
	f := newFixture(t, Config{})
	_, port, _ := strings.Cut(f.addr, ":")
	out := filepath.Join(t.TempDir(), "got.kpxe")
	cmd := exec.Command(bin, "-m", "binary", "127.0.0.1", port, "-c", "get", "undionly.kpxe", out)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tftp get: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	must(t, err)
	if !bytes.Equal(got, f.big) {
		t.Fatalf("tftp-hpa got %d bytes, want %d identical", len(got), len(f.big))
	}
	out2 := filepath.Join(t.TempDir(), "autoexec.ipxe")
	if b, err := exec.Command(bin, "127.0.0.1", port, "-c", "get", AutoexecName, out2).CombinedOutput(); err != nil {
		t.Fatalf("tftp get autoexec: %v\n%s", err, b)
	}
	if a, _ := os.ReadFile(out2); !strings.Contains(string(a), scriptURL) {
		t.Fatalf("autoexec via tftp-hpa = %q", a)
	}
	for _, name := range []string{"../secret.txt", "outside-rel", "/etc/passwd"} {
		dst := filepath.Join(t.TempDir(), "x")
		b, _ := exec.Command(bin, "-m", "binary", "127.0.0.1", port, "-c", "get", name, dst).CombinedOutput()
		// tftp-hpa exits 0 even on a TFTP error; the file must not be there
		// (or be empty) and the error must be printed.
		if data, _ := os.ReadFile(dst); len(data) > 0 {
			t.Fatalf("tftp-hpa fetched %q: %q", name, data)
		}
		if !strings.Contains(string(b), "Error code") {
			t.Fatalf("tftp-hpa get %q printed %q, want a TFTP error", name, b)
		}
	}
}

// TestGeneratedGRUBConfigAndFiles: with GRUBScriptURL set, machina-grub.cfg
// (what the arm64 GRUB image sources first) chains to the controller's
// /boot/grub; Files are served from memory with tsize; names that are not
// plain relative paths, or that would shadow a generated file, are refused
// at New.
func TestGeneratedGRUBConfigAndFiles(t *testing.T) {
	img := bytes.Repeat([]byte("grub"), 5000)
	f := newFixture(t, Config{GRUBScriptURL: "http://10.99.0.1:8080/boot/grub", Files: map[string][]byte{boot.GRUBImageARM64: img}})
	got, size, err := fetch(t, client(t, f.addr, 1428, true), boot.GRUBConfigName)
	must(t, err)
	if !strings.Contains(string(got), `source "(http,10.99.0.1:8080)/boot/grub?mac=${net_default_mac}&platform=${grub_platform}&arch=${grub_cpu}"`) || size != int64(len(got)) {
		t.Fatalf("%s = %q (tsize %d)", boot.GRUBConfigName, got, size)
	}
	got, size, err = fetch(t, client(t, f.addr, 1428, true), boot.GRUBImageARM64)
	must(t, err)
	if !bytes.Equal(got, img) || size != int64(len(img)) {
		t.Fatalf("%s: %d bytes (tsize %d), want %d identical", boot.GRUBImageARM64, len(got), size, len(img))
	}
	// GRUB asks for "/machina-grub.cfg"; a root file with a leading "/"
	// is still refused.
	if got, _, err := fetch(t, client(t, f.addr, 0, false), "/"+boot.GRUBConfigName); err != nil || !strings.Contains(string(got), "source ") {
		t.Fatalf("/%s = %q, %v; want the generated config", boot.GRUBConfigName, got, err)
	}
	if _, _, err := fetch(t, client(t, f.addr, 0, false), "/undionly.kpxe"); err == nil {
		t.Fatal("/undionly.kpxe (absolute) was served")
	}
	if _, _, err := fetch(t, client(t, f.addr, 0, false), boot.GRUBConfigName+"x"); err == nil {
		t.Fatal("a name that is not generated or in the root was served")
	}
	for _, name := range []string{"../x", "/abs", AutoexecName, boot.GRUBConfigName, ""} {
		_, err := New(Config{Root: t.TempDir(), ScriptURL: scriptURL, Files: map[string][]byte{name: nil}})
		if err == nil {
			t.Errorf("New accepted Files[%q]", name)
		}
	}
	if _, err := New(Config{Root: t.TempDir(), ScriptURL: scriptURL, GRUBScriptURL: "https://10.0.0.1/boot/grub"}); err == nil {
		t.Error("New accepted an https GRUBScriptURL (GRUB has no TLS)")
	}
}

// TestSecureBootGRUBConfig: Debian's signed grubnetx64 (prefix /grub)
// asks for "/grub/x86_64-efi/grub.cfg" (not served: it then falls back)
// and "/grub/grub.cfg", which sources the machine's script from this
// server by MAC; the script comes from Config.Script with the MAC and the
// client's address (an error is "not found"); Files may not shadow either.
func TestSecureBootGRUBConfig(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	script := func(_ context.Context, mac string, peer netip.Addr) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, mac+" "+peer.String())
		if mac != "52:54:00:15:00:01" {
			return nil, errors.New("unknown")
		}
		return []byte("linux /machina/ramdisk/vmlinuz\n"), nil
	}
	f := newFixture(t, Config{Script: script, Files: map[string][]byte{boot.ShimImageX64: []byte("shim"), boot.GRUBImageX64: []byte("grub")}})
	got, _, err := fetch(t, client(t, f.addr, 1428, true), "/"+boot.GRUBPrefixConfig)
	must(t, err)
	if !bytes.Equal(got, boot.SecureBootGRUBConfig()) || !strings.Contains(string(got), `source "($root)/machina/grub/${net_default_mac}"`) {
		t.Fatalf("/%s = %q", boot.GRUBPrefixConfig, got)
	}
	if _, _, err := fetch(t, client(t, f.addr, 0, false), "/grub/x86_64-efi/grub.cfg"); err == nil {
		t.Fatal("/grub/x86_64-efi/grub.cfg was served")
	}
	got, _, err = fetch(t, client(t, f.addr, 0, false), "/machina/grub/52:54:00:15:00:01")
	if err != nil || string(got) != "linux /machina/ramdisk/vmlinuz\n" {
		t.Fatalf("script = %q, %v", got, err)
	}
	if _, _, err := fetch(t, client(t, f.addr, 0, false), "machina/grub/52:54:00:15:00:02"); err == nil {
		t.Fatal("a refused script was served")
	}
	mu.Lock()
	if len(asked) != 2 || asked[0] != "52:54:00:15:00:01 127.0.0.1" {
		t.Errorf("Script called with %q", asked)
	}
	mu.Unlock()
	for _, name := range []string{boot.ShimImageX64, boot.GRUBImageX64} {
		if got, _, err := fetch(t, client(t, f.addr, 0, false), name); err != nil || len(got) != 4 {
			t.Fatalf("%s = %q, %v", name, got, err)
		}
	}
	for _, name := range []string{boot.GRUBPrefixConfig, boot.GRUBTFTPScriptDir + "x"} {
		if _, err := New(Config{Root: t.TempDir(), ScriptURL: scriptURL, Files: map[string][]byte{name: nil}}); err == nil {
			t.Errorf("New accepted Files[%q]", name)
		}
	}
	// Without Script there is no grub/grub.cfg.
	g := newFixture(t, Config{GRUBScriptURL: "http://10.99.0.1:8080/boot/grub"})
	if _, _, err := fetch(t, client(t, g.addr, 0, false), "/"+boot.GRUBPrefixConfig); err == nil {
		t.Fatal("grub/grub.cfg served without Script")
	}
}

// TestOnServedReportsCompleteTransfers: OnServed gets the name (without
// its leading "/") and the client's address of each transfer whose last
// block was acknowledged, a file of Files and one of Root alike; a
// refused request and a size probe aborted by the client are not reported.
func TestOnServedReportsCompleteTransfers(t *testing.T) {
	var mu sync.Mutex
	var served []string
	onServed := func(name string, peer netip.Addr) {
		mu.Lock()
		defer mu.Unlock()
		served = append(served, name+" "+peer.String())
	}
	f := newFixture(t, Config{OnServed: onServed, Files: map[string][]byte{boot.TFTPRamdiskKernel: []byte("kernel bytes")}})
	if _, _, err := fetch(t, client(t, f.addr, 0, false), "/nothing-here"); err == nil {
		t.Fatal("a missing file was served")
	}
	if got, _, err := fetch(t, client(t, f.addr, 1428, true), "/"+boot.TFTPRamdiskKernel); err != nil || string(got) != "kernel bytes" {
		t.Fatalf("kernel = %q, %v", got, err)
	}
	if _, _, err := fetch(t, client(t, f.addr, 1428, true), "undionly.kpxe"); err != nil {
		t.Fatal(err)
	}
	want := []string{boot.TFTPRamdiskKernel + " 127.0.0.1", "undionly.kpxe 127.0.0.1"}
	// The server sees the last ACK after the client has the file: poll.
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		got := slices.Clone(served)
		mu.Unlock()
		if slices.Equal(got, want) {
			break
		}
		if len(got) > len(want) || time.Now().After(deadline) {
			t.Fatalf("OnServed got %q, want %q", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
