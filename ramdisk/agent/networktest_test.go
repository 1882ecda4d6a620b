package agent

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
)

// shortBody is a payload body that ends after cut of the asked bytes with
// a connection reset, as a controller killed mid-transfer leaves it.
type shortBody struct {
	r io.Reader
}

func (b shortBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

func (shortBody) Close() error { return nil }

// TestNetworkTestRetriesBrokenTransfers: a transfer cut short (an HA
// controller failing over mid-test) is tried again and the machine passes
// when a later try completes; a link that breaks every try fails after
// three; a completed transfer below the minimum rate fails at once.
func TestNetworkTestRetriesBrokenTransfers(t *testing.T) {
	const n = 64 << 10
	payload := func(fails int) (func(context.Context, int64) (io.ReadCloser, error), *int) {
		calls := new(int)
		return func(_ context.Context, want int64) (io.ReadCloser, error) {
			*calls++
			if *calls <= fails {
				return shortBody{strings.NewReader(strings.Repeat("x", int(want)/2))}, nil
			}
			return io.NopCloser(strings.NewReader(strings.Repeat("x", int(want)))), nil
		}, calls
	}
	ctx := context.Background()

	p, calls := payload(1)
	m, err := NetworkTest(ctx, p, n, 0)
	if err != nil || *calls != 2 || m["attempts"] != 2 || m["bytes"] != n {
		t.Fatalf("one broken try: err %v, calls %d, metrics %v; want a pass on the second try", err, *calls, m)
	}

	p, calls = payload(networkTestAttempts)
	m, err = NetworkTest(ctx, p, n, 0)
	if !errors.Is(err, ErrNetwork) || *calls != networkTestAttempts || m["attempts"] != networkTestAttempts {
		t.Fatalf("every try broken: err %v, calls %d, metrics %v; want ErrNetwork after %d tries", err, *calls, m, networkTestAttempts)
	}

	p, calls = payload(0)
	_, err = NetworkTest(ctx, p, n, 1e12)
	if !errors.Is(err, ErrNetwork) || !strings.Contains(err.Error(), "below") || *calls != 1 {
		t.Fatalf("slow link: err %v, calls %d; want one try failing on the rate", err, *calls)
	}
}
