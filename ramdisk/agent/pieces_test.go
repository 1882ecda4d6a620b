package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// pieceImage is a random image of n bytes and its manifest (4 MiB pieces).
func pieceImage(t *testing.T, n int) ([]byte, v1.PieceManifest) {
	t.Helper()
	img := make([]byte, n)
	rand.Read(img)
	m := v1.PieceManifest{PieceBytes: v1.PieceBytes, SizeBytes: int64(n), SHA256: sum(img)}
	for off := 0; off < n; off += v1.PieceBytes {
		m.Pieces = append(m.Pieces, sum(img[off:min(off+v1.PieceBytes, n)]))
	}
	return img, m
}

// imageOrigin is the controller's image handler as the agent sees it:
// Range-capable (http.ServeContent), token-gated; it counts the bytes it
// sends.
type imageOrigin struct {
	*httptest.Server
	sent atomic.Int64
}

func newImageOrigin(t *testing.T, img []byte, token string) *imageOrigin {
	o := &imageOrigin{}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		cw := &countingWriter{ResponseWriter: w, n: &o.sent}
		http.ServeContent(cw, r, "", time.Time{}, bytes.NewReader(img))
	}))
	t.Cleanup(o.Close)
	return o
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// member is one agent of a test wave: its pieces, its listener, its fetcher.
type member struct {
	set *PieceSet
	srv *httptest.Server
	f   *PieceFetcher
}

func newMember(t *testing.T, m v1.PieceManifest, origin, imageToken, waveToken string, peers ...*member) *member {
	t.Helper()
	set, err := NewPieceSet(m)
	if err != nil {
		t.Fatal(err)
	}
	ps := &PeerServer{Hold: time.Minute}
	ps.Offer(set, waveToken)
	srv := httptest.NewServer(ps)
	t.Cleanup(srv.Close)
	f := &PieceFetcher{Set: set, ImageURL: origin, ImageToken: imageToken, WaveToken: waveToken,
		Logger: testLogger(t)}
	for _, p := range peers {
		f.Peers = append(f.Peers, p.srv.URL)
	}
	return &member{set: set, srv: srv, f: f}
}

// writeTo runs the verified write of the member's image to a sparse file
// and returns the file's first len bytes.
func (mb *member) writeTo(t *testing.T, m v1.PieceManifest, memLimit int64) (WriteResult, []byte, error) {
	return writeImageFile(t.Context(), t, m, mb.f.Open, memLimit)
}

// writeImageFile runs the verified write (with read-back) of the image m
// describes, opened by open, to a sparse file and returns the file's first
// len bytes.
func writeImageFile(ctx context.Context, t *testing.T, m v1.PieceManifest, open ImageOpener, memLimit int64) (WriteResult, []byte, error) {
	p := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, m.SizeBytes+64<<20); err != nil {
		t.Fatal(err)
	}
	dev, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	res, err := WriteImage(ctx, dev, m.SizeBytes+64<<20, WriteConfig{Open: open, SizeBytes: m.SizeBytes, SHA256: m.SHA256, MemoryLimit: memLimit, ReadBack: true})
	got := make([]byte, m.SizeBytes)
	_, _ = dev.ReadAt(got, 0)
	return res, got, err
}

// TestWaveSharesPieces deploys one image to a wave of three agents at once:
// the first has no peers, the second names the first, the third both. The
// controller sends the image once; the others get every piece from peers,
// each verified, and every disk holds the image (read back).
func TestWaveSharesPieces(t *testing.T) {
	img, m := pieceImage(t, 3*v1.PieceBytes+12345)
	origin := newImageOrigin(t, img, "img-tok")
	a := newMember(t, m, origin.URL, "img-tok", "wave-tok")
	b := newMember(t, m, origin.URL, "img-tok", "wave-tok", a)
	c := newMember(t, m, origin.URL, "img-tok", "wave-tok", a, b)
	var wg sync.WaitGroup
	for _, mode := range []struct {
		mb  *member
		mem int64
	}{{a, 0}, {b, 0}, {c, -1}} { // c writes in two passes: its second pass reads its own pieces
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, got, err := mode.mb.writeTo(t, m, mode.mem)
			if err != nil || res.ReadBackSHA256 != m.SHA256 || !bytes.Equal(got, img) {
				t.Errorf("WriteImage() = %+v, %v; disk matches image: %v", res, err, bytes.Equal(got, img))
			}
		}()
	}
	wg.Wait()
	if got := origin.sent.Load(); got != int64(len(img)) {
		t.Errorf("controller sent %d bytes, want one image (%d)", got, len(img))
	}
	st := []v1.PieceStats{a.f.Stats(), b.f.Stats(), c.f.Stats()}
	if st[0].ControllerBytes != int64(len(img)) || st[1].PeerBytes != int64(len(img)) || st[2].PeerBytes != int64(len(img)) {
		t.Errorf("stats = %+v, want a all from the controller, b and c all from peers", st)
	}
	if st[1].ControllerBytes+st[2].ControllerBytes != 0 {
		t.Errorf("peers fetched from the controller: %+v", st)
	}
}

// TestBadPeerDroppedAndNothingUsed: a peer serves piece 0 correctly and a
// corrupt piece 1. The agent drops it, drops the piece it had taken from
// it, starts the stream again from the controller, reports the peer, and
// the disk holds the verified image.
func TestBadPeerDroppedAndNothingUsed(t *testing.T) {
	img, m := pieceImage(t, 3*v1.PieceBytes)
	origin := newImageOrigin(t, img, "img-tok")
	var served atomic.Int64
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i, _ := strconv.Atoi(r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:])
		p := append([]byte(nil), img[i*v1.PieceBytes:(i+1)*v1.PieceBytes]...)
		if i == 1 {
			p[100] ^= 0xff
		}
		served.Add(1)
		w.Write(p)
	}))
	t.Cleanup(evil.Close)
	mb := newMember(t, m, origin.URL, "img-tok", "wave-tok")
	mb.f.Peers = []string{evil.URL}
	var (
		res WriteResult
		got []byte
		err error
	)
	for attempt := 1; attempt <= 3; attempt++ {
		res, got, err = mb.writeTo(t, m, 0)
		if err == nil || !transientFetch(err) {
			break
		}
		if !errors.Is(err, errBadPeer) {
			t.Fatalf("attempt %d: %v, want errBadPeer", attempt, err)
		}
	}
	if err != nil || res.ReadBackSHA256 != m.SHA256 || !bytes.Equal(got, img) {
		t.Fatalf("WriteImage() = %+v, %v", res, err)
	}
	st := mb.f.Stats()
	if len(st.BadPeers) != 1 || st.BadPeers[0] != evil.URL {
		t.Errorf("BadPeers = %v, want [%s]", st.BadPeers, evil.URL)
	}
	if served.Load() != 2 {
		t.Errorf("bad peer asked %d times, want 2 (pieces 0 and 1, then dropped)", served.Load())
	}
	for i, from := range mb.set.from {
		if from != "" {
			t.Errorf("piece %d kept from %s, want the controller", i, from)
		}
	}
	if origin.sent.Load() != int64(len(img)) {
		t.Errorf("controller sent %d bytes, want %d (every piece after the drop)", origin.sent.Load(), len(img))
	}
}

// TestPeerServerRefusesOutsiders: a machine outside the wave (no token, a
// wrong token, another wave's token) or asking for another image gets 403
// and no bytes; the wave's own token gets the piece.
func TestPeerServerRefusesOutsiders(t *testing.T) {
	img, m := pieceImage(t, v1.PieceBytes+10)
	set, err := NewPieceSet(m)
	if err != nil {
		t.Fatal(err)
	}
	set.put(0, img[:v1.PieceBytes], "")
	ps := &PeerServer{Hold: time.Millisecond}
	srv := httptest.NewServer(ps)
	t.Cleanup(srv.Close)
	other := strings.Repeat("ab", 32)
	get := func(token, digest string, i int) (int, int) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+v1.PeerPiecePath+digest+"/"+strconv.Itoa(i), nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return resp.StatusCode, 0
		}
		return resp.StatusCode, buf.Len()
	}
	if code, _ := get("wave-tok", m.SHA256, 0); code != http.StatusForbidden {
		t.Errorf("before Offer: %d, want 403", code)
	}
	ps.Offer(set, "wave-tok")
	for _, tc := range []struct {
		name, token, digest string
		i, code, n          int
	}{
		{"wave member", "wave-tok", m.SHA256, 0, 200, v1.PieceBytes},
		{"no token", "", m.SHA256, 0, 403, 0},
		{"other wave's token", "wave-tok2", m.SHA256, 0, 403, 0},
		{"other image", "wave-tok", other, 0, 403, 0},
		{"piece not held", "wave-tok", m.SHA256, 1, 404, 0},
		{"out of range", "wave-tok", m.SHA256, 7, 404, 0},
	} {
		if code, n := get(tc.token, tc.digest, tc.i); code != tc.code || n != tc.n {
			t.Errorf("%s: %d with %d bytes, want %d with %d", tc.name, code, n, tc.code, tc.n)
		}
	}
}

// TestNewPieceSetRefusesBadManifest: a manifest whose piece count does not
// match its size, or with a malformed hash, is refused.
func TestNewPieceSetRefusesBadManifest(t *testing.T) {
	_, m := pieceImage(t, 2*v1.PieceBytes)
	short := m
	short.Pieces = m.Pieces[:1]
	bad := m
	bad.Pieces = []string{m.Pieces[0], "zz"}
	for name, mm := range map[string]v1.PieceManifest{"short": short, "bad hash": bad} {
		if _, err := NewPieceSet(mm); err == nil {
			t.Errorf("%s: NewPieceSet() = nil error", name)
		}
	}
}

// TestUsePiecesChoosesTheFetch: a plan with a manifest and a wave fetches
// by pieces (and reports where they came from); an image larger than the
// memory limit, or a plan without a wave, keeps the whole-image opener; a
// manifest that contradicts the plan's digest fails the fetch before any
// request.
func TestUsePiecesChoosesTheFetch(t *testing.T) {
	img, m := pieceImage(t, v1.PieceBytes+1)
	r := &Runner{Client: &v1.AgentClient{BaseURL: "http://127.0.0.1:1"}, Pieces: &PeerServer{}}
	plan := v1.Plan{ImageURL: "http://127.0.0.1:1/images/a", ImageSHA256: m.SHA256, ImageSizeBytes: int64(len(img)), Pieces: &m, Wave: &v1.Wave{ID: "w", Token: "t"}}
	whole := func(context.Context) (io.ReadCloser, error) { return nil, errors.New("whole image") }

	w, res := WriteConfig{Open: whole}, v1.DeployResult{}
	done := r.usePieces(plan, 1<<30, &w, &res, &ProgressMeter{})
	if _, ok := mustOpen(t, w).(*pieceReader); !ok {
		t.Error("plan with pieces and wave: not fetched by pieces")
	}
	done()
	if res.Pieces == nil {
		t.Error("piece stats not reported")
	}
	for _, tc := range []struct {
		name     string
		plan     v1.Plan
		memLimit int64
	}{
		{"no wave", v1.Plan{ImageSizeBytes: plan.ImageSizeBytes, Pieces: &m}, 1 << 30},
		{"larger than memory", plan, int64(len(img)) - 1},
	} {
		w := WriteConfig{Open: whole}
		r.usePieces(tc.plan, tc.memLimit, &w, &res, &ProgressMeter{})()
		if _, err := w.Open(t.Context()); err == nil || err.Error() != "whole image" {
			t.Errorf("%s: opener replaced (%v)", tc.name, err)
		}
	}
	bad := m
	bad.SHA256 = strings.Repeat("0", 64)
	plan.Pieces = &bad
	w = WriteConfig{Open: whole}
	r.usePieces(plan, 1<<30, &w, &res, &ProgressMeter{})()
	if _, err := w.Open(t.Context()); err == nil || !strings.Contains(err.Error(), "piece manifest names") {
		t.Errorf("contradicting manifest: Open() = %v, want the refusal", err)
	}
}

func mustOpen(t *testing.T, w WriteConfig) io.ReadCloser {
	t.Helper()
	rc, err := w.Open(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// TestZeroPiecesShareOneBuffer: a sparse image (a data piece between two
// all-zero pieces) fetched from the controller and served on to a peer.
// Both zero pieces are held as the one shared zero buffer, the data piece
// as fetched, and the peer and the write still get the exact image.
func TestZeroPiecesShareOneBuffer(t *testing.T) {
	img := make([]byte, 3*v1.PieceBytes)
	rand.Read(img[v1.PieceBytes : 2*v1.PieceBytes])
	m := v1.PieceManifest{PieceBytes: v1.PieceBytes, SizeBytes: int64(len(img)), SHA256: sum(img)}
	for off := 0; off < len(img); off += v1.PieceBytes {
		m.Pieces = append(m.Pieces, sum(img[off:off+v1.PieceBytes]))
	}
	origin := newImageOrigin(t, img, "img")
	a := newMember(t, m, origin.URL, "img", "wave")
	b := newMember(t, m, origin.URL, "img", "wave", a)
	for _, mb := range []*member{a, b} {
		_, got, err := mb.writeTo(t, m, 64<<20)
		if err != nil || !bytes.Equal(got, img) {
			t.Fatalf("write: %v (image equal: %v)", err, bytes.Equal(got, img))
		}
	}
	if s := b.f.Stats(); s.PeerBytes != int64(len(img)) {
		t.Errorf("second member: %+v, want the whole image from its peer", s)
	}
	for _, mb := range []*member{a, b} {
		z0, d, z2 := mb.set.get(0), mb.set.get(1), mb.set.get(2)
		if &z0[0] != &zeroPiece()[0] || &z2[0] != &zeroPiece()[0] {
			t.Error("an all-zero piece is held in its own buffer, not the shared zero buffer")
		}
		if &d[0] == &zeroPiece()[0] || !bytes.Equal(d, img[v1.PieceBytes:2*v1.PieceBytes]) {
			t.Error("the data piece is not held as fetched")
		}
	}
	if !bytes.Equal(zeroPiece(), make([]byte, v1.PieceBytes)) {
		t.Error("the shared zero buffer was written to")
	}
}
