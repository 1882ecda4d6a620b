package images

import (
	"context"
	"net/http"

	"golang.org/x/time/rate"
)

// egressBurst is the token bucket's depth and the largest write paced at
// once: 256 KiB, a few milliseconds at the rates that matter (tens of
// MB/s and up), so the pace is smooth without a syscall per few bytes.
const egressBurst = 256 << 10

// newEgress returns the shared token bucket for bytesPerSecond, or nil
// (unlimited) for zero or less.
func newEgress(bytesPerSecond int64) *rate.Limiter {
	if bytesPerSecond <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(bytesPerSecond), egressBurst)
}

// pacedWriter writes through a token bucket shared by every image
// response, so the handler's total egress stays at the configured rate
// however many machines download at once.
type pacedWriter struct {
	http.ResponseWriter
	ctx context.Context
	lim *rate.Limiter
}

func (p *pacedWriter) Write(b []byte) (int, error) {
	done := 0
	for len(b) > 0 {
		n := min(len(b), egressBurst)
		if err := p.lim.WaitN(p.ctx, n); err != nil {
			return done, err
		}
		k, err := p.ResponseWriter.Write(b[:n])
		done += k
		if err != nil {
			return done, err
		}
		b = b[n:]
	}
	return done, nil
}
