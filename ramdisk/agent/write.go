package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// Errors from WriteImage. In every case but ErrSourceChanged and
// ErrReadBack not a byte of the target has been written.
var (
	// ErrChecksum: the image's SHA-256 differs from the plan.
	ErrChecksum = errors.New("image checksum mismatch")
	// ErrImageSize: the image is not the announced size, or larger than the disk.
	ErrImageSize = errors.New("image size mismatch")
	// ErrSourceChanged: in two-pass mode a chunk of the write pass differs
	// from the verified hash pass; the chunk was not written (the disk holds
	// a partial image after the wiped signatures).
	ErrSourceChanged = errors.New("image changed between hash pass and write pass")
	// ErrReadBack: the read-back verification found different bytes on disk.
	ErrReadBack = errors.New("read-back verification failed")
)

// ImageOpener opens a fresh stream of the image; WriteImage calls it once
// (memory mode) or twice (two-pass mode).
type ImageOpener func(ctx context.Context) (io.ReadCloser, error)

// WriteConfig configures WriteImage. Zero values are usable except for
// Open, SizeBytes and SHA256.
type WriteConfig struct {
	Open ImageOpener
	// SizeBytes is the exact image size.
	SizeBytes int64
	// SHA256 is the expected lower-case hex digest of the image.
	SHA256 string
	// MemoryLimit is the largest image buffered in memory (one pass); larger
	// images use two passes. Zero means 256 MiB; negative forces two passes.
	MemoryLimit int64
	// ChunkBytes is the write size and chunk-hash granularity; zero means
	// 4 MiB. Must be a multiple of 4096.
	ChunkBytes int
	// ReadBack re-reads the written range and compares its SHA-256.
	ReadBack bool
	// Progress, when set, is told how far each step is: the step
	// (v1.StepImageDownload, v1.StepImageWrite, v1.StepImageReadBack) and
	// its bytes done of total, after every chunk. It must be quick (it
	// runs on the write's goroutine); ProgressMeter is one.
	Progress func(step string, done, total int64)
	// CheckHead, when set, is called in the verification pass with the
	// image's first chunk (ChunkBytes, or the whole image if smaller),
	// before any byte is written; an error ends the write with nothing
	// written. A storage layout checks the image's partition table here
	// rather than after the write.
	CheckHead func(head []byte) error
	Logger    *slog.Logger
}

// checkHead runs cfg.CheckHead on the first piece of the stream.
func (cfg *WriteConfig) checkHead(p piece) error {
	if cfg.CheckHead == nil || p.off != 0 {
		return nil
	}
	if err := cfg.CheckHead(p.b); err != nil {
		return fmt.Errorf("write image: image check before the write: %w", err)
	}
	return nil
}

// progress tells cfg.Progress, if set.
func (cfg *WriteConfig) progress(step string, done, total int64) {
	if cfg.Progress != nil {
		cfg.Progress(step, done, total)
	}
}

// WriteResult describes a finished write.
type WriteResult struct {
	Mode         string // "memory" or "two-pass"
	BytesWritten int64
	SHA256       string
	// ReadBackSHA256 is the digest of the written range read back from
	// the disk (cfg.ReadBack), "" when no read-back ran.
	ReadBackSHA256 string
	// Verify is the time spent downloading and hashing before the first write.
	Verify time.Duration
	// Write is the time from the first write to the end of fsync.
	Write time.Duration
}

// WriteImage writes a verified image to dev (diskSize bytes). No byte of
// dev changes before the whole image has been hashed and matched against
// cfg.SHA256: an image that fits in cfg.MemoryLimit is buffered and written
// from memory; a larger one is hashed in a first pass that also records the
// SHA-256 of every chunk, and the second pass writes a chunk only after its
// hash matches the recorded one. After verification it wipes old signatures
// beyond the image (WipeSignatures), writes in ChunkBytes-aligned chunks,
// fsyncs, and optionally reads back.
func WriteImage(ctx context.Context, dev BlockDevice, diskSize int64, cfg WriteConfig) (WriteResult, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	chunk := cfg.ChunkBytes
	if chunk == 0 {
		chunk = 4 << 20
	}
	if chunk%4096 != 0 || chunk <= 0 {
		return WriteResult{}, fmt.Errorf("write image: chunk size %d not a multiple of 4096", chunk)
	}
	memLimit := cfg.MemoryLimit
	if memLimit == 0 {
		memLimit = 256 << 20
	}
	want := strings.ToLower(cfg.SHA256)
	if len(want) != 64 {
		return WriteResult{}, fmt.Errorf("write image: %w: expected checksum is not a sha256 hex digest", ErrChecksum)
	}
	if cfg.SizeBytes <= 0 || cfg.SizeBytes > diskSize {
		return WriteResult{}, fmt.Errorf("write image: %w: image %d bytes, disk %d bytes", ErrImageSize, cfg.SizeBytes, diskSize)
	}
	res := WriteResult{SHA256: want}
	t0 := time.Now()
	var buf []byte
	var chunkSums [][32]byte
	var err error
	if cfg.SizeBytes <= memLimit {
		res.Mode = "memory"
		buf, err = verifyInMemory(ctx, cfg, chunk, want)
	} else {
		res.Mode = "two-pass"
		chunkSums, err = verifyTwoPass(ctx, cfg, chunk, want)
	}
	if err != nil {
		return res, err
	}
	res.Verify = time.Since(t0)
	log.Info("image verified", "mode", res.Mode, "bytes", cfg.SizeBytes, "seconds", res.Verify.Seconds())

	t1 := time.Now()
	if err := WipeSignatures(dev, diskSize, cfg.SizeBytes); err != nil {
		return res, fmt.Errorf("write image: %w", err)
	}
	if buf != nil {
		err = writeBuffered(ctx, dev, buf, chunk, &res, cfg.progress)
	} else {
		err = writeVerified(ctx, dev, cfg, chunk, chunkSums, want, &res)
	}
	if err != nil {
		return res, err
	}
	if err := dev.Sync(); err != nil {
		return res, fmt.Errorf("write image: fsync: %w", err)
	}
	res.Write = time.Since(t1)
	if cfg.ReadBack {
		if err := readBack(dev, cfg.SizeBytes, want, &res, cfg.progress); err != nil {
			return res, err
		}
	}
	log.Info("image written", "bytes", res.BytesWritten, "seconds", res.Write.Seconds(), "readBack", cfg.ReadBack)
	return res, nil
}

// verifyInMemory downloads the whole image into memory, hashing while it
// reads (the reader fills the buffer in chunks and the hasher follows it:
// disjoint regions, ordered by the channel), and returns it only when its
// SHA-256 is want.
func verifyInMemory(ctx context.Context, cfg WriteConfig, chunk int, want string) ([]byte, error) {
	rc, err := cfg.Open(ctx)
	if err != nil {
		return nil, fmt.Errorf("write image: open: %w", err)
	}
	buf := make([]byte, cfg.SizeBytes)
	h := sha256.New()
	err = pipeRead(ctx, cfg.downloadProgress(rc), cfg.SizeBytes, chunk, buf, func(p piece) error {
		if err := cfg.checkHead(p); err != nil {
			return err
		}
		h.Write(p.b)
		return nil
	})
	rc.Close()
	if err != nil {
		return nil, fmt.Errorf("write image: read: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return nil, fmt.Errorf("write image: %w: got %s", ErrChecksum, got)
	}
	return buf, nil
}

// verifyTwoPass is the first pass of an image too large for memory: it
// reads the whole stream, checks its SHA-256 is want and returns each
// chunk's SHA-256, which the write pass checks every chunk against.
func verifyTwoPass(ctx context.Context, cfg WriteConfig, chunk int, want string) ([][32]byte, error) {
	rc, err := cfg.Open(ctx)
	if err != nil {
		return nil, fmt.Errorf("write image: open hash pass: %w", err)
	}
	total := sha256.New()
	var sums [][32]byte
	err = pipeRead(ctx, cfg.downloadProgress(rc), cfg.SizeBytes, chunk, nil, func(p piece) error {
		if err := cfg.checkHead(p); err != nil {
			return err
		}
		sums = append(sums, sha256.Sum256(p.b))
		total.Write(p.b)
		return nil
	})
	rc.Close()
	got := hex.EncodeToString(total.Sum(nil))
	if err != nil {
		return nil, fmt.Errorf("write image: hash pass: %w", err)
	}
	if got != want {
		return nil, fmt.Errorf("write image: %w: got %s", ErrChecksum, got)
	}
	return sums, nil
}

// writeBuffered writes a verified in-memory image to dev, chunk by chunk.
func writeBuffered(ctx context.Context, dev BlockDevice, buf []byte, chunk int, res *WriteResult, progress func(string, int64, int64)) error {
	for off := int64(0); off < int64(len(buf)); off += int64(chunk) {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("write image: %w", err)
		}
		end := min(off+int64(chunk), int64(len(buf)))
		if _, err := dev.WriteAt(buf[off:end], off); err != nil {
			return fmt.Errorf("write image: write at %d: %w", off, err)
		}
		res.BytesWritten = end
		progress(v1.StepImageWrite, end, int64(len(buf)))
	}
	return nil
}

// writeVerified is the write pass of a two-pass image: it reads the
// stream again and writes each chunk only after its SHA-256 matched the
// hash pass's (a source that changed between the passes is
// ErrSourceChanged, before that chunk reaches the disk).
func writeVerified(ctx context.Context, dev BlockDevice, cfg WriteConfig, chunk int, chunkSums [][32]byte, want string, res *WriteResult) error {
	rc, err := cfg.Open(ctx)
	if err != nil {
		return fmt.Errorf("write image: open write pass: %w", err)
	}
	defer rc.Close()
	total := sha256.New()
	i := 0
	err = pipeRead(ctx, rc, cfg.SizeBytes, chunk, nil, func(p piece) error {
		if i >= len(chunkSums) || sha256.Sum256(p.b) != chunkSums[i] {
			return fmt.Errorf("%w: chunk at offset %d", ErrSourceChanged, p.off)
		}
		i++
		total.Write(p.b)
		if _, err := dev.WriteAt(p.b, p.off); err != nil {
			return fmt.Errorf("write at %d: %w", p.off, err)
		}
		res.BytesWritten = p.off + int64(len(p.b))
		cfg.progress(v1.StepImageWrite, res.BytesWritten, cfg.SizeBytes)
		return nil
	})
	if err != nil {
		return fmt.Errorf("write image: write pass: %w", err)
	}
	if hex.EncodeToString(total.Sum(nil)) != want {
		return fmt.Errorf("write image: %w", ErrSourceChanged)
	}
	return nil
}

// readBack drops the device's cache and checks that its first size bytes
// hash to want (ErrReadBack otherwise).
func readBack(dev BlockDevice, size int64, want string, res *WriteResult, progress func(string, int64, int64)) error {
	dropCache(dev)
	h := sha256.New()
	cw := &countWriter{w: h, report: func(n int64) { progress(v1.StepImageReadBack, n, size) }}
	if _, err := io.Copy(cw, io.NewSectionReader(dev, 0, size)); err != nil {
		return fmt.Errorf("write image: read back: %w", err)
	}
	got := hex.EncodeToString(h.Sum(nil))
	res.ReadBackSHA256 = got
	if got != want {
		return fmt.Errorf("write image: %w: got %s", ErrReadBack, got)
	}
	return nil
}

// downloadProgress returns r counting the bytes read from it as the
// download step's progress (per read, not per chunk: a chunk is 4 MiB, and
// a slow link takes a while to fill one).
func (cfg *WriteConfig) downloadProgress(r io.Reader) io.Reader {
	if cfg.Progress == nil {
		return r
	}
	return &countReader{r: r, report: func(n int64) { cfg.Progress(v1.StepImageDownload, min(n, cfg.SizeBytes), cfg.SizeBytes) }}
}

// countReader counts the bytes read through it and reports the count.
type countReader struct {
	r      io.Reader
	n      int64
	report func(int64)
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if n > 0 {
		c.report(c.n)
	}
	return n, err
}

// countWriter counts the bytes written through it and reports the count.
type countWriter struct {
	w      io.Writer
	n      int64
	report func(int64)
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.report(c.n)
	return n, err
}

// errStreamEnded marks an image stream that ended early: the controller
// restarted mid-download as often as the image being short, so the
// deploy fetches it again (a bounded number of times).
var errStreamEnded = errors.New("stream ended early")

// piece is one chunk of the image stream at byte offset off.
type piece struct {
	off int64
	b   []byte
}

// pipeRead reads exactly size bytes from r in a goroutine, chunk bytes at a
// time, and calls consume for each chunk in order on the caller's goroutine,
// so reading the next chunk overlaps consuming this one. With mem (len size)
// the chunks are slices of mem; otherwise a pool of four buffers is reused,
// and consume must not keep p.b. A short or long stream is ErrImageSize; an
// error from consume stops the reader and is returned (the caller then
// closes r, which ends a read in flight; mem must then be discarded).
func pipeRead(ctx context.Context, r io.Reader, size int64, chunk int, mem []byte, consume func(piece) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const nbuf = 4
	free := make(chan []byte, nbuf)
	if mem == nil {
		for range nbuf {
			free <- make([]byte, chunk)
		}
	}
	out := make(chan piece, nbuf)
	errc := make(chan error, 1)
	go func() {
		defer close(out)
		for off := int64(0); off < size; off += int64(chunk) {
			n := int(min(int64(chunk), size-off))
			var b []byte
			if mem != nil {
				b = mem[off : off+int64(n)]
			} else {
				select {
				case b = <-free:
				case <-ctx.Done():
					errc <- ctx.Err()
					return
				}
				b = b[:n]
			}
			if _, err := io.ReadFull(r, b); err != nil {
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
					err = fmt.Errorf("%w: %w: image shorter than announced %d bytes", ErrImageSize, errStreamEnded, size)
				}
				errc <- err
				return
			}
			select {
			case out <- piece{off: off, b: b}:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
		}
		errc <- expectEOF(r)
	}()
	for p := range out {
		if err := consume(p); err != nil {
			// The reader stops at its next send, or when the caller closes r.
			cancel()
			return err
		}
		if mem == nil {
			free <- p.b[:cap(p.b)]
		}
	}
	return <-errc
}

// expectEOF fails if r has more bytes: the image is larger than announced.
func expectEOF(r io.Reader) error {
	var b [1]byte
	n, err := io.ReadFull(r, b[:])
	if n > 0 {
		return fmt.Errorf("%w: image longer than announced", ErrImageSize)
	}
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return err
	}
	return nil
}

// FileOpener returns an ImageOpener over an in-memory image (tests, local files).
func FileOpener(b []byte) ImageOpener {
	return func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

// dropCache asks the kernel to write back and drop the page cache of a block
// device (BLKFLSBUF, linux/fs.h _IO(0x12, 97)), so that the read-back reads
// the medium rather than the pages just written. Files and devices without
// a descriptor are left alone; failure only weakens the read-back.
func dropCache(dev BlockDevice) {
	f, ok := dev.(interface {
		Fd() uintptr
		Stat() (os.FileInfo, error)
	})
	if !ok {
		return
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeDevice == 0 {
		return
	}
	const blkflsbuf = 0x1261
	_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), blkflsbuf, 0)
}
