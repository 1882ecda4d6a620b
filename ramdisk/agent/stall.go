package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"time"
)

// DefaultStallTimeout is how long an image or piece response may deliver
// no bytes (before its headers, or within a read of its body) before the
// agent aborts the request and asks again: a dropped connection that the
// kernel never saw close, or a server or proxy that stopped sending
// without closing, otherwise holds the deploy until its session timeout.
// It bounds progress, not length: a slow link that still moves is never
// cut. It matches the agent HTTP client's ResponseHeaderTimeout.
const DefaultStallTimeout = time.Minute

// stallTimeoutOr is d, or DefaultStallTimeout when d is not positive.
func stallTimeoutOr(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return DefaultStallTimeout
}

// errStalled marks a request aborted because its response delivered no
// bytes for the stall timeout; the image stream or piece is asked for
// again (transientFetch).
var errStalled = errors.New("stalled: no bytes received")

// openStalling runs open with a context that is cancelled (cause
// errStalled) when the response delivers no bytes for d: from the request
// until open returns, and within each Read of the returned body. Time
// between Reads (the caller busy with what it read) does not count.
// Closing the body ends the context. An error from open or a Read caused
// by the stall is errStalled naming d.
func openStalling(ctx context.Context, d time.Duration, open func(context.Context) (io.ReadCloser, error)) (io.ReadCloser, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := time.AfterFunc(d, func() { cancel(errStalled) })
	rc, err := open(ctx)
	t.Stop()
	if err != nil {
		err = stallCause(ctx, d, err)
		cancel(nil)
		return nil, err
	}
	return &stallReader{rc: rc, ctx: ctx, d: d, t: t, cancel: cancel}, nil
}

// stallReader is the body openStalling returns.
type stallReader struct {
	rc     io.ReadCloser
	ctx    context.Context
	d      time.Duration
	t      *time.Timer
	cancel context.CancelCauseFunc
}

func (s *stallReader) Read(p []byte) (int, error) {
	s.t.Reset(s.d)
	n, err := s.rc.Read(p)
	s.t.Stop()
	if err != nil && err != io.EOF {
		err = stallCause(s.ctx, s.d, err)
	}
	return n, err
}

func (s *stallReader) Close() error {
	s.t.Stop()
	err := s.rc.Close()
	s.cancel(nil)
	return err
}

// stallCause replaces err by errStalled when ctx ended for a stall.
func stallCause(ctx context.Context, d time.Duration, err error) error {
	if errors.Is(context.Cause(ctx), errStalled) {
		return fmt.Errorf("%w for %v", errStalled, d)
	}
	return err
}

// redactURL is u without user info, query or fragment, for logs and
// errors: the image token travels in the Authorization header, but a URL
// carrying a credential must not put it in a log either.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "<invalid url>"
	}
	p.User, p.RawQuery, p.ForceQuery, p.Fragment = nil, "", false, ""
	return p.String()
}
