package images

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ErrConvert: qemu-img convert failed; the error carries its stderr (capped).
var ErrConvert = errors.New("qemu-img convert failed")

// safePathRE is what a path handed to qemu-img may contain. Absolute paths of
// these characters cannot be read by qemu as a protocol prefix ("nbd:") or
// JSON ("json:{...}"), nor as an option.
var safePathRE = regexp.MustCompile(`^/[A-Za-z0-9._/-]+$`)

// convertArgs builds the qemu-img argument vector after validating both
// paths: absolute, clean, inside dir, no characters qemu treats specially.
func convertArgs(dir, src, dst string) ([]string, error) {
	for _, p := range []string{src, dst} {
		if !safePathRE.MatchString(p) || filepath.Clean(p) != p {
			return nil, fmt.Errorf("convert: unsafe path %q", truncate(p, 200))
		}
		if rel, err := filepath.Rel(dir, p); err != nil || strings.HasPrefix(rel, "..") || rel == "." {
			return nil, fmt.Errorf("convert: path %q outside %s", truncate(p, 200), dir)
		}
	}
	if src == dst {
		return nil, fmt.Errorf("convert: source and destination are the same file")
	}
	// -f qcow2: never let qemu-img probe the format of an untrusted file.
	// -p: progress on stdout, parsed for the progress bar.
	return []string{"convert", "-p", "-f", "qcow2", "-O", "raw", src, dst}, nil
}

var convProgressRE = regexp.MustCompile(`\(([0-9]+(?:\.[0-9]+)?)/100%\)`)

// convert runs qemu-img (no shell, minimal environment) to turn the qcow2 at
// src into a raw file at dst, both inside the store's tmp directory. The
// qcow2 header must already have passed [CheckQCOW2].
func (im *Importer) convert(ctx context.Context, src, dst string, prog *progressMeter) error {
	args, err := convertArgs(im.store.tmpDir(), src, dst)
	if err != nil {
		return err
	}
	bin := im.qemuImg
	if bin == "" {
		if bin, err = exec.LookPath("qemu-img"); err != nil {
			return fmt.Errorf("convert: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	cmd.Stdin = nil
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &stderr, max: 4096}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	cmd.WaitDelay = 5 * time.Second
	im.log.Debug("qemu-img", "args", args)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("convert: start qemu-img: %w", err)
	}
	prog.setTotal(1000)
	sc := bufio.NewScanner(stdout)
	sc.Split(scanCR)
	for sc.Scan() {
		if m := convProgressRE.FindStringSubmatch(sc.Text()); m != nil {
			if v, err := strconv.ParseFloat(m[1], 64); err == nil {
				prog.update(int64(v * 10))
			}
		}
	}
	io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("%w: %w: %s", ErrConvert, err, strings.TrimSpace(stderr.String()))
	}
	prog.finish(1000)
	return nil
}

// scanCR splits qemu-img's progress output on \r or \n.
func scanCR(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		return i + 1, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	buf *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.buf.Len(); room > 0 {
		l.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// hashFile returns the SHA-256 of the file at path, reporting progress.
func hashFile(ctx context.Context, path string, prog *progressMeter) (Digest, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return Digest{}, 0, fmt.Errorf("hash %s: %w", filepath.Base(path), err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Digest{}, 0, fmt.Errorf("hash %s: %w", filepath.Base(path), err)
	}
	prog.setTotal(st.Size())
	h := SHA256.New()
	n, err := hashReader(ctx, f, prog, h)
	if err != nil {
		return Digest{}, 0, fmt.Errorf("hash %s: %w", filepath.Base(path), err)
	}
	prog.finish(n)
	return Digest{Algo: SHA256, Hex: digestHex(h)}, n, nil
}

// hashReader feeds r to every hash in hs, checking ctx between chunks.
func hashReader(ctx context.Context, r io.Reader, prog *progressMeter, hs ...interface{ Write([]byte) (int, error) }) (int64, error) {
	buf := make([]byte, copyBufSize)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, err := r.Read(buf)
		for _, h := range hs {
			h.Write(buf[:k])
		}
		n += int64(k)
		prog.update(n)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
