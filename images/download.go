package images

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Errors returned by downloads.
var (
	// ErrTooManyRedirects: the server redirected more than Config.MaxRedirects times.
	ErrTooManyRedirects = errors.New("too many redirects")
	// ErrInsecureRedirect: an https URL redirected to plain http.
	ErrInsecureRedirect = errors.New("redirect from https to http refused")
	// ErrStalled: no body bytes arrived for Config.StallTimeout; retried.
	ErrStalled = errors.New("download stalled")
	// ErrFileURL: a file:// URL was given but Config.AllowFileURLs is false.
	ErrFileURL = errors.New("file URLs not allowed")
	// ErrTooLarge: a checksum file exceeded MaxChecksumFileBytes.
	ErrTooLarge = errors.New("response too large")
)

// StatusError is a non-success HTTP answer. Retryable tells whether the
// download loop retries it (408, 429, 5xx); RetryAfter is the server's
// Retry-After (RFC 9110 section 10.2.3), zero when absent.
type StatusError struct {
	URL        string // redacted: no userinfo, no query
	Code       int
	RetryAfter time.Duration
}

// Error renders "GET <redacted url>: HTTP <code> <text>".
func (e *StatusError) Error() string {
	return fmt.Sprintf("GET %s: HTTP %d %s", e.URL, e.Code, http.StatusText(e.Code))
}

// Retryable reports whether the status is worth another attempt.
func (e *StatusError) Retryable() bool {
	return e.Code == http.StatusRequestTimeout || e.Code == http.StatusTooManyRequests || e.Code >= 500
}

// redact removes userinfo, query and fragment from a URL for logs and errors.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<invalid url>"
	}
	u.User = nil
	u.RawQuery = ""
	u.ForceQuery = false
	u.Fragment = ""
	return u.String()
}

// unwrapURLError drops net/http's *url.Error wrapper, which repeats the
// method and the unredacted URL (query included); callers name the redacted
// URL themselves.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP-date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 {
			return 0
		}
		if s > 86400 {
			s = 86400
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// newHTTPClient returns the client used for downloads: the caller's (copied)
// or a default one, with the redirect policy applied.
func newHTTPClient(base *http.Client, maxRedirects int) *http.Client {
	var c http.Client
	if base != nil {
		c = *base
	} else {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.ResponseHeaderTimeout = 60 * time.Second
		// Compressed transfer would defeat Range resumption and byte counts.
		tr.DisableCompression = true
		c.Transport = tr
	}
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) > maxRedirects {
			return fmt.Errorf("%w (%d)", ErrTooManyRedirects, maxRedirects)
		}
		if len(via) > 0 && via[len(via)-1].URL.Scheme == "https" && req.URL.Scheme != "https" {
			return ErrInsecureRedirect
		}
		return nil
	}
	return &c
}

// partMeta is the resume information stored next to a partial download.
type partMeta struct {
	URL          string `json:"url"` // redacted, for humans
	Expected     Digest `json:"expected"`
	ETag         string `json:"etag,omitempty"`
	LastModified string `json:"lastModified,omitempty"`
	Total        int64  `json:"total"` // -1 unknown
}

// transfer is one download of a URL into a partial file, resumable.
type transfer struct {
	im       *Importer
	url      string
	f        *os.File // positioned at off
	off      int64
	hashes   []hash.Hash
	meta     *partMeta
	saveMeta func() error
	prog     *progressMeter
	poke     func() // resets the stall timer; nil for local files
}

// errRestart: the server ignored or mismatched our Range; start over.
var errRestart = errors.New("server did not honour range; restarting from zero")

// run downloads until the whole body is in t.f, retrying transient failures
// with capped, jittered exponential backoff (Retry-After honoured on 429 and
// 503). Attempts that moved bytes reset the failure count, so a link that
// keeps dropping still finishes.
func (t *transfer) run(ctx context.Context) error {
	failures := 0
	for {
		before := t.off
		err := t.once(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var se *StatusError
		retryable := true
		var wait time.Duration
		switch {
		case errors.As(err, &se):
			retryable = se.Retryable()
			wait = se.RetryAfter
		case errors.Is(err, ErrTooManyRedirects), errors.Is(err, ErrInsecureRedirect), errors.Is(err, errLocal):
			retryable = false
		}
		if !retryable {
			return err
		}
		if t.off > before {
			failures = 0
		}
		failures++
		if failures >= t.im.maxAttempts {
			return fmt.Errorf("after %d attempts: %w", failures, err)
		}
		if wait == 0 || errors.Is(err, errRestart) {
			wait = t.im.backoff(failures)
		}
		if wait > t.im.maxRetryAfter {
			wait = t.im.maxRetryAfter
		}
		t.im.log.Warn("image download retry", "url", redact(t.url), "offset", t.off, "wait", wait, "err", err)
		if err := t.im.sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// errLocal marks local I/O failures, which are not retried.
var errLocal = errors.New("local i/o")

// once makes one request and copies its body.
func (t *transfer) once(ctx context.Context) error {
	if strings.HasPrefix(t.url, "file://") {
		return t.onceFile()
	}
	// A body that stops moving for StallTimeout cancels this attempt only;
	// the retry resumes with Range.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stall := time.AfterFunc(t.im.stallTimeout, func() { cancel(ErrStalled) })
	defer stall.Stop()
	t.poke = func() { stall.Reset(t.im.stallTimeout) }
	defer func() { t.poke = nil }()
	req, err := t.request(ctx)
	if err != nil {
		return err
	}
	resp, err := t.im.client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", redact(t.url), unwrapURLError(err))
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		if t.off > 0 {
			t.im.log.Info("image download restarts from zero", "url", redact(t.url), "had", t.off)
			if err := t.reset(); err != nil {
				return err
			}
		}
		t.meta.Total = resp.ContentLength
	case http.StatusPartialContent:
		start, total, ok := parseContentRange(resp.Header.Get("Content-Range"))
		// A server that ignored If-Range but names a different ETag is
		// sending bytes of another file.
		et := resp.Header.Get("ETag")
		changed := t.meta.ETag != "" && et != "" && et != t.meta.ETag
		if !ok || start != t.off || changed {
			if err := t.reset(); err != nil {
				return err
			}
			return errRestart
		}
		t.meta.Total = total
	case http.StatusRequestedRangeNotSatisfiable:
		// We already hold every byte (a crash after the download finished).
		_, total, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if t.off > 0 && ((ok && total == t.off) || (!ok && t.meta.Total == t.off)) {
			return nil
		}
		if err := t.reset(); err != nil {
			return err
		}
		return errRestart
	default:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return &StatusError{URL: redact(t.url), Code: resp.StatusCode,
			RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	}
	if et := resp.Header.Get("ETag"); et != "" {
		t.meta.ETag = et
	}
	if lm := resp.Header.Get("Last-Modified"); lm != "" {
		t.meta.LastModified = lm
	}
	if err := t.saveMeta(); err != nil {
		return fmt.Errorf("%w: %w", errLocal, err)
	}
	t.prog.setTotal(t.meta.Total)
	if err := t.copy(resp.Body); err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, ErrStalled) {
			return fmt.Errorf("GET %s: %w after %v at byte %d", redact(t.url), ErrStalled, t.im.stallTimeout, t.off)
		}
		return err
	}
	return nil
}

// request is the GET of t.url: identity encoding, and from t.off on a
// resumed download, with If-Range (a strong ETag, else Last-Modified) so
// a changed file comes back whole (200) instead of two versions spliced
// together.
func (t *transfer) request(ctx context.Context) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: build request: %w", errLocal, err)
	}
	req.Header.Set("User-Agent", "machina-images/1")
	req.Header.Set("Accept-Encoding", "identity")
	if t.off > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", t.off))
		// If-Range makes a changed file come back whole (200) instead of
		// splicing two versions together. Weak ETags are not allowed here.
		if t.meta.ETag != "" && !strings.HasPrefix(t.meta.ETag, "W/") {
			req.Header.Set("If-Range", t.meta.ETag)
		} else if t.meta.LastModified != "" {
			req.Header.Set("If-Range", t.meta.LastModified)
		}
	}
	return req, nil
}

// onceFile copies from a local file:// URL, resuming at t.off.
func (t *transfer) onceFile() error {
	u, err := url.Parse(t.url)
	if err != nil {
		return fmt.Errorf("%w: %w", errLocal, err)
	}
	src, err := os.Open(u.Path)
	if err != nil {
		return fmt.Errorf("%w: open source: %w", errLocal, err)
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return fmt.Errorf("%w: %w", errLocal, err)
	}
	if t.off > st.Size() {
		if err := t.reset(); err != nil {
			return err
		}
	}
	if _, err := src.Seek(t.off, io.SeekStart); err != nil {
		return fmt.Errorf("%w: %w", errLocal, err)
	}
	t.meta.Total = st.Size()
	t.prog.setTotal(st.Size())
	if err := t.copy(src); err != nil {
		return fmt.Errorf("%w: %w", errLocal, err)
	}
	return nil
}

// copyBufSize is the read/write chunk: large enough for throughput, small
// enough that memory stays flat whatever the image size.
const copyBufSize = 1 << 20

// copyBuffers is how many chunks may be in flight between reading and
// writing; memory use is copyBuffers × copyBufSize whatever the image size.
const copyBuffers = 4

// writebackChunk is how much is written before asking the kernel to start
// writing it back (see startWriteback).
const writebackChunk = 16 << 20

// copy appends r to the part file and hashes the same bytes. Hashing (here)
// and writing (a second goroutine) overlap, so an import runs at the speed
// of the slower of the two rather than their sum. On return every hashed
// byte has been handed to write(2), so t.off matches the file unless the
// error wraps errLocal (not retried).
func (t *transfer) copy(r io.Reader) (err error) {
	type chunk struct{ b []byte }
	free := make(chan []byte, copyBuffers)
	for range copyBuffers {
		free <- make([]byte, copyBufSize)
	}
	todo := make(chan chunk, copyBuffers)
	var werr error
	done := make(chan struct{})
	start := t.off
	go func() {
		defer close(done)
		pos, flushed := start, start
		for c := range todo {
			if werr == nil {
				if _, e := t.f.Write(c.b); e != nil {
					werr = e
				}
				pos += int64(len(c.b))
				if pos-flushed >= writebackChunk {
					startWriteback(t.f, flushed, pos-flushed)
					flushed = pos
				}
			}
			free <- c.b[:cap(c.b)]
		}
	}()
	defer func() {
		close(todo)
		<-done
		if werr != nil {
			err = fmt.Errorf("%w: write part: %w", errLocal, werr)
		}
	}()
	for {
		buf := <-free
		n, rerr := fill(r, buf)
		if n > 0 {
			for _, h := range t.hashes {
				h.Write(buf[:n])
			}
			todo <- chunk{buf[:n]}
			t.off += int64(n)
			t.prog.update(t.off)
			if t.poke != nil {
				t.poke()
			}
		} else {
			free <- buf
		}
		if errors.Is(rerr, io.EOF) {
			if t.meta.Total >= 0 && t.off < t.meta.Total {
				return fmt.Errorf("body ended at %d of %d: %w", t.off, t.meta.Total, io.ErrUnexpectedEOF)
			}
			return nil
		}
		if rerr != nil {
			return fmt.Errorf("read body at %d: %w", t.off, rerr)
		}
	}
}

// fill reads into buf until it is full or r returns an error (io.EOF at the
// end), so small network reads travel as large chunks.
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		k, err := r.Read(buf[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// reset truncates the part file and hash state to zero bytes.
func (t *transfer) reset() error {
	if err := t.f.Truncate(0); err != nil {
		return fmt.Errorf("%w: truncate part: %w", errLocal, err)
	}
	if _, err := t.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("%w: %w", errLocal, err)
	}
	for _, h := range t.hashes {
		h.Reset()
	}
	t.off = 0
	t.meta.ETag, t.meta.LastModified = "", ""
	t.prog.update(0)
	return nil
}

// parseContentRange reads "bytes START-END/TOTAL" (RFC 9110 section 14.4)
// or "bytes */TOTAL". total is -1 when "*".
func parseContentRange(v string) (start, total int64, ok bool) {
	rest, found := strings.CutPrefix(strings.TrimSpace(v), "bytes ")
	if !found {
		return 0, 0, false
	}
	rng, tot, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, false
	}
	total = -1
	if tot != "*" {
		n, err := strconv.ParseInt(tot, 10, 64)
		if err != nil || n < 0 {
			return 0, 0, false
		}
		total = n
	}
	if rng == "*" {
		return 0, total, true
	}
	s, _, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, 0, false
	}
	return n, total, true
}

// backoff returns the wait before retry n (1-based): base·2^(n-1) capped at
// BackoffMax, with the upper half jittered.
func (im *Importer) backoff(n int) time.Duration {
	d := im.backoffBase
	for i := 1; i < n && d < im.backoffMax; i++ {
		d *= 2
	}
	if d > im.backoffMax {
		d = im.backoffMax
	}
	half := d / 2
	if half <= 0 {
		return d
	}
	return half + rand.N(half+1)
}

// fetchSmall GETs a small document (a checksum file) with the same retry
// policy, refusing bodies over limit bytes.
func (im *Importer) fetchSmall(ctx context.Context, rawURL string, limit int64) ([]byte, error) {
	if strings.HasPrefix(rawURL, "file://") {
		u, err := url.Parse(rawURL)
		if err != nil {
			return nil, fmt.Errorf("fetch %s: %w", redact(rawURL), err)
		}
		f, err := os.Open(u.Path)
		if err != nil {
			return nil, fmt.Errorf("fetch %s: %w", redact(rawURL), err)
		}
		defer f.Close()
		return readLimited(f, limit, rawURL)
	}
	failures := 0
	for {
		body, err := im.fetchSmallOnce(ctx, rawURL, limit)
		if err == nil {
			return body, nil
		}
		var se *StatusError
		wait := time.Duration(0)
		if errors.As(err, &se) {
			if !se.Retryable() {
				return nil, err
			}
			wait = se.RetryAfter
		}
		if errors.Is(err, ErrTooLarge) || errors.Is(err, ErrTooManyRedirects) || errors.Is(err, ErrInsecureRedirect) || ctx.Err() != nil {
			return nil, err
		}
		failures++
		if failures >= im.maxAttempts {
			return nil, fmt.Errorf("after %d attempts: %w", failures, err)
		}
		if wait == 0 {
			wait = im.backoff(failures)
		}
		wait = min(wait, im.maxRetryAfter)
		im.log.Warn("checksum file retry", "url", redact(rawURL), "wait", wait, "err", err)
		if err := im.sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

func (im *Importer) fetchSmallOnce(ctx context.Context, rawURL string, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", redact(rawURL), err)
	}
	req.Header.Set("User-Agent", "machina-images/1")
	resp, err := im.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", redact(rawURL), unwrapURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, &StatusError{URL: redact(rawURL), Code: resp.StatusCode,
			RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	}
	return readLimited(resp.Body, limit, rawURL)
}

func readLimited(r io.Reader, limit int64, rawURL string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", redact(rawURL), err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("fetch %s: %w (over %d bytes)", redact(rawURL), ErrTooLarge, limit)
	}
	return b, nil
}

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tm.C:
		return nil
	}
}
