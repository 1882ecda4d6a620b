package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/internal/peertest"
)

// mirrorLog wraps a file server and records request paths.
type mirrorLog struct {
	mu    sync.Mutex
	paths []string
	h     http.Handler
}

func (m *mirrorLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	m.paths = append(m.paths, r.URL.Path)
	m.mu.Unlock()
	m.h.ServeHTTP(w, r)
}

func (m *mirrorLog) count(p string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, q := range m.paths {
		if q == p {
			n++
		}
	}
	return n
}

// layoutUbuntuMirror writes a qcow2 image made by qemu-img from raw under
// root/releases/24.04/release/ as cloud-images.ubuntu.com lays it out, with
// a SHA256SUMS in Ubuntu's format (binary marker, several entries).
func layoutUbuntuMirror(t *testing.T, root string, raw []byte) (imgPath string) {
	t.Helper()
	qemuImg := peertest.Command(t, "qemu-img")
	dir := filepath.Join(root, "releases", "24.04", "release")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "src.raw")
	if err := os.WriteFile(src, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	imgPath = filepath.Join(dir, "ubuntu-24.04-server-cloudimg-amd64.img")
	if out, err := exec.Command(qemuImg, "convert", "-f", "raw", "-O", "qcow2", src, imgPath).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	q, err := os.ReadFile(imgPath)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(q)
	other := strings.Repeat("ab", 32)
	sums := fmt.Sprintf("%s *ubuntu-24.04-server-cloudimg-amd64.img.manifest\n%s *ubuntu-24.04-server-cloudimg-amd64.img\n%s *ubuntu-24.04-server-cloudimg-arm64.img\n",
		other, hex.EncodeToString(sum[:]), other)
	if err := os.WriteFile(filepath.Join(dir, "SHA256SUMS"), []byte(sums), 0o644); err != nil {
		t.Fatal(err)
	}
	return imgPath
}

func TestImagesImportFromLocalMirror(t *testing.T) {
	raw := make([]byte, 3<<20)
	rand.Read(raw)
	clear(raw[1<<20 : 2<<20])
	root := t.TempDir()
	layoutUbuntuMirror(t, root, raw)
	ml := &mirrorLog{h: http.FileServer(http.Dir(root))}
	srv := httptest.NewServer(ml)
	defer srv.Close()
	store := t.TempDir()

	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"images", "import", "ubuntu-24.04", "--mirror", srv.URL + "/", "--store", store}, nil, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("run() = %d, stderr:\n%s", code, stderr.String())
	}
	rawSum := sha256.Sum256(raw)
	if !strings.Contains(stdout.String(), "ubuntu-24.04: verified "+srv.URL+"/releases/24.04/release/ubuntu-24.04-server-cloudimg-amd64.img (qcow2") ||
		!strings.Contains(stdout.String(), "raw sha256:"+hex.EncodeToString(rawSum[:])) {
		t.Errorf("stdout = %q", stdout.String())
	}
	for _, want := range []string{"ubuntu-24.04 download", "100.0%", "ubuntu-24.04 convert", "3.0 MiB/3.0 MiB"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("progress output lacks %q:\n%s", want, stderr.String())
		}
	}

	st, err := images.OpenStore(store)
	if err != nil {
		t.Fatal(err)
	}
	f, rec, err := st.OpenImage("ubuntu-24.04")
	if err != nil {
		t.Fatalf("OpenImage() = %v", err)
	}
	got := make([]byte, len(raw)+1)
	n, _ := f.ReadAt(got, 0)
	f.Close()
	if n != len(raw) || !bytes.Equal(got[:n], raw) || rec.Catalog != "ubuntu-24.04" || rec.Arch != "amd64" {
		t.Errorf("stored image: %d bytes, record %+v", n, rec)
	}

	// Idempotent: a second import fetches SHA256SUMS again but not the image.
	stdout.Reset()
	stderr.Reset()
	if code := run(t.Context(), []string{"images", "import", "ubuntu-24.04", "--mirror", srv.URL + "/", "--store", store, "-q"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("second run() = %d: %s", code, stderr.String())
	}
	if n := ml.count("/releases/24.04/release/ubuntu-24.04-server-cloudimg-amd64.img"); n != 1 {
		t.Errorf("image fetched %d times, want 1", n)
	}
	if n := ml.count("/releases/24.04/release/SHA256SUMS"); n != 2 {
		t.Errorf("SHA256SUMS fetched %d times, want 2", n)
	}

	stdout.Reset()
	if code := run(t.Context(), []string{"images", "list", "--store", store}, nil, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "ubuntu-24.04  verified  3.0 MiB") {
		t.Errorf("images list = %d, %q", code, stdout.String())
	}

	// A per-family override (no --mirror) into a fresh store.
	stderr.Reset()
	if code := run(t.Context(), []string{"images", "import", "ubuntu-24.04", "--mirror-for", "ubuntu=" + srv.URL + "/", "--store", t.TempDir(), "-q"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("run(--mirror-for) = %d: %s", code, stderr.String())
	}
	if n := ml.count("/releases/24.04/release/ubuntu-24.04-server-cloudimg-amd64.img"); n != 2 {
		t.Errorf("image fetched %d times, want 2 (one per store)", n)
	}
}

func TestImagesImportURLAndErrors(t *testing.T) {
	root := t.TempDir()
	raw := make([]byte, 100_000)
	rand.Read(raw)
	if err := os.WriteFile(filepath.Join(root, "disk.raw"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	os.WriteFile(filepath.Join(root, "SHA256SUMS"), []byte("SHA256 (disk.raw) = "+hex.EncodeToString(sum[:])+"\n"), 0o644)
	srv := httptest.NewServer(http.FileServer(http.Dir(root)))
	defer srv.Close()
	store := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"url with checksum file", []string{"images", "import", srv.URL + "/disk.raw", "--name", "disk", "--checksum", srv.URL + "/SHA256SUMS"}, 0, ""},
		{"url with digest", []string{"images", "import", srv.URL + "/disk.raw", "--name", "disk2", "--checksum", "sha256:" + hex.EncodeToString(sum[:])}, 0, ""},
		{"mismatch", []string{"images", "import", srv.URL + "/disk.raw", "--name", "bad", "--checksum", "sha256:" + strings.Repeat("0", 64)}, 1, "checksum mismatch"},
		{"md5", []string{"images", "import", srv.URL + "/disk.raw", "--name", "bad", "--checksum", "md5:" + strings.Repeat("0", 32)}, 2, "weak checksum"},
		{"no name", []string{"images", "import", srv.URL + "/disk.raw", "--checksum", "sha256:" + hex.EncodeToString(sum[:])}, 2, "needs --name"},
		{"unknown catalog", []string{"images", "import", "windows-11"}, 2, "unknown catalog image"},
		{"mirror on url", []string{"images", "import", srv.URL + "/disk.raw", "--name", "x", "--mirror", srv.URL, "--checksum", srv.URL + "/SHA256SUMS"}, 2, "catalog images only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), append(tc.args, "--store", store, "-q"), nil, &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.err) {
				t.Errorf("run(%v) = %d, stderr %q; want %d and %q", tc.args, code, stderr.String(), tc.code, tc.err)
			}
		})
	}
}
