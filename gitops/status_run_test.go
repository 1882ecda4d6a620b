package gitops

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"gopkg.in/yaml.v3"
)

// TestStatusRunBatching checks Run's timing with a recording writeFn in a
// synctest bubble: the first snapshot at once, then at most one write per
// Interval carrying the newest snapshot, urgent ones at once, and a failed
// write retried with backoff.
func TestStatusRunBatching(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &StatusWriter{cfg: StatusConfig{Interval: 30 * time.Second}, wake: make(chan struct{}, 1)}
		type call struct {
			at  time.Duration
			tag string
		}
		var mu sync.Mutex
		var calls []call
		fail := false
		start := time.Now()
		w.writeFn = func(_ context.Context, s Snapshot) (WriteResult, error) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, call{time.Since(start), s.Servers[0].Lifecycle})
			if fail {
				return WriteResult{}, errors.New("push failed")
			}
			return WriteResult{Commit: "x"}, nil
		}
		snap := func(tag string) Snapshot { return Snapshot{Servers: []ServerStatus{{Name: "n", Lifecycle: tag}}} }
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- w.Run(ctx) }()

		w.Update(snap("a"), false) // t=0: written at once
		synctest.Wait()
		time.Sleep(time.Second)
		w.Update(snap("b"), false) // batched with c
		time.Sleep(5 * time.Second)
		w.Update(snap("c"), false) // written at t=30s
		time.Sleep(40 * time.Second)
		w.Update(snap("d"), true) // urgent: at once (t=46s)
		synctest.Wait()
		time.Sleep(time.Second)
		mu.Lock()
		fail = true
		mu.Unlock()
		w.Update(snap("e"), true) // t=47s fails; retried after backoff
		synctest.Wait()
		mu.Lock()
		fail = false
		mu.Unlock()
		time.Sleep(2 * time.Minute)
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		want := []string{"a", "c", "d", "e", "e"}
		var got []string
		for _, c := range calls {
			got = append(got, c.tag)
		}
		if len(got) < len(want) {
			t.Fatalf("writes = %+v, want tags %v", calls, want)
		}
		for i, tag := range want {
			if got[i] != tag {
				t.Fatalf("writes = %+v, want tags %v", calls, want)
			}
		}
		if calls[0].at != 0 || calls[1].at != 30*time.Second || calls[2].at != 46*time.Second || calls[3].at != 47*time.Second {
			t.Errorf("write times = %+v, want 0s, 30s, 46s, 47s", calls)
		}
		if d := calls[4].at - calls[3].at; d < 27*time.Second || d > 33*time.Second {
			t.Errorf("retry after %v, want the interval ±10%%", d)
		}
		// After the successful retry nothing is pending.
		if len(calls) != 5 {
			t.Errorf("extra writes: %+v", calls[5:])
		}
	})
}

// TestStatusRunBuildsAtWriteTime: with UpdateFrom the snapshot is built
// only when Run writes it: build functions replaced before the interval
// ends are never called, the newest is called once per write, and a
// failed build is logged and retried like a failed write.
func TestStatusRunBuildsAtWriteTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &StatusWriter{cfg: StatusConfig{Interval: 30 * time.Second}, wake: make(chan struct{}, 1), log: slog.New(slog.DiscardHandler)}
		var mu sync.Mutex
		var built, written []string
		w.writeFn = func(_ context.Context, s Snapshot) (WriteResult, error) {
			mu.Lock()
			defer mu.Unlock()
			written = append(written, s.Servers[0].Lifecycle)
			return WriteResult{Commit: "x"}, nil
		}
		failBuild := false
		builder := func(tag string) func() (Snapshot, error) {
			return func() (Snapshot, error) {
				mu.Lock()
				defer mu.Unlock()
				built = append(built, tag)
				if failBuild {
					return Snapshot{}, errors.New("store closed")
				}
				return Snapshot{Servers: []ServerStatus{{Name: "n", Lifecycle: tag}}}, nil
			}
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- w.Run(ctx) }()

		w.UpdateFrom(builder("a"), false) // t=0: built and written at once
		synctest.Wait()
		for _, tag := range []string{"b", "c", "d"} { // replaced before t=30s: only d is built
			time.Sleep(time.Second)
			w.UpdateFrom(builder(tag), false)
		}
		time.Sleep(40 * time.Second)
		mu.Lock()
		failBuild = true
		mu.Unlock()
		w.UpdateFrom(builder("e"), true) // build fails: retried after backoff
		synctest.Wait()
		mu.Lock()
		failBuild = false
		mu.Unlock()
		time.Sleep(2 * time.Minute)
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if strings.Join(built, ",") != "a,d,e,e" || strings.Join(written, ",") != "a,d,e" {
			t.Errorf("built %v, written %v; want built a,d,e,e and written a,d,e", built, written)
		}
	})
}

// FuzzYAMLScalar: every string renders to a YAML scalar that parses back
// to the same string.
func FuzzYAMLScalar(f *testing.F) {
	for _, s := range []string{"r1-n01", "yes", "0x1F", "1e3", "52:54:00:01:00:01", "a: b", "- x", "\"q\"", "\x00", "é", "~", ".inf", "#x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 1024 {
			return
		}
		doc := "k: " + yamlScalar(s) + "\n"
		var v map[string]string
		if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
			// yaml.v3 refuses some control and invalid UTF-8 bytes
			// that strconv.Quote escapes; those must still be quoted.
			if yamlScalar(s) == s {
				t.Fatalf("plain %q does not parse: %v", s, err)
			}
			return
		}
		if want := strings.ToValidUTF8(s, "\uFFFD"); v["k"] != want {
			t.Fatalf("yamlScalar(%q) = %s parses to %q", s, yamlScalar(s), v["k"])
		}
	})
}
