package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// errBadPeer: a wave peer served a piece whose SHA-256 differs from the
// manifest after it had already served pieces this deploy used. Its pieces
// are dropped and the image stream starts again (transientFetch), so
// nothing it sent reaches the write.
var errBadPeer = errors.New("wave peer served a bad piece")

// PieceSet holds the verified pieces of the image being deployed: what the
// agent writes and what it serves to its wave. Safe for concurrent use.
type PieceSet struct {
	man     v1.PieceManifest
	mu      sync.Mutex
	arrived chan struct{} // closed (and replaced) when a piece is put
	data    [][]byte
	from    []string // where each held piece came from ("" the controller)
}

// NewPieceSet returns an empty set for manifest m, checking that m's piece
// count and hashes are well-formed.
func NewPieceSet(m v1.PieceManifest) (*PieceSet, error) {
	if m.PieceBytes <= 0 || m.SizeBytes <= 0 || len(m.SHA256) != 64 {
		return nil, fmt.Errorf("piece manifest: bad piece size %d, image size %d or digest", m.PieceBytes, m.SizeBytes)
	}
	if want := (m.SizeBytes + m.PieceBytes - 1) / m.PieceBytes; int64(len(m.Pieces)) != want {
		return nil, fmt.Errorf("piece manifest: %d pieces for %d bytes, want %d", len(m.Pieces), m.SizeBytes, want)
	}
	for i, h := range m.Pieces {
		if len(h) != 64 {
			return nil, fmt.Errorf("piece manifest: piece %d: hash %q is not sha256 hex", i, h)
		}
	}
	return &PieceSet{man: m, arrived: make(chan struct{}), data: make([][]byte, len(m.Pieces)), from: make([]string, len(m.Pieces))}, nil
}

// span returns piece i's byte offset and length.
func (s *PieceSet) span(i int) (int64, int64) {
	off := int64(i) * s.man.PieceBytes
	return off, min(s.man.PieceBytes, s.man.SizeBytes-off)
}

// check reports whether b is piece i of the manifest.
func (s *PieceSet) check(i int, b []byte) bool {
	if _, n := s.span(i); int64(len(b)) != n {
		return false
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]) == strings.ToLower(s.man.Pieces[i])
}

func (s *PieceSet) get(i int) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data[i]
}

// zeroPiece backs every all-zero piece a PieceSet holds (put); nothing
// writes to a held piece. Made on first use: the package is also linked
// into the controller (the simulated lab), whose heap should not carry
// 4 MiB it never reads.
var zeroPiece = sync.OnceValue(func() []byte { return make([]byte, v1.PieceBytes) })

// put keeps verified piece i, got from from. An all-zero piece (the free
// space of a raw OS image, often a third of it or more) is kept as a
// slice of one shared zero buffer, so the set's memory is that of the
// image's data; it was still fetched and checked like any other piece.
func (s *PieceSet) put(i int, b []byte, from string) {
	if z := zeroPiece(); len(b) <= len(z) && bytes.Equal(b, z[:len(b)]) {
		b = z[:len(b):len(b)]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.data[i] == nil {
		s.data[i], s.from[i] = b, from
		close(s.arrived)
		s.arrived = make(chan struct{})
	}
}

// evict drops every piece that came from peer and returns how many.
func (s *PieceSet) evict(peer string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for i := range s.data {
		if s.data[i] != nil && s.from[i] == peer {
			s.data[i], s.from[i] = nil, ""
			n++
		}
	}
	return n
}

// wait returns piece i once held, or nil when ctx ends first.
func (s *PieceSet) wait(ctx context.Context, i int) []byte {
	for {
		s.mu.Lock()
		b, ch := s.data[i], s.arrived
		s.mu.Unlock()
		if b != nil {
			return b
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil
		}
	}
}

// PeerServer serves the pieces of the agent's current deploy to the other
// members of its wave: GET v1.PeerPiecePath<sha256>/<index> with
// "Authorization: Bearer <wave token>". Answers: 200 with the piece (only
// pieces already verified against the manifest), 403 for a missing or
// wrong token or another image's digest (a machine outside the wave gets
// nothing), 404 for an index out of range or a piece not held within Hold,
// 405 for other methods. Safe for concurrent use; mount it on a listener
// the wave can reach and pass its port as Runner.PiecePort.
type PeerServer struct {
	// Hold is how long a request for a piece this agent is still fetching
	// waits for it; zero means 5s. Members name only earlier members as
	// peers, so waits never form a cycle.
	Hold time.Duration

	mu    sync.Mutex
	set   *PieceSet
	token string
}

// Offer starts serving set to requests carrying token (replacing any
// earlier deploy's set).
func (p *PeerServer) Offer(set *PieceSet, token string) {
	p.mu.Lock()
	p.set, p.token = set, token
	p.mu.Unlock()
}

// ServeHTTP implements http.Handler; see [PeerServer].
func (p *PeerServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	p.mu.Lock()
	set, token := p.set, p.token
	p.mu.Unlock()
	got, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if set == nil || token == "" || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, v1.PeerPiecePath)
	digest, idx, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || !strings.EqualFold(digest, set.man.SHA256) {
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	i, err := strconv.Atoi(idx)
	if err != nil || i < 0 || i >= len(set.data) {
		http.NotFound(w, r)
		return
	}
	hold := p.Hold
	if hold == 0 {
		hold = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(r.Context(), hold)
	defer cancel()
	b := set.wait(ctx, i)
	if b == nil {
		http.Error(w, "piece not held yet", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

// PieceFetcher gets the pieces of one image: from the wave's peers first,
// from the controller's image URL (an HTTP Range request per piece) when no
// peer has it, and checks every piece against the manifest before keeping
// it. Its Open is the deploy's ImageOpener; WriteImage still checks the
// whole image's digest before a byte reaches the disk.
type PieceFetcher struct {
	Set *PieceSet
	// ImageURL and ImageToken reach the controller's copy.
	ImageURL, ImageToken string
	// WaveToken is presented to Peers (base URLs).
	WaveToken string
	Peers     []string
	// HTTP is the client for peers and controller; nil means
	// http.DefaultClient. PeerTimeout bounds one peer request, body
	// included (zero: 30s).
	HTTP        *http.Client
	PeerTimeout time.Duration
	// StallTimeout aborts a peer or controller request whose response
	// delivers no bytes for this long (zero: DefaultStallTimeout). A peer
	// that stalls or times out, or cannot be connected to (refused, no
	// route, connect timeout), is skipped for the rest of the deploy and
	// named in Stats().DroppedPeers; a controller request is asked again.
	StallTimeout time.Duration
	// Attempts bounds the controller requests for one piece (zero: the
	// whole-image download's bound, 20). A failed or stalled request that
	// transientFetch calls transient is asked again after a doubling
	// delay (250 ms to 5 s, as the whole-image download); the last
	// failure fails the fetch, naming the piece, the URL and the
	// attempts, and the deploy with it.
	Attempts int
	// RetryWithin bounds those requests in time too: none starts later
	// than RetryWithin after the piece's first request (retryWithin of
	// the plan), so the piece fails at most RetryWithin plus a stall
	// after it; zero: no time bound.
	RetryWithin time.Duration
	// OnRetry, when set, is told each retry of a controller request,
	// naming the piece, the cause and the retry ("piece 12 of 64:
	// controller request stalled for 1m0s, retry 3 of 19 in 2s");
	// ProgressMeter.Retrying reports it to the controller.
	OnRetry func(msg string)
	Logger  *slog.Logger

	mu      sync.Mutex
	dropped map[string]bool // peers not asked again this deploy
	stats   v1.PieceStats
}

// Stats returns where the fetched bytes came from so far.
func (f *PieceFetcher) Stats() v1.PieceStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.stats
	s.BadPeers = append([]string(nil), s.BadPeers...)
	s.DroppedPeers = append([]v1.DroppedPeer(nil), s.DroppedPeers...)
	return s
}

func (f *PieceFetcher) client() *http.Client {
	if f.HTTP != nil {
		return f.HTTP
	}
	return http.DefaultClient
}

func (f *PieceFetcher) log() *slog.Logger {
	if f.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return f.Logger
}

// Open implements ImageOpener: a stream of the image, piece by piece.
func (f *PieceFetcher) Open(ctx context.Context) (io.ReadCloser, error) {
	return &pieceReader{f: f, ctx: ctx}, nil
}

type pieceReader struct {
	f   *PieceFetcher
	ctx context.Context
	i   int
	cur []byte
}

func (r *pieceReader) Read(p []byte) (int, error) {
	if len(r.cur) == 0 {
		if r.i == len(r.f.Set.data) {
			return 0, io.EOF
		}
		b, err := r.f.piece(r.ctx, r.i)
		if err != nil {
			return 0, err
		}
		r.cur = b
		r.i++
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

func (r *pieceReader) Close() error { return nil }

// piece returns verified piece i: held, else from a peer, else from the
// controller.
func (f *PieceFetcher) piece(ctx context.Context, i int) ([]byte, error) {
	if b := f.Set.get(i); b != nil {
		return b, nil
	}
	for k := range f.Peers {
		peer := f.Peers[(i+k)%len(f.Peers)] // spread the pieces over the peers
		f.mu.Lock()
		dropped := f.dropped[peer]
		f.mu.Unlock()
		if dropped {
			continue
		}
		b, err := f.fromPeer(ctx, peer, i)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("piece %d: %w", i, ctx.Err())
			}
			if connectFailed(err) {
				// Nothing listens there (the machine left the wave or
				// rebooted) or it cannot be reached: every later piece
				// would fail the same way, each costing a connect.
				f.losePeer(peer, v1.PeerUnreachable)
				f.log().Warn("wave peer unreachable; not asked again this deploy", "peer", peer, "piece", i, "err", err)
				continue
			}
			if errors.Is(err, errStalled) || errors.Is(err, context.DeadlineExceeded) {
				// A peer that stopped sending holds every piece asked of
				// it for the timeout: ask the others and the controller.
				f.losePeer(peer, v1.PeerStalled)
				f.log().Warn("wave peer stalled; not asked again this deploy", "peer", peer, "piece", i, "err", err)
				continue
			}
			f.log().Debug("piece not from peer", "peer", peer, "piece", i, "err", err)
			continue
		}
		if !f.Set.check(i, b) {
			if f.dropPeer(peer, i) {
				return nil, fmt.Errorf("piece %d from %s: %w", i, peer, errBadPeer)
			}
			continue
		}
		f.Set.put(i, b, peer)
		f.mu.Lock()
		f.stats.PeerBytes += int64(len(b))
		f.mu.Unlock()
		return b, nil
	}
	b, err := f.fromController(ctx, i)
	if err != nil {
		return nil, err
	}
	if !f.Set.check(i, b) {
		return nil, fmt.Errorf("piece %d from the controller: %w", i, ErrChecksum)
	}
	f.Set.put(i, b, "")
	f.mu.Lock()
	f.stats.ControllerBytes += int64(len(b))
	f.mu.Unlock()
	return b, nil
}

// dropPeer records peer as bad for the rest of the deploy and drops the
// pieces it sent; it reports whether any of them had been used.
func (f *PieceFetcher) dropPeer(peer string, i int) bool {
	f.skipPeer(peer)
	f.mu.Lock()
	f.stats.BadPeers = append(f.stats.BadPeers, peer)
	f.mu.Unlock()
	n := f.Set.evict(peer)
	f.log().Warn("wave peer served a bad piece; dropped for this deploy", "peer", peer, "piece", i, "piecesDropped", n)
	return n > 0
}

// losePeer stops asking peer for the rest of the deploy and records why
// (Stats().DroppedPeers).
func (f *PieceFetcher) losePeer(peer, reason string) {
	f.skipPeer(peer)
	f.mu.Lock()
	f.stats.DroppedPeers = append(f.stats.DroppedPeers, v1.DroppedPeer{Peer: peer, Reason: reason})
	f.mu.Unlock()
}

// connectFailed reports whether err is a failure to connect (refused, no
// route to the host or network, the dialer's connect timeout), not one of
// a connection that was made.
func connectFailed(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial" ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}

// skipPeer stops asking peer for the rest of the deploy.
func (f *PieceFetcher) skipPeer(peer string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dropped == nil {
		f.dropped = map[string]bool{}
	}
	f.dropped[peer] = true
}

// fromPeer GETs piece i from peer with the wave token.
func (f *PieceFetcher) fromPeer(ctx context.Context, peer string, i int) ([]byte, error) {
	to := f.PeerTimeout
	if to == 0 {
		to = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	u := strings.TrimRight(peer, "/") + v1.PeerPiecePath + f.Set.man.SHA256 + "/" + strconv.Itoa(i)
	_, n := f.Set.span(i)
	return f.get(ctx, u, f.WaveToken, "", n, http.StatusOK)
}

// pieceFailure is the controller fallback giving up on a piece: the last
// error and how many requests were made. It is final for the deploy
// (transientFetch): the requests were already retried.
type pieceFailure struct {
	piece    int
	url      string // redacted
	attempts int
	err      error
	// elapsed and bound, when bound is set, say that the time bound
	// (RetryWithin) ended the retries, and after how long.
	elapsed time.Duration
	bound   string
}

func (e *pieceFailure) Error() string {
	times := "attempts"
	if e.attempts == 1 {
		times = "attempt"
	}
	if e.bound != "" {
		return fmt.Sprintf("get piece %d from %s: gave up after %d %s in %v (%s): %v", e.piece, e.url, e.attempts, times, e.elapsed.Round(time.Millisecond), e.bound, e.err)
	}
	return fmt.Sprintf("get piece %d from %s: gave up after %d %s: %v", e.piece, e.url, e.attempts, times, e.err)
}

func (e *pieceFailure) Unwrap() error { return e.err }

// fromController GETs piece i's byte range of the image URL, asking again
// after a transient failure (transientFetch: unreachable, reset, 502/503/
// 504, cut short, stalled for StallTimeout) with doubling delays, at most
// Attempts times and within RetryWithin, telling OnRetry of each retry; a
// refusal (403, 404, 416) is final at once.
func (f *PieceFetcher) fromController(ctx context.Context, i int) ([]byte, error) {
	off, n := f.Set.span(i)
	rng := fmt.Sprintf("bytes=%d-%d", off, off+n-1)
	pol := retryPolicy{attempts: f.Attempts, within: f.RetryWithin, stall: stallTimeoutOr(f.StallTimeout), note: f.OnRetry}
	delay, first := retryBase, time.Now()
	for attempt := 1; ; attempt++ {
		b, err := f.get(ctx, f.ImageURL, f.ImageToken, rng, n, http.StatusPartialContent)
		if err == nil && int64(len(b)) < n {
			err = fmt.Errorf("get piece: %w: %d of %d bytes", errStreamEnded, len(b), n)
		}
		if err == nil {
			return b, nil
		}
		if !transientFetch(err) || ctx.Err() != nil {
			return nil, &pieceFailure{piece: i, url: redactURL(f.ImageURL), attempts: attempt, err: err}
		}
		if why, stop := pol.giveUp(attempt, first, delay); stop {
			return nil, &pieceFailure{piece: i, url: redactURL(f.ImageURL), attempts: attempt, err: err, elapsed: time.Since(first), bound: why}
		}
		f.log().Warn("image piece request failed; asking again", "piece", i, "url", redactURL(f.ImageURL),
			"attempt", attempt, "attempts", pol.limit(), "err", err, "delay", delay.String())
		pol.retrying(fmt.Sprintf("piece %d of %d", i, len(f.Set.data)), attempt, delay, err)
		if !backoff(ctx, &delay) {
			return nil, &pieceFailure{piece: i, url: redactURL(f.ImageURL), attempts: attempt, err: err}
		}
	}
}

// get reads at most n+1 bytes of u's body and fails unless it answered
// status; the length is checked with the hash by the caller. A response
// that delivers no bytes for StallTimeout is errStalled; a body cut short
// is errStreamEnded. Errors name u without its query (redactURL).
func (f *PieceFetcher) get(ctx context.Context, u, token, rng string, n int64, status int) ([]byte, error) {
	body, err := openStalling(ctx, stallTimeoutOr(f.StallTimeout), func(ctx context.Context) (io.ReadCloser, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		resp, err := f.client().Do(req)
		if err != nil {
			if ue := (*url.Error)(nil); errors.As(err, &ue) {
				ue.URL = redactURL(ue.URL)
			}
			return nil, err
		}
		if resp.StatusCode != status {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			return nil, &v1.AgentStatusError{Op: "get piece", Code: resp.StatusCode, Body: string(bytes.TrimSpace(b))}
		}
		return resp.Body, nil
	})
	if err != nil {
		return nil, fmt.Errorf("get piece: %w", err)
	}
	defer body.Close()
	b, err := io.ReadAll(io.LimitReader(body, n+1))
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = fmt.Errorf("%w: %w", errStreamEnded, err)
	}
	if err != nil {
		return nil, fmt.Errorf("get piece: %w", err)
	}
	return b, nil
}

// usePieces sets w.Open to fetch the image piece by piece from the wave
// (its controller retries bounded by the plan's SilentAfter and noted on
// meter)
// when the plan has a piece manifest and a wave, the agent a PeerServer and
// the image fits in memLimit (the pieces are held in memory to be served,
// beside the write's own buffer); otherwise w keeps its whole-image opener.
// The returned func, run when the deploy ends, puts where the bytes came
// from into res. A manifest that contradicts the plan fails the deploy
// (through w.Open) before anything is fetched.
func (r *Runner) usePieces(plan v1.Plan, memLimit int64, w *WriteConfig, res *v1.DeployResult, meter *ProgressMeter) func() {
	if plan.Pieces == nil || plan.Wave == nil || r.Pieces == nil || plan.ImageSizeBytes > memLimit {
		return func() {}
	}
	set, err := NewPieceSet(*plan.Pieces)
	if err == nil && (plan.Pieces.SizeBytes != plan.ImageSizeBytes || !strings.EqualFold(plan.Pieces.SHA256, plan.ImageSHA256)) {
		err = fmt.Errorf("piece manifest names %d bytes sha256 %s, the plan %d bytes %s", plan.Pieces.SizeBytes, plan.Pieces.SHA256, plan.ImageSizeBytes, plan.ImageSHA256)
	}
	if err != nil {
		w.Open = func(context.Context) (io.ReadCloser, error) { return nil, err }
		return func() {}
	}
	r.Pieces.Offer(set, plan.Wave.Token)
	peers := plan.Wave.Peers
	if len(peers) > v1.MaxWavePeers {
		peers = peers[:v1.MaxWavePeers]
	}
	f := &PieceFetcher{Set: set, ImageURL: plan.ImageURL, ImageToken: plan.ImageToken, WaveToken: plan.Wave.Token, Peers: peers, HTTP: r.Client.HTTP,
		StallTimeout: r.StallTimeout, Attempts: r.ImageAttempts, RetryWithin: retryWithin(plan), Logger: r.log(),
		OnRetry: func(msg string) { meter.Retrying(msg, plan.ImageSizeBytes) }}
	r.log().Info("sharing image pieces with the wave", "wave", plan.Wave.ID, "peers", len(peers), "pieces", len(plan.Pieces.Pieces))
	w.Open = f.Open
	return func() {
		s := f.Stats()
		if plan.SilentAfter <= 0 {
			s.DroppedPeers = nil // an older controller refuses the field
		}
		res.Pieces = &s
	}
}
