package images

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// ErrConvert: qemu-img convert failed; the error carries its stderr (capped).
var ErrConvert = errors.New("qemu-img convert failed")

// safePathRE is what a path handed to qemu-img may contain. Absolute paths of
// these characters cannot be read by qemu as a protocol prefix ("nbd:") or
// JSON ("json:{...}"), nor as an option.
var safePathRE = regexp.MustCompile(`^/[A-Za-z0-9._/-]+$`)

// convertArgs builds the qemu-img argument vector after validating the
// source (absolute, clean, inside dir, no characters qemu treats specially)
// and the NBD socket path the raw output goes to.
func convertArgs(dir, src, sock string) ([]string, error) {
	if !safePathRE.MatchString(src) || filepath.Clean(src) != src {
		return nil, fmt.Errorf("convert: unsafe path %q", truncate(src, 200))
	}
	if rel, err := filepath.Rel(dir, src); err != nil || strings.HasPrefix(rel, "..") || rel == "." {
		return nil, fmt.Errorf("convert: path %q outside %s", truncate(src, 200), dir)
	}
	if !safePathRE.MatchString(sock) || filepath.Clean(sock) != sock || len(sock) > 100 {
		return nil, fmt.Errorf("convert: unsafe socket path %q", truncate(sock, 200))
	}
	// -f qcow2: never let qemu-img probe the format of an untrusted file.
	// -n: the NBD target exists already. No -W: writes stay in order.
	return []string{"convert", "-n", "-f", "qcow2", "-O", "raw", src, "nbd+unix:///?socket=" + sock}, nil
}

// qcow2VirtualSize reads the virtual disk size (header offset 24).
func qcow2VirtualSize(f io.ReaderAt) (int64, error) {
	b := make([]byte, 8)
	if _, err := f.ReadAt(b, 24); err != nil {
		return 0, fmt.Errorf("read qcow2 size: %w", err)
	}
	n := binary.BigEndian.Uint64(b)
	if n == 0 || n > maxVirtualSize {
		return 0, &UnsupportedFormatError{Format: FormatQCOW2, Reason: fmt.Sprintf("virtual size %d bytes", n)}
	}
	return int64(n), nil
}

// maxVirtualSize bounds a qcow2's virtual size (16 TiB).
const maxVirtualSize = 16 << 40

// convert runs qemu-img (no shell, minimal environment) to turn the qcow2 at
// src into the raw file dst. qemu-img writes to an NBD export served by this
// process on a private unix socket; the export writes dst and hashes the
// bytes as they arrive, so the returned raw digest is computed during the
// conversion. The qcow2 header must already have passed [CheckQCOW2].
func (im *Importer) convert(ctx context.Context, src, dst string, size int64, prog *progressMeter) (Digest, error) {
	sockDir, err := os.MkdirTemp("", "machina-nbd-")
	if err != nil {
		return Digest{}, fmt.Errorf("convert: %w", err)
	}
	defer os.RemoveAll(sockDir)
	sock := filepath.Join(sockDir, "s")
	args, err := convertArgs(im.store.tmpDir(), src, sock)
	if err != nil {
		return Digest{}, err
	}
	bin := im.qemuImg
	if bin == "" {
		if bin, err = exec.LookPath("qemu-img"); err != nil {
			return Digest{}, fmt.Errorf("convert: %w", err)
		}
	}
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return Digest{}, fmt.Errorf("convert: %w", err)
	}
	defer out.Close()
	if err := out.Truncate(size); err != nil {
		return Digest{}, fmt.Errorf("convert: %w", err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return Digest{}, fmt.Errorf("convert: listen: %w", err)
	}
	defer ln.Close()
	prog.setTotal(size)
	sink := &nbdSink{f: out, size: size, h: SHA256.New(), prog: prog}
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		ln.Close() // exactly one client
		if err != nil {
			served <- err
			return
		}
		served <- serveNBD(c, sink)
	}()

	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	var stderr bytes.Buffer
	cmd.Stdout = &limitedBuffer{buf: &stderr, max: 4096}
	cmd.Stderr = cmd.Stdout
	cmd.WaitDelay = 5 * time.Second
	im.log.Debug("qemu-img", "args", args)
	runErr := cmd.Run()
	ln.Close()
	srvErr := <-served
	if runErr != nil {
		return Digest{}, fmt.Errorf("%w: %w: %s", ErrConvert, runErr, strings.TrimSpace(stderr.String()))
	}
	if srvErr != nil {
		return Digest{}, fmt.Errorf("%w: nbd target: %w", ErrConvert, srvErr)
	}
	if err := out.Sync(); err != nil {
		return Digest{}, fmt.Errorf("convert: %w", err)
	}
	prog.finish(sink.next)
	if d, ok := sink.digest(); ok {
		return d, nil
	}
	im.log.Warn("qemu-img wrote out of order; hashing the raw file after conversion")
	hm := newProgressMeter(prog.image, PhaseHash, prog.fn, nil, im.interval)
	d, _, err := hashFile(ctx, dst, hm)
	return d, err
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
