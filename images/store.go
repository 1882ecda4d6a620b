package images

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Errors returned by the store.
var (
	// ErrNotFound: no image record with that name (or its blob is missing).
	ErrNotFound = errors.New("image not found")
	// ErrBadName: an image name is not a lower-case DNS-label-like name.
	ErrBadName = errors.New("invalid image name")
	// ErrBusy: another import of the same source holds its lock.
	ErrBusy = errors.New("import already in progress")
)

// State is an image's import state, as shown in status.
type State string

// Image states. Converting follows a verified download of a qcow2 image.
const (
	StatePending     State = "pending"
	StateDownloading State = "downloading"
	StateConverting  State = "converting"
	StateVerified    State = "verified"
	StateFailed      State = "failed"
)

// Record is the store's metadata about one named image, kept as JSON in
// images/<name>.json. Raw is the SHA-256 of the raw bytes served to machines
// (the content address); Upstream is the digest the source was verified
// against.
type Record struct {
	Name         string    `json:"name"`
	Catalog      string    `json:"catalog,omitempty"`
	Arch         string    `json:"arch,omitempty"`
	Source       string    `json:"source"` // redacted URL
	Upstream     Digest    `json:"upstream"`
	SourceFormat Format    `json:"sourceFormat,omitempty"`
	Raw          Digest    `json:"raw"`
	SizeBytes    int64     `json:"sizeBytes"` // raw size in bytes
	State        State     `json:"state"`
	Reason       string    `json:"reason,omitempty"` // why it failed
	UpdatedAt    time.Time `json:"updatedAt"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)

// ValidateName checks that name is 1-63 characters of [a-z0-9._-], starting
// and ending alphanumeric (so it is safe as a file name and URL segment).
func ValidateName(name string) error {
	if !nameRE.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("%w: %q", ErrBadName, truncate(name, 80))
	}
	return nil
}

// Store is a content-addressed image store rooted at a directory:
//
//	blobs/sha256/<hex>   raw images, named by the SHA-256 of their bytes, mode 0444
//	images/<name>.json   one [Record] per image name
//	tmp/                 partial downloads (<id>.part + <id>.json, resumable),
//	                     conversion output (<id>.raw) and record temp files
//
// Every file enters its final place by write to tmp, fsync, rename, fsync of
// the directory, so a crash leaves either the old or the new state. Safe for
// concurrent use by several goroutines and processes: an import holds an
// flock on its part file.
type Store struct {
	root string
}

// OpenStore creates (0750) or opens the store at dir and removes leftovers of
// interrupted runs that cannot be resumed: conversion outputs and record
// temp files whose import is not running, and partial downloads untouched
// for [PartMaxAge]. Younger partial downloads are kept so the next import of
// the same source resumes them.
func OpenStore(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open image store: %w", err)
	}
	s := &Store{root: abs}
	for _, d := range []string{s.root, s.blobDir(), s.recordDir(), s.tmpDir()} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("open image store: %w", err)
		}
	}
	if err := s.cleanTmp(); err != nil {
		return nil, fmt.Errorf("open image store: %w", err)
	}
	return s, nil
}

// Root returns the store's absolute directory.
func (s *Store) Root() string { return s.root }

func (s *Store) blobDir() string   { return filepath.Join(s.root, "blobs", "sha256") }
func (s *Store) recordDir() string { return filepath.Join(s.root, "images") }
func (s *Store) tmpDir() string    { return filepath.Join(s.root, "tmp") }

// BlobPath returns where the raw image with SHA-256 digest d lives.
func (s *Store) BlobPath(d Digest) (string, error) {
	if d.Algo != SHA256 || len(d.Hex) != 64 || !isHex(d.Hex) {
		return "", fmt.Errorf("blob path: %w: %q", ErrBadChecksum, d.String())
	}
	return filepath.Join(s.blobDir(), d.Hex), nil
}

// Lookup returns the record for name, or an error wrapping [ErrNotFound].
func (s *Store) Lookup(name string) (Record, error) {
	if err := ValidateName(name); err != nil {
		return Record{}, fmt.Errorf("lookup image: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(s.recordDir(), name+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return Record{}, fmt.Errorf("lookup image %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("lookup image %s: %w", name, err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("lookup image %s: %w", name, err)
	}
	return r, nil
}

// List returns every record, sorted by name.
func (s *Store) List() ([]Record, error) {
	ents, err := os.ReadDir(s.recordDir())
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var out []Record
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || ValidateName(name) != nil {
			continue
		}
		r, err := s.Lookup(name)
		if err != nil {
			return nil, fmt.Errorf("list images: %w", err)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// OpenImage opens the raw blob of a verified image for reading. The caller
// closes the file. Images not verified, or whose blob is missing or has the
// wrong size, return an error wrapping [ErrNotFound].
func (s *Store) OpenImage(name string) (*os.File, Record, error) {
	r, err := s.Lookup(name)
	if err != nil {
		return nil, Record{}, err
	}
	if r.State != StateVerified {
		return nil, Record{}, fmt.Errorf("open image %s: state %s: %w", name, r.State, ErrNotFound)
	}
	p, err := s.BlobPath(r.Raw)
	if err != nil {
		return nil, Record{}, fmt.Errorf("open image %s: %w", name, err)
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Record{}, fmt.Errorf("open image %s: blob missing: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, Record{}, fmt.Errorf("open image %s: %w", name, err)
	}
	if st, err := f.Stat(); err != nil || st.Size() != r.SizeBytes {
		f.Close()
		return nil, Record{}, fmt.Errorf("open image %s: blob size differs from record: %w", name, ErrNotFound)
	}
	return f, r, nil
}

// VerifyImage hashes the stored blob of the verified image name again and
// returns its record when the SHA-256 equals the record's and want (when
// want is not zero: the digest the inventory names). It is how a file is
// checked right before it is offered to a machine or a BMC, so a blob
// corrupted at rest is never served. A mismatch wraps
// [ErrChecksumMismatch]; an image not verified wraps [ErrNotFound].
func (s *Store) VerifyImage(ctx context.Context, name string, want Digest) (Record, error) {
	f, r, err := s.OpenImage(name)
	if err != nil {
		return Record{}, err
	}
	defer f.Close()
	h := SHA256.New()
	if _, err := hashReader(ctx, f, newProgressMeter(name, PhaseHash, nil, nil, time.Hour), h); err != nil {
		return Record{}, fmt.Errorf("verify image %s: %w", name, err)
	}
	got := Digest{Algo: SHA256, Hex: digestHex(h)}
	if r.Raw.Algo != SHA256 || got != r.Raw || (want != (Digest{}) && got != want) {
		if want == (Digest{}) {
			want = r.Raw
		}
		return Record{}, fmt.Errorf("verify image %s: %w", name, &MismatchError{Want: want, Got: got})
	}
	return r, nil
}

// verified returns name's record if it is verified and its blob is present
// with the recorded size.
func (s *Store) verified(name string) (Record, bool) {
	f, r, err := s.OpenImage(name)
	if err != nil {
		return Record{}, false
	}
	f.Close()
	return r, true
}

// putRecord writes r atomically.
func (s *Store) putRecord(r Record) error {
	if err := ValidateName(r.Name); err != nil {
		return fmt.Errorf("write image record: %w", err)
	}
	r.UpdatedAt = time.Now().UTC()
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("write image record %s: %w", r.Name, err)
	}
	if err := s.writeAtomic(filepath.Join(s.recordDir(), r.Name+".json"), append(b, '\n'), 0o640); err != nil {
		return fmt.Errorf("write image record %s: %w", r.Name, err)
	}
	return nil
}

// writeAtomic writes data to path via a temp file, fsync and rename.
func (s *Store) writeAtomic(path string, data []byte, mode os.FileMode) error {
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(s.tmpDir(), "w-"+hex.EncodeToString(rnd[:])+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		os.Remove(tmp)
		return werr
	}
	return syncDir(filepath.Dir(path))
}

// commitBlob moves the finished raw file at tmp into blobs/sha256/<hex>. If
// the blob already exists (same content), tmp is removed instead.
func (s *Store) commitBlob(tmp string, raw Digest) (string, error) {
	dst, err := s.BlobPath(raw)
	if err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o444); err != nil {
		return "", fmt.Errorf("commit blob: %w", err)
	}
	if _, err := os.Stat(dst); err == nil {
		return dst, os.Remove(tmp)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("commit blob: %w", err)
	}
	if err := syncDir(s.blobDir()); err != nil {
		return "", fmt.Errorf("commit blob: %w", err)
	}
	return dst, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// lockFile takes a non-blocking exclusive flock on f, or returns ErrBusy.
func lockFile(f *os.File) error {
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return ErrBusy
		}
		return err
	}
	return nil
}

// PartMaxAge is how long an untouched partial download is kept for a resume
// before OpenStore deletes it.
const PartMaxAge = 7 * 24 * time.Hour

// cleanTmp removes conversion outputs and record temp files of imports that
// are no longer running (their part file is not locked, or gone).
func (s *Store) cleanTmp() error {
	ents, err := os.ReadDir(s.tmpDir())
	if err != nil {
		return err
	}
	for _, e := range ents {
		n := e.Name()
		switch {
		case strings.HasPrefix(n, "w-") && strings.HasSuffix(n, ".tmp"):
			// Record temp files live for milliseconds; an old one is debris.
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Minute {
				os.Remove(filepath.Join(s.tmpDir(), n))
			}
		case strings.HasSuffix(n, ".raw"):
			id := strings.TrimSuffix(n, ".raw")
			if s.partIdle(id) {
				os.Remove(filepath.Join(s.tmpDir(), n))
			}
		case strings.HasSuffix(n, ".part"):
			// A part nobody resumed for PartMaxAge belongs to a source that
			// is gone (upstream moved on to a new digest).
			id := strings.TrimSuffix(n, ".part")
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > PartMaxAge && s.partIdle(id) {
				os.Remove(filepath.Join(s.tmpDir(), n))
				os.Remove(filepath.Join(s.tmpDir(), id+".json"))
			}
		}
	}
	return nil
}

// partIdle reports whether no import holds the lock of part id.
func (s *Store) partIdle(id string) bool {
	f, err := os.Open(filepath.Join(s.tmpDir(), id+".part"))
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	defer f.Close()
	return lockFile(f) == nil
}
