package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// StatusRecorder receives image status changes, for the controller's state
// store and status files. Implementations MUST be safe for concurrent use and
// SHOULD return quickly; an error is logged and the import continues.
type StatusRecorder interface {
	RecordImageStatus(ctx context.Context, name string, st Status) error
}

// Status is what status shows for one image. Percent is 0-100 while
// downloading or converting, -1 when the size is unknown. Reason is set when
// State is failed. Raw and SizeBytes are set once verified.
type Status struct {
	State     State
	Percent   float64
	Reason    string
	Raw       Digest
	SizeBytes int64
}

// MismatchError is the reason a download was discarded: its digest differed
// from the expected one. It matches [ErrChecksumMismatch] with errors.Is.
type MismatchError struct {
	Want, Got Digest
}

// Error renders "checksum mismatch: want <algo:hex>, got <algo:hex>".
func (e *MismatchError) Error() string {
	return fmt.Sprintf("checksum mismatch: want %s, got %s", e.Want, e.Got)
}

// Is makes errors.Is(err, ErrChecksumMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == ErrChecksumMismatch }

// Config configures an [Importer]. Only Store is required.
type Config struct {
	// Store is where images land. Required.
	Store *Store
	// Catalog resolves catalog names; nil means DefaultCatalog().
	Catalog *Catalog
	// Client makes HTTP requests; nil means a client with a 60s response
	// header timeout and no body timeout. Its CheckRedirect is replaced.
	Client *http.Client
	// MaxAttempts bounds consecutive failed attempts without progress; zero means 8.
	MaxAttempts int
	// MaxRedirects bounds redirects per request; zero means 5.
	MaxRedirects int
	// BackoffBase is the first retry wait, doubled per failure; zero means 1s.
	BackoffBase time.Duration
	// BackoffMax caps the backoff; zero means 1m.
	BackoffMax time.Duration
	// MaxRetryAfter caps a server's Retry-After; zero means 5m.
	MaxRetryAfter time.Duration
	// QemuImg is the qemu-img binary; "" means "qemu-img" from PATH.
	QemuImg string
	// Status receives state changes; nil means none.
	Status StatusRecorder
	// ProgressInterval is the minimum time between progress reports; zero means 250ms.
	ProgressInterval time.Duration
	// StallTimeout aborts (and retries) an attempt whose body delivers no
	// bytes for this long; zero means 60s.
	StallTimeout time.Duration
	// AllowFileURLs permits file:// image, checksum and mirror URLs (the
	// operator's CLI, benchmarks). Leave false in the controller, where URLs
	// come from the inventory repository.
	AllowFileURLs bool
	// Logger logs retries and phase changes; nil discards.
	Logger *slog.Logger
	// Sleep waits between retries; nil means a timer that stops when ctx is
	// done. Tests inject one that records the waits.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Importer downloads, verifies, converts and stores images. Safe for
// concurrent use; imports of the same source serialise on a file lock
// ([ErrBusy] for the loser).
type Importer struct {
	store         *Store
	catalog       *Catalog
	client        *http.Client
	maxAttempts   int
	backoffBase   time.Duration
	backoffMax    time.Duration
	maxRetryAfter time.Duration
	qemuImg       string
	status        StatusRecorder
	interval      time.Duration
	stallTimeout  time.Duration
	allowFile     bool
	log           *slog.Logger
	sleep         func(context.Context, time.Duration) error
}

// New returns an Importer for cfg.
func New(cfg Config) (*Importer, error) {
	if cfg.Store == nil {
		return nil, errors.New("images: new importer: Store is required")
	}
	im := &Importer{store: cfg.Store, catalog: cfg.Catalog, maxAttempts: cfg.MaxAttempts,
		backoffBase: cfg.BackoffBase, backoffMax: cfg.BackoffMax, maxRetryAfter: cfg.MaxRetryAfter,
		qemuImg: cfg.QemuImg, status: cfg.Status, interval: cfg.ProgressInterval, log: cfg.Logger, sleep: cfg.Sleep,
		stallTimeout: cfg.StallTimeout, allowFile: cfg.AllowFileURLs}
	if im.catalog == nil {
		c, err := DefaultCatalog()
		if err != nil {
			return nil, fmt.Errorf("images: new importer: %w", err)
		}
		im.catalog = c
	}
	maxRedirects := cfg.MaxRedirects
	if maxRedirects <= 0 {
		maxRedirects = 5
	}
	im.client = newHTTPClient(cfg.Client, maxRedirects)
	if im.maxAttempts <= 0 {
		im.maxAttempts = 8
	}
	if im.backoffBase <= 0 {
		im.backoffBase = time.Second
	}
	if im.backoffMax <= 0 {
		im.backoffMax = time.Minute
	}
	if im.maxRetryAfter <= 0 {
		im.maxRetryAfter = 5 * time.Minute
	}
	if im.interval <= 0 {
		im.interval = 250 * time.Millisecond
	}
	if im.log == nil {
		im.log = slog.New(slog.DiscardHandler)
	}
	if im.stallTimeout <= 0 {
		im.stallTimeout = time.Minute
	}
	if im.sleep == nil {
		im.sleep = sleepCtx
	}
	return im, nil
}

// Catalog returns the importer's catalog.
func (im *Importer) Catalog() *Catalog { return im.catalog }

// Request says what to import. Exactly one of Catalog and URL is set.
type Request struct {
	// Name is the image's name in the store; "" means the catalog name
	// (catalog imports only).
	Name string
	// Catalog is a catalog entry name, e.g. "ubuntu-24.04".
	Catalog string
	// Arch is amd64 or arm64; "" means amd64. Catalog imports only.
	Arch string
	// Mirrors re-roots catalog URLs at local mirrors.
	Mirrors Mirrors
	// URL is an http, https or file URL of the image (URL imports).
	URL string
	// Checksum is "sha256:HEX" or "sha512:HEX" (URL imports; one of
	// Checksum and ChecksumURL is required).
	Checksum string
	// ChecksumURL is the URL of a checksum file listing the image by its
	// base name (URL imports).
	ChecksumURL string
	// Installer marks a distribution installer ISO (a profile with deploy:
	// autoinstall or kickstart uses it): ISO 9660 is accepted and stored
	// as is, to be served to the installer and to have its kernel and
	// initrd extracted ([Store.InstallerTree]). Without it an ISO is
	// refused like any other non-disk format.
	Installer bool
	// Progress receives progress reports; nil means none.
	Progress func(Progress)
}

// Import brings one image into the store and returns its verified record.
// It resolves the source, obtains the expected digest (given, or from the
// checksum file), and returns the existing record at once if the same
// upstream digest is already stored (idempotent). Otherwise it downloads into
// a partial file (resuming one left by an earlier run), verifies the digest,
// detects the format from magic bytes, converts qcow2 to raw, hashes the raw
// bytes and moves them into the content-addressed store. A mismatch deletes
// the download and records the reason ([MismatchError]); a refused format
// returns [UnsupportedFormatError]. Failures are recorded in the store and
// sent to the StatusRecorder.
func (im *Importer) Import(ctx context.Context, req Request) (Record, error) {
	rec, src, err := im.resolve(req)
	if err != nil {
		return Record{}, fmt.Errorf("import image: %w", err)
	}
	log := im.log.With("image", rec.Name, "url", rec.Source)
	if _, ok := im.store.verified(rec.Name); !ok {
		im.setStatus(ctx, rec.Name, Status{State: StatePending, Percent: -1})
	}
	out, err := im.run(ctx, rec, src, req, log)
	if err != nil {
		reason := err.Error()
		if ctx.Err() == nil {
			st := Status{State: StateFailed, Percent: -1, Reason: reason}
			if old, ok := im.store.verified(rec.Name); ok {
				// A failed refresh keeps the verified image in service.
				old.Reason = "refresh failed: " + reason
				rec = old
				st = Status{State: StateVerified, Percent: 100, Reason: old.Reason, Raw: old.Raw, SizeBytes: old.SizeBytes}
			} else {
				rec.State, rec.Reason = StateFailed, reason
			}
			if werr := im.store.putRecord(rec); werr != nil {
				err = errors.Join(err, werr)
			}
			im.setStatus(context.WithoutCancel(ctx), rec.Name, st)
			log.Error("image import failed", "err", err)
		}
		return Record{}, fmt.Errorf("import image %s: %w", rec.Name, err)
	}
	return out, nil
}

// source is a resolved request.
type source struct {
	url, checksumURL string
	checksum         string
}

func (im *Importer) resolve(req Request) (Record, source, error) {
	var rec Record
	var src source
	switch {
	case req.Catalog != "" && req.URL != "":
		return rec, src, errors.New("both catalog name and URL given")
	case req.Catalog != "":
		s, err := im.catalog.Resolve(req.Catalog, req.Arch, req.Mirrors)
		if err != nil {
			return rec, src, err
		}
		rec.Catalog, rec.Arch = s.Catalog, s.Arch
		src = source{url: s.URL, checksumURL: s.ChecksumURL, checksum: req.Checksum}
		if rec.Name = req.Name; rec.Name == "" {
			rec.Name = req.Catalog
		}
	case req.URL != "":
		if _, err := checkURL(req.URL); err != nil {
			return rec, src, err
		}
		if req.Checksum == "" && req.ChecksumURL == "" {
			return rec, src, fmt.Errorf("%w: a URL import needs a checksum or checksum URL", ErrBadChecksum)
		}
		if req.ChecksumURL != "" {
			if _, err := checkURL(req.ChecksumURL); err != nil {
				return rec, src, fmt.Errorf("checksum URL: %w", err)
			}
		}
		src = source{url: req.URL, checksumURL: req.ChecksumURL, checksum: req.Checksum}
		rec.Name = req.Name
		if rec.Name == "" {
			return rec, src, fmt.Errorf("%w: a URL import needs a name", ErrBadName)
		}
	default:
		return rec, src, errors.New("neither catalog name nor URL given")
	}
	if err := ValidateName(rec.Name); err != nil {
		return rec, src, err
	}
	if !im.allowFile && (strings.HasPrefix(src.url, "file:") || strings.HasPrefix(src.checksumURL, "file:")) {
		return rec, src, ErrFileURL
	}
	rec.Source = redact(src.url)
	return rec, src, nil
}

// imageBase returns the unescaped base name of the image URL's path, the
// name looked up in its checksum file.
func imageBase(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrBadURL, err)
	}
	b := path.Base(u.Path)
	if b == "/" || b == "." || b == "" {
		return "", fmt.Errorf("%w: %q has no file name", ErrBadURL, redact(raw))
	}
	return b, nil
}

func (im *Importer) run(ctx context.Context, rec Record, src source, req Request, log *slog.Logger) (Record, error) {
	// 1. Expected digest.
	var want Digest
	var err error
	if src.checksum != "" {
		if want, err = ParseDigest(src.checksum); err != nil {
			return rec, err
		}
	} else {
		base, err := imageBase(src.url)
		if err != nil {
			return rec, err
		}
		body, err := im.fetchSmall(ctx, src.checksumURL, MaxChecksumFileBytes)
		if err != nil {
			// Imported once while the mirror was reachable: keep serving it.
			if old, ok := im.store.verified(rec.Name); ok && old.Source == rec.Source && ctx.Err() == nil {
				log.Warn("checksum file unreachable; keeping the verified image", "err", err)
				im.setStatus(ctx, rec.Name, Status{State: StateVerified, Percent: 100, Raw: old.Raw, SizeBytes: old.SizeBytes})
				return old, nil
			}
			return rec, fmt.Errorf("checksum file: %w", err)
		}
		if want, err = FindChecksum(body, base); err != nil {
			return rec, fmt.Errorf("checksum file %s: %w", redact(src.checksumURL), err)
		}
	}
	rec.Upstream = want
	log = log.With("want", want.String())

	// 2. Idempotence: the same upstream bytes are already stored.
	if old, ok := im.store.verified(rec.Name); ok && old.Upstream == want {
		log.Debug("image already stored")
		if old.Reason != "" { // an earlier refresh failure is over
			old.Reason = ""
			if err := im.store.putRecord(old); err != nil {
				return rec, err
			}
		}
		im.setStatus(ctx, rec.Name, Status{State: StateVerified, Percent: 100, Raw: old.Raw, SizeBytes: old.SizeBytes})
		return im.store.Lookup(rec.Name)
	}

	// 3. Partial file, keyed by source URL and expected digest, locked.
	id := partID(src.url, want)
	partPath := filepath.Join(im.store.tmpDir(), id+".part")
	metaPath := filepath.Join(im.store.tmpDir(), id+".json")
	rawPath := filepath.Join(im.store.tmpDir(), id+".raw")
	part, err := os.OpenFile(partPath, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return rec, fmt.Errorf("open part: %w", err)
	}
	defer part.Close()
	if err := lockFile(part); err != nil {
		return rec, fmt.Errorf("lock part: %w", err)
	}
	os.Remove(rawPath) // a conversion interrupted by a crash cannot resume
	discard := func() {
		part.Close()
		os.Remove(partPath)
		os.Remove(metaPath)
		os.Remove(rawPath)
	}
	meta := &partMeta{URL: rec.Source, Expected: want, Total: -1}
	if b, err := os.ReadFile(metaPath); err == nil {
		var m partMeta
		if json.Unmarshal(b, &m) == nil && m.Expected == want {
			meta = &m
		}
	}

	// 4. Re-hash what an earlier run left, then download the rest.
	hashes := []hash.Hash{want.Algo.New()}
	pct := func(p float64) {
		im.setStatus(ctx, rec.Name, Status{State: StateDownloading, Percent: p})
	}
	st, err := part.Stat()
	if err != nil {
		return rec, fmt.Errorf("stat part: %w", err)
	}
	if st.Size() > 0 {
		log.Info("resuming image download", "have", st.Size())
		pm := newProgressMeter(rec.Name, PhaseResume, req.Progress, nil, im.interval)
		pm.setTotal(st.Size())
		ws := make([]interface{ Write([]byte) (int, error) }, len(hashes))
		for i, h := range hashes {
			ws[i] = h
		}
		n, err := hashReader(ctx, io.NewSectionReader(part, 0, st.Size()), pm, ws...)
		if err != nil {
			return rec, fmt.Errorf("re-hash part: %w", err)
		}
		pm.finish(n)
	}
	if _, err := part.Seek(st.Size(), io.SeekStart); err != nil {
		return rec, fmt.Errorf("seek part: %w", err)
	}
	im.setStatus(ctx, rec.Name, Status{State: StateDownloading, Percent: 0})
	pm := newProgressMeter(rec.Name, PhaseDownload, req.Progress, pct, im.interval)
	t := &transfer{im: im, url: src.url, f: part, off: st.Size(), hashes: hashes, meta: meta, prog: pm,
		saveMeta: func() error {
			b, _ := json.Marshal(meta)
			return im.store.writeAtomic(metaPath, b, 0o640)
		}}
	if err := t.run(ctx); err != nil {
		return rec, fmt.Errorf("download: %w", err)
	}
	pm.finish(t.off)
	if err := part.Sync(); err != nil {
		return rec, fmt.Errorf("sync part: %w", err)
	}

	// 5. Verify. A mismatch never stays on disk.
	got := Digest{Algo: want.Algo, Hex: digestHex(hashes[0])}
	if got != want {
		discard()
		err := &MismatchError{Want: want, Got: got}
		if st.Size() > 0 {
			// The kept prefix may predate an upstream change that If-Range
			// could not detect (no validators): start over once, from zero.
			log.Warn("resumed image mismatched; downloading again from zero", "err", err)
			return im.run(ctx, rec, src, req, log)
		}
		log.Warn("image discarded", "err", err)
		return rec, err
	}
	log.Info("image download verified", "bytes", t.off)

	// 6. Format from magic bytes; qcow2 to raw.
	format, err := DetectFormat(part, t.off)
	if err != nil {
		return rec, err
	}
	rec.SourceFormat = format
	var rawFile string
	var raw Digest
	var size int64
	if format == FormatISO && !req.Installer {
		discard()
		return rec, &UnsupportedFormatError{Format: format, Reason: "an ISO is accepted only as an installer image (a profile with deploy: autoinstall or kickstart)"}
	}
	switch format {
	case FormatRaw, FormatISO:
		rawFile, size = partPath, t.off
		if want.Algo == SHA256 {
			raw = want
		} else {
			hm := newProgressMeter(rec.Name, PhaseHash, req.Progress, nil, im.interval)
			if raw, _, err = hashFile(ctx, partPath, hm); err != nil {
				return rec, err
			}
		}
	case FormatQCOW2:
		if err := CheckQCOW2(part); err != nil {
			discard()
			return rec, err
		}
		vsize, err := qcow2VirtualSize(part)
		if err != nil {
			discard()
			return rec, err
		}
		im.setStatus(ctx, rec.Name, Status{State: StateConverting, Percent: 0})
		cm := newProgressMeter(rec.Name, PhaseConvert, req.Progress, func(p float64) {
			im.setStatus(ctx, rec.Name, Status{State: StateConverting, Percent: p})
		}, im.interval)
		if raw, err = im.convert(ctx, partPath, rawPath, vsize, cm); err != nil {
			os.Remove(rawPath)
			return rec, err
		}
		size = vsize
		rawFile = rawPath
	default:
		discard()
		return rec, &UnsupportedFormatError{Format: format, Reason: "only raw and qcow2 images are accepted"}
	}

	// 7. Into the store, then the record, then drop the part.
	if _, err := im.store.commitBlob(rawFile, raw); err != nil {
		return rec, err
	}
	prev, hadPrev := im.store.verified(rec.Name)
	rec.Raw, rec.SizeBytes, rec.State, rec.Reason = raw, size, StateVerified, ""
	if err := im.store.putRecord(rec); err != nil {
		return rec, err
	}
	if hadPrev && prev.Raw != raw {
		// A refreshed image: drop the old blob unless another name uses it.
		// Readers holding it open keep reading (unlinked inode).
		if err := im.store.dropBlobIfUnused(prev.Raw); err != nil {
			log.Warn("remove replaced blob", "err", err)
		}
	}
	discard()
	log.Info("image stored", "raw", raw.String(), "format", format, "bytes", size)
	im.setStatus(ctx, rec.Name, Status{State: StateVerified, Percent: 100, Raw: raw, SizeBytes: size})
	return im.store.Lookup(rec.Name)
}

// ImportAll imports every request in order, as the controller does for the
// images named in images.yaml. Before the first download starts, each image
// that has no record yet gets a pending record and a pending status, so
// status lists all of them at once. It returns one error per request (nil on
// success), in request order; a cancelled ctx stops the loop and the
// remaining requests get ctx's error.
func (im *Importer) ImportAll(ctx context.Context, reqs []Request) []error {
	errs := make([]error, len(reqs))
	resolved := make([]Record, len(reqs))
	for i, req := range reqs {
		rec, _, err := im.resolve(req)
		if err != nil {
			errs[i] = fmt.Errorf("import image: %w", err)
			continue
		}
		resolved[i] = rec
		if _, err := im.store.Lookup(rec.Name); errors.Is(err, ErrNotFound) {
			rec.State = StatePending
			if err := im.store.putRecord(rec); err != nil {
				errs[i] = err
				continue
			}
		}
		if _, ok := im.store.verified(rec.Name); !ok {
			im.setStatus(ctx, rec.Name, Status{State: StatePending, Percent: -1})
		}
	}
	for i, req := range reqs {
		if errs[i] != nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		_, errs[i] = im.Import(ctx, req)
	}
	return errs
}

// partID names the partial download of url expected to have digest want.
func partID(url string, want Digest) string {
	h := sha256.Sum256([]byte(url + "\n" + want.String()))
	return hex.EncodeToString(h[:16])
}

func (im *Importer) setStatus(ctx context.Context, name string, st Status) {
	if im.status == nil {
		return
	}
	if err := im.status.RecordImageStatus(ctx, name, st); err != nil {
		im.log.Warn("record image status", "image", name, "err", err)
	}
}

// Remove deletes the record of name and, if no other record uses it, its
// blob. It returns an error wrapping [ErrNotFound] if there is no record.
// Callers check first that no profile still uses the image.
func (s *Store) Remove(name string) error {
	r, err := s.Lookup(name)
	if err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(s.recordDir(), name+".json")); err != nil {
		return fmt.Errorf("remove image %s: %w", name, err)
	}
	if r.Raw.IsZero() {
		return nil
	}
	if err := s.dropBlobIfUnused(r.Raw); err != nil {
		return fmt.Errorf("remove image %s: %w", name, err)
	}
	return nil
}

// dropBlobIfUnused deletes the blob d unless a record refers to it.
func (s *Store) dropBlobIfUnused(d Digest) error {
	all, err := s.List()
	if err != nil {
		return err
	}
	for _, o := range all {
		if o.Raw == d {
			return nil
		}
	}
	p, err := s.BlobPath(d)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
