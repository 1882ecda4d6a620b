package boot

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// filesTree: a served folder with a file, a nested file, a hidden file, a
// symlink inside and two symlinks out (to a file and to a folder), and a
// secret outside it.
func filesTree(t *testing.T) string {
	t.Helper()
	dir, outside := t.TempDir(), t.TempDir()
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "vmlinuz"), "0123456789")
	write(filepath.Join(dir, "casper", "initrd"), "initrd-bytes")
	write(filepath.Join(dir, ".treeinfo"), "[general]")
	write(filepath.Join(dir, "boot.iso"), "iso")
	write(filepath.Join(outside, "secret"), "secret")
	for link, target := range map[string]string{
		"inside":      "casper/initrd",
		"out-file":    filepath.Join(outside, "secret"),
		"out-dir":     outside,
		"out-dotdot":  "../" + filepath.Base(outside) + "/secret",
		"casper/loop": "../vmlinuz",
	} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func get(t *testing.T, h http.Handler, target string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "http://x"+target, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestFiles is the one test of the file server's refusals and Range: every
// boot file and installer tree route serves through ServeFile.
func TestFiles(t *testing.T) {
	dir := filesTree(t)
	f, err := OpenFiles(dir, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := http.StripPrefix("/boot/ramdisk/", f)
	for _, tt := range []struct {
		path string
		code int
		body string
	}{
		{"/boot/ramdisk/vmlinuz", 200, "0123456789"},
		{"/boot/ramdisk/casper/initrd", 200, "initrd-bytes"},
		{"/boot/ramdisk/inside", 200, "initrd-bytes"},    // a symlink within the root is followed
		{"/boot/ramdisk/casper/loop", 200, "0123456789"}, // ".." that stays inside
		{"/boot/ramdisk/out-file", 404, ""},              // symlink out of the root
		{"/boot/ramdisk/out-dir/secret", 404, ""},        // through a symlinked folder out
		{"/boot/ramdisk/out-dotdot", 404, ""},            // relative symlink out
		{"/boot/ramdisk/../secret", 404, ""},
		{"/boot/ramdisk/%2e%2e/secret", 404, ""},
		{"/boot/ramdisk/casper/..%2f..%2fsecret", 404, ""},
		{"/boot/ramdisk/casper/../vmlinuz", 404, ""}, // not clean
		{"/boot/ramdisk/casper/", 404, ""},           // no listings
		{"/boot/ramdisk/", 404, ""},
		{"/boot/ramdisk/casper", 404, ""}, // a folder
		{"/boot/ramdisk/.treeinfo", 404, ""},
		{"/boot/ramdisk/vmlinuz%00", 404, ""},
		{"/boot/ramdisk/casper%5cinitrd", 404, ""},
		{"/boot/ramdisk/missing", 404, ""},
	} {
		w := get(t, h, tt.path)
		if w.Code != tt.code || (tt.code == 200 && w.Body.String() != tt.body) {
			t.Errorf("GET %s = %d %q, want %d %q", tt.path, w.Code, w.Body.String(), tt.code, tt.body)
		}
		if strings.Contains(w.Body.String(), "secret") {
			t.Errorf("GET %s leaked the file outside the root", tt.path)
		}
	}

	w := get(t, h, "/boot/ramdisk/vmlinuz", "Range", "bytes=2-5")
	if w.Code != http.StatusPartialContent || w.Body.String() != "2345" || w.Header().Get("Content-Range") != "bytes 2-5/10" {
		t.Errorf("Range 2-5 = %d %q %q, want 206 \"2345\" bytes 2-5/10", w.Code, w.Body.String(), w.Header().Get("Content-Range"))
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/octet-stream" {
		t.Errorf("Content-Type = %q", ct)
	}
	w = get(t, h, "/boot/ramdisk/vmlinuz", "Range", "bytes=20-")
	if w.Code != http.StatusRequestedRangeNotSatisfiable {
		t.Errorf("Range 20- = %d, want 416", w.Code)
	}
	r := httptest.NewRequest(http.MethodPost, "http://x/boot/ramdisk/vmlinuz", nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST = %d, want 405", rec.Code)
	}

	// Options: hidden names for installer trees, a required suffix, no-store.
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	serve := func(name string, opt FileOptions) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		ServeFile(w, httptest.NewRequest(http.MethodGet, "http://x/", nil), root, name, opt)
		return w
	}
	if w := serve(".treeinfo", FileOptions{Hidden: true, NoStore: true}); w.Code != 200 || w.Header().Get("Cache-Control") != "no-store" {
		t.Errorf(".treeinfo with Hidden = %d %v", w.Code, w.Header())
	}
	if w := serve("..", FileOptions{Hidden: true}); w.Code != 404 {
		t.Errorf(".. with Hidden = %d, want 404", w.Code)
	}
	if w := serve("casper/initrd", FileOptions{Flat: true}); w.Code != 404 {
		t.Errorf("casper/initrd with Flat = %d, want 404", w.Code)
	}
	if w := serve("vmlinuz", FileOptions{Ext: ".iso"}); w.Code != 404 {
		t.Errorf("vmlinuz with Ext .iso = %d, want 404", w.Code)
	}
	if w := serve("boot.iso", FileOptions{Ext: ".iso", ContentType: "application/x-iso9660-image"}); w.Code != 200 || w.Header().Get("Content-Type") != "application/x-iso9660-image" {
		t.Errorf("boot.iso = %d %v", w.Code, w.Header())
	}
	b, _ := io.ReadAll(serve("out-file", FileOptions{}).Body)
	if len(b) > 0 && strings.Contains(string(b), "secret") {
		t.Error("ServeFile followed a symlink out")
	}
}

// TestFilesOldServerFollowsSymlinksOut documents why the ramdisk folder moved
// off http.FileServer(http.Dir): on the same tree it serves the file a
// symlink points to outside the folder.
func TestFilesOldServerFollowsSymlinksOut(t *testing.T) {
	dir := filesTree(t)
	w := get(t, http.StripPrefix("/boot/ramdisk/", http.FileServer(http.Dir(dir))), "/boot/ramdisk/out-file")
	if w.Code != 200 || w.Body.String() != "secret" {
		t.Fatalf("http.FileServer(http.Dir) on a symlink out = %d %q; the premise of ServeFile's os.Root changed", w.Code, w.Body.String())
	}
}
