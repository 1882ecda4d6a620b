package gitops

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestSourceRunBackoff runs Run against an unreachable remote in a synctest
// bubble and checks the waits between polls double from Interval up to
// MaxBackoff (±10% jitter), with one RemoteUnreachable event.
func TestSourceRunBackoff(t *testing.T) {
	missing := "file://" + filepath.Join(t.TempDir(), "missing.git")
	state := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var events []SourceEvent
		s, err := NewSource(SourceConfig{Remote: Remote{URL: missing}, StateDir: state,
			Interval: 30 * time.Second, MaxBackoff: 4 * time.Minute,
			OnEvent: func(e SourceEvent) { mu.Lock(); events = append(events, e); mu.Unlock() }})
		if err != nil {
			t.Fatal(err)
		}
		var polls []time.Duration
		start := time.Now()
		s.pollHook = func() { polls = append(polls, time.Since(start)) }
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- s.Run(ctx) }()
		time.Sleep(15 * time.Minute)
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
		t.Logf("polls at %v, last error %v", polls, s.Err())
		// Waits: 30s, 60s, 120s, 240s, 240s, ... each ±10%.
		want := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 4 * time.Minute}
		if len(polls) < len(want)+1 {
			t.Fatalf("polls at %v, want at least %d", polls, len(want)+1)
		}
		for i, w := range want {
			got := polls[i+1] - polls[i]
			if got < w*9/10 || got > w*11/10 {
				t.Errorf("wait %d = %v, want %v ±10%%", i+1, got, w)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(events) != 1 || events[0].Kind != SourceRemoteUnreachable {
			t.Errorf("events = %+v, want one RemoteUnreachable", events)
		}
	})
}
