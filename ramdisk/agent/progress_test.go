package agent

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"sync"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// TestWriteImageReportsProgress: WriteImage tells Progress how far each
// step is, in order (download, write, read-back), with bytes that never go
// back within a step and end at the image size, in memory mode and in
// two-pass mode; the download counts per read, not per 4 MiB chunk.
func TestWriteImageReportsProgress(t *testing.T) {
	img := make([]byte, 1<<20+4096)
	if _, err := rand.Read(img); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(img)
	for _, tc := range []struct {
		name     string
		memLimit int64
	}{{"memory", 0}, {"two-pass", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			type call struct {
				step        string
				done, total int64
			}
			var calls []call
			dev := &memDev{b: make([]byte, 4<<20)}
			_, err := WriteImage(context.Background(), dev, int64(len(dev.b)), WriteConfig{Open: FileOpener(img), SizeBytes: int64(len(img)),
				SHA256: hex.EncodeToString(sum[:]), MemoryLimit: tc.memLimit, ChunkBytes: 64 << 10, ReadBack: true,
				Progress: func(step string, done, total int64) { calls = append(calls, call{step, done, total}) }})
			if err != nil {
				t.Fatal(err)
			}
			order := []string{v1.StepImageDownload, v1.StepImageWrite, v1.StepImageReadBack}
			last := map[string]int64{}
			stepAt := 0
			for _, c := range calls {
				for stepAt < len(order) && order[stepAt] != c.step {
					stepAt++
				}
				if stepAt == len(order) {
					t.Fatalf("step %s out of order in %v", c.step, calls)
				}
				if c.total != int64(len(img)) || c.done < last[c.step] || c.done > c.total {
					t.Fatalf("call %+v after %d", c, last[c.step])
				}
				last[c.step] = c.done
			}
			for _, s := range order {
				if last[s] != int64(len(img)) {
					t.Errorf("step %s ended at %d bytes, want %d (calls %d)", s, last[s], len(img), len(calls))
				}
			}
		})
	}
}

// TestReportProgress: ReportProgress posts nothing before the first Set,
// then what the meter says each interval (rate 0 on a step's first
// report), goes on after a refused post (429), and returns when its
// context ends.
func TestReportProgress(t *testing.T) {
	var m ProgressMeter
	var mu sync.Mutex
	var posts []v1.Progress
	got := make(chan struct{}, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ReportProgress(ctx, time.Millisecond, &m, func(_ context.Context, p v1.Progress) error {
			mu.Lock()
			posts = append(posts, p)
			mu.Unlock()
			select {
			case got <- struct{}{}:
			default:
			}
			return &v1.AgentStatusError{Code: 429}
		}, slog.New(slog.DiscardHandler))
	}()
	m.Set(v1.StepImageWrite, 10, 100)
	for range 3 {
		<-got
	}
	cancel()
	<-done // it returns once its context ends
	mu.Lock()
	defer mu.Unlock()
	if len(posts) < 3 {
		t.Fatalf("%d posts, want at least 3", len(posts))
	}
	if p := posts[0]; p.Step != v1.StepImageWrite || p.BytesDone != 10 || p.BytesTotal != 100 || p.RateBytesPerSecond != 0 {
		t.Errorf("first post %+v, want image-write 10 of 100 at rate 0", p)
	}
}
