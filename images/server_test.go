package images

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/internal/peertest"
)

// fault is one injected misbehaviour, consumed by the next request for path.
type fault struct {
	path       string
	drop       int64  // send this many body bytes, then close the connection
	code       int    // answer with this status
	retryAfter string // Retry-After header for code
	location   string // redirect target for 3xx codes
	stall      int64  // send this many body bytes, then stop sending (connection kept open)
	// ignoreIfRange: honour Range but ignore If-Range, as some servers do.
	ignoreIfRange bool
}

// faultServer is an httptest server serving in-memory files with Range
// support (http.ServeContent) and scripted faults.
type faultServer struct {
	*httptest.Server
	mu     sync.Mutex
	files  map[string][]byte
	etags  map[string]string
	faults []fault
	log    []string // "PATH range=R if-range=I"
	// noValidators: send no ETag, so If-Range cannot catch a changed file.
	noValidators bool
}

func newFaultServer(t *testing.T) *faultServer {
	t.Helper()
	fs := &faultServer{files: map[string][]byte{}, etags: map[string]string{}}
	fs.Server = httptest.NewServer(http.HandlerFunc(fs.serve))
	t.Cleanup(fs.Close)
	return fs
}

func (fs *faultServer) put(path string, b []byte) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.files[path] = b
	sum := sha256.Sum256(b)
	fs.etags[path] = `"` + hex.EncodeToString(sum[:8]) + `"`
}

func (fs *faultServer) inject(f ...fault) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.faults = append(fs.faults, f...)
}

func (fs *faultServer) requests(path string) []string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out []string
	for _, l := range fs.log {
		if strings.HasPrefix(l, path+" ") {
			out = append(out, l)
		}
	}
	return out
}

func (fs *faultServer) serve(w http.ResponseWriter, r *http.Request) {
	fs.mu.Lock()
	fs.log = append(fs.log, fmt.Sprintf("%s range=%s if-range=%s", r.URL.Path, r.Header.Get("Range"), r.Header.Get("If-Range")))
	var f *fault
	for i := range fs.faults {
		if fs.faults[i].path == r.URL.Path {
			ff := fs.faults[i]
			f = &ff
			fs.faults = append(fs.faults[:i], fs.faults[i+1:]...)
			break
		}
	}
	body, ok := fs.files[r.URL.Path]
	etag := fs.etags[r.URL.Path]
	if fs.noValidators {
		etag = ""
	}
	fs.mu.Unlock()
	switch {
	case f != nil && f.code != 0:
		if f.retryAfter != "" {
			w.Header().Set("Retry-After", f.retryAfter)
		}
		if f.location != "" {
			w.Header().Set("Location", f.location)
		}
		w.WriteHeader(f.code)
		return
	case !ok:
		http.NotFound(w, r)
		return
	case f != nil && f.stall > 0:
		w.Header().Set("ETag", etag)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(200)
		w.Write(body[:f.stall])
		w.(http.Flusher).Flush()
		<-r.Context().Done() // until the client gives up
		return
	case f != nil && f.drop > 0:
		start := int64(0)
		if v, ok := strings.CutPrefix(r.Header.Get("Range"), "bytes="); ok {
			start, _ = strconv.ParseInt(strings.TrimSuffix(v, "-"), 10, 64)
		}
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		n := int64(len(body))
		if start > 0 {
			fmt.Fprintf(buf, "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\n", start, n-1, n)
		} else {
			fmt.Fprintf(buf, "HTTP/1.1 200 OK\r\n")
		}
		if etag != "" {
			fmt.Fprintf(buf, "ETag: %s\r\n", etag)
		}
		fmt.Fprintf(buf, "Content-Length: %d\r\n\r\n", n-start)
		buf.Write(body[start:min(start+f.drop, n)])
		buf.Flush()
		return
	}
	if etag != "" {
		w.Header().Set("ETag", etag)
	}
	if f != nil && f.ignoreIfRange {
		r.Header.Del("If-Range")
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
}

// sleepLog records the waits an Importer asks for, without waiting.
type sleepLog struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (s *sleepLog) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waits = append(s.waits, d)
	return ctx.Err()
}

func (s *sleepLog) get() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.waits...)
}

// statusLog is an in-memory StatusRecorder.
type statusLog struct {
	mu  sync.Mutex
	log []Status
}

func (s *statusLog) RecordImageStatus(_ context.Context, name string, st Status) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, st)
	return nil
}

func (s *statusLog) states() []State {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []State
	for _, st := range s.log {
		if len(out) == 0 || out[len(out)-1] != st.State {
			out = append(out, st.State)
		}
	}
	return out
}

func (s *statusLog) last() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log[len(s.log)-1]
}

type testEnv struct {
	store  *Store
	im     *Importer
	sleeps *sleepLog
	status *statusLog
}

func newTestEnv(t *testing.T, mod func(*Config)) *testEnv {
	t.Helper()
	st, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{store: st, sleeps: &sleepLog{}, status: &statusLog{}}
	cfg := Config{Store: st, Sleep: e.sleeps.sleep, Status: e.status,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	if mod != nil {
		mod(&cfg)
	}
	if e.im, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	return e
}

// randomRaw returns n bytes that look like a raw disk: random data with a
// zero hole in the middle (so qcow2 conversion has sparse regions).
func randomRaw(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	clear(b[n/4 : n/2])
	b[0] = 0xeb // not any recognised magic
	return b
}

func sha256Of(b []byte) Digest {
	s := sha256.Sum256(b)
	return Digest{Algo: SHA256, Hex: hex.EncodeToString(s[:])}
}

// needQemuImg returns the qemu-img path or fails naming qemu-utils.
func needQemuImg(t *testing.T) string {
	t.Helper()
	return peertest.Command(t, "qemu-img")
}

// qemuImg runs qemu-img with args.
func qemuImg(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(needQemuImg(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img %v: %v: %s", args, err, out)
	}
}

// toQCOW2 converts raw bytes into a qcow2 file with qemu-img and returns it.
func toQCOW2(t *testing.T, raw []byte, extra ...string) []byte {
	t.Helper()
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.raw"), filepath.Join(dir, "out.qcow2")
	if err := os.WriteFile(in, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	qemuImg(t, append(append([]string{"convert", "-f", "raw", "-O", "qcow2"}, extra...), in, out)...)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readBlob(t *testing.T, st *Store, r Record) []byte {
	t.Helper()
	p, err := st.BlobPath(r.Raw)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func tmpEntries(t *testing.T, st *Store) []string {
	t.Helper()
	ents, err := os.ReadDir(st.tmpDir())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
