package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/machina-metal/machina/join/node"
)

// TestReachCountsAnyAnswer: the join's network check counts a heartbeat
// the controller refused (429 over its rate) as the path working, and a
// transport error as not; each attempt carries a deadline.
func TestReachCountsAnyAnswer(t *testing.T) {
	refused := fmt.Errorf("node: heartbeat: %w", &node.RefusedError{Status: http.StatusTooManyRequests})
	cut := errors.New("dial tcp 10.77.0.1:443: i/o timeout")
	for _, tc := range []struct {
		beat error
		want error
	}{{nil, nil}, {refused, nil}, {cut, cut}} {
		got := reachBy(func(ctx context.Context) error {
			if _, ok := ctx.Deadline(); !ok {
				t.Error("heartbeat without a deadline")
			}
			return tc.beat
		})(t.Context())
		if !errors.Is(got, tc.want) || (tc.want == nil) != (got == nil) {
			t.Errorf("reach with heartbeat %v = %v, want %v", tc.beat, got, tc.want)
		}
	}
}
