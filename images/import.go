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
	// Firmware marks a BMC update image (a firmware catalog entry of
	// images.yaml): stored as the bytes downloaded, with no format
	// detection or conversion (vendors ship .exe, .bin, .fwpkg, zip and
	// tar packages); Checksum must be "sha256:HEX" (the digest the file
	// is served and checked under). URL imports only.
	Firmware bool
	// SizeBytes, when above zero, is the file size the download must
	// have; another size fails the import before the checksum is
	// compared. Firmware imports only.
	SizeBytes int64
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
	case req.Catalog != "" && req.Firmware:
		return rec, src, errors.New("a firmware image is a URL import, not a catalog entry")
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
		if req.Firmware && !strings.HasPrefix(req.Checksum, "sha256:") {
			return rec, src, fmt.Errorf("%w: a firmware image needs a sha256 checksum", ErrBadChecksum)
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
	want, kept, err := im.expectedDigest(ctx, rec, src, log)
	if kept != nil {
		return *kept, nil
	}
	if err != nil {
		return rec, err
	}
	rec.Upstream = want
	log = log.With("want", want.String())
	if stored, ok, err := im.reuseStored(ctx, rec, want, log); ok || err != nil {
		return stored, err
	}
	j, err := im.openPart(rec, src, req, want)
	if err != nil {
		return rec, err
	}
	defer j.part.Close()
	if err := im.download(ctx, j, log); err != nil {
		return rec, err
	}
	if req.Firmware && req.SizeBytes > 0 && j.off != req.SizeBytes {
		j.discard()
		return rec, fmt.Errorf("downloaded %d bytes, want sizeBytes %d: discarded", j.off, req.SizeBytes)
	}
	// Verify. A mismatch never stays on disk.
	got := Digest{Algo: want.Algo, Hex: digestHex(j.hashes[0])}
	if got != want {
		j.discard()
		err := &MismatchError{Want: want, Got: got}
		if j.resumed {
			// The kept prefix may predate an upstream change that If-Range
			// could not detect (no validators): start over once, from zero.
			log.Warn("resumed image mismatched; downloading again from zero", "err", err)
			return im.run(ctx, rec, src, req, log)
		}
		log.Warn("image discarded", "err", err)
		return rec, err
	}
	log.Info("image download verified", "bytes", j.off)
	if req.Firmware {
		// The sha256 checked above is the served file's digest: stored
		// as downloaded.
		return im.storeImage(ctx, j, rec, j.partPath, want, j.off, log)
	}
	format, err := DetectFormat(j.part, j.off)
	if err != nil {
		return rec, err
	}
	rec.SourceFormat = format
	rawFile, raw, size, err := im.toRaw(ctx, j, format)
	if err != nil {
		return rec, err
	}
	return im.storeImage(ctx, j, rec, rawFile, raw, size, log)
}

// importJob is one import's partial download: the part file (open and
// locked), its metadata and raw-conversion paths, the hashes the bytes
// run through, and how many bytes it holds.
type importJob struct {
	name                        string
	src                         source
	req                         Request
	want                        Digest
	part                        *os.File
	partPath, metaPath, rawPath string
	meta                        *partMeta
	hashes                      []hash.Hash
	off                         int64 // bytes in part
	resumed                     bool  // part held bytes of an earlier run
}

// discard removes the partial download and what goes with it.
func (j *importJob) discard() {
	j.part.Close()
	os.Remove(j.partPath)
	os.Remove(j.metaPath)
	os.Remove(j.rawPath)
}

// expectedDigest is the digest the image must have: the request's, or
// the one its checksum file names for the image's file name. When the
// checksum file is unreachable and the same source was verified before,
// kept is that record (it keeps being served).
func (im *Importer) expectedDigest(ctx context.Context, rec Record, src source, log *slog.Logger) (want Digest, kept *Record, err error) {
	if src.checksum != "" {
		want, err = ParseDigest(src.checksum)
		return want, nil, err
	}
	base, err := imageBase(src.url)
	if err != nil {
		return want, nil, err
	}
	body, err := im.fetchSmall(ctx, src.checksumURL, MaxChecksumFileBytes)
	if err != nil {
		// Imported once while the mirror was reachable: keep serving it.
		if old, ok := im.store.verified(rec.Name); ok && old.Source == rec.Source && ctx.Err() == nil {
			log.Warn("checksum file unreachable; keeping the verified image", "err", err)
			im.setStatus(ctx, rec.Name, Status{State: StateVerified, Percent: 100, Raw: old.Raw, SizeBytes: old.SizeBytes})
			return want, &old, nil
		}
		return want, nil, fmt.Errorf("checksum file: %w", err)
	}
	if want, err = FindChecksum(body, base); err != nil {
		return want, nil, fmt.Errorf("checksum file %s: %w", redact(src.checksumURL), err)
	}
	return want, nil, nil
}

// reuseStored is idempotence: when the same upstream bytes are stored
// already, it clears an earlier refresh failure and returns the record
// (ok); nothing to do otherwise.
func (im *Importer) reuseStored(ctx context.Context, rec Record, want Digest, log *slog.Logger) (Record, bool, error) {
	old, ok := im.store.verified(rec.Name)
	if !ok || old.Upstream != want {
		return rec, false, nil
	}
	log.Debug("image already stored")
	if old.Reason != "" { // an earlier refresh failure is over
		old.Reason = ""
		if err := im.store.putRecord(old); err != nil {
			return rec, true, err
		}
	}
	im.setStatus(ctx, rec.Name, Status{State: StateVerified, Percent: 100, Raw: old.Raw, SizeBytes: old.SizeBytes})
	r, err := im.store.Lookup(rec.Name)
	return r, true, err
}

// openPart opens and locks the partial file, keyed by source URL and
// expected digest, with its metadata from an earlier run when it expects
// the same digest. A raw file a crash left mid-conversion is removed (it
// cannot resume).
func (im *Importer) openPart(rec Record, src source, req Request, want Digest) (*importJob, error) {
	id := partID(src.url, want)
	j := &importJob{name: rec.Name, src: src, req: req, want: want,
		partPath: filepath.Join(im.store.tmpDir(), id+".part"), metaPath: filepath.Join(im.store.tmpDir(), id+".json"),
		rawPath: filepath.Join(im.store.tmpDir(), id+".raw"), hashes: []hash.Hash{want.Algo.New()}}
	part, err := os.OpenFile(j.partPath, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open part: %w", err)
	}
	if err := lockFile(part); err != nil {
		part.Close()
		return nil, fmt.Errorf("lock part: %w", err)
	}
	j.part = part
	os.Remove(j.rawPath)
	j.meta = &partMeta{URL: rec.Source, Expected: want, Total: -1}
	if b, err := os.ReadFile(j.metaPath); err == nil {
		var m partMeta
		if json.Unmarshal(b, &m) == nil && m.Expected == want {
			j.meta = &m
		}
	}
	return j, nil
}

// download re-hashes what an earlier run left in the part, then
// downloads the rest (resuming with Range) and syncs it.
func (im *Importer) download(ctx context.Context, j *importJob, log *slog.Logger) error {
	st, err := j.part.Stat()
	if err != nil {
		return fmt.Errorf("stat part: %w", err)
	}
	if st.Size() > 0 {
		j.resumed = true
		log.Info("resuming image download", "have", st.Size())
		pm := newProgressMeter(j.name, PhaseResume, j.req.Progress, nil, im.interval)
		pm.setTotal(st.Size())
		ws := make([]interface{ Write([]byte) (int, error) }, len(j.hashes))
		for i, h := range j.hashes {
			ws[i] = h
		}
		n, err := hashReader(ctx, io.NewSectionReader(j.part, 0, st.Size()), pm, ws...)
		if err != nil {
			return fmt.Errorf("re-hash part: %w", err)
		}
		pm.finish(n)
	}
	if _, err := j.part.Seek(st.Size(), io.SeekStart); err != nil {
		return fmt.Errorf("seek part: %w", err)
	}
	im.setStatus(ctx, j.name, Status{State: StateDownloading, Percent: 0})
	pct := func(p float64) {
		im.setStatus(ctx, j.name, Status{State: StateDownloading, Percent: p})
	}
	pm := newProgressMeter(j.name, PhaseDownload, j.req.Progress, pct, im.interval)
	t := &transfer{im: im, url: j.src.url, f: j.part, off: st.Size(), hashes: j.hashes, meta: j.meta, prog: pm,
		saveMeta: func() error {
			b, _ := json.Marshal(j.meta)
			return im.store.writeAtomic(j.metaPath, b, 0o640)
		}}
	if err := t.run(ctx); err != nil {
		return fmt.Errorf("download: %w", err)
	}
	pm.finish(t.off)
	j.off = t.off
	if err := j.part.Sync(); err != nil {
		return fmt.Errorf("sync part: %w", err)
	}
	return nil
}

// toRaw turns the verified download into the raw image the store keeps
// (raw and installer ISOs as they are, qcow2 converted) and returns its
// file, SHA-256 and size; another format is refused and discarded.
func (im *Importer) toRaw(ctx context.Context, j *importJob, format Format) (rawFile string, raw Digest, size int64, err error) {
	name := j.name
	if format == FormatISO && !j.req.Installer {
		j.discard()
		return "", raw, 0, &UnsupportedFormatError{Format: format, Reason: "an ISO is accepted only as an installer image (a profile with deploy: autoinstall or kickstart)"}
	}
	switch format {
	case FormatRaw, FormatISO:
		if j.want.Algo == SHA256 {
			return j.partPath, j.want, j.off, nil
		}
		hm := newProgressMeter(name, PhaseHash, j.req.Progress, nil, im.interval)
		if raw, _, err = hashFile(ctx, j.partPath, hm); err != nil {
			return "", raw, 0, err
		}
		return j.partPath, raw, j.off, nil
	case FormatQCOW2:
		if err := CheckQCOW2(j.part); err != nil {
			j.discard()
			return "", raw, 0, err
		}
		vsize, err := qcow2VirtualSize(j.part)
		if err != nil {
			j.discard()
			return "", raw, 0, err
		}
		im.setStatus(ctx, name, Status{State: StateConverting, Percent: 0})
		cm := newProgressMeter(name, PhaseConvert, j.req.Progress, func(p float64) {
			im.setStatus(ctx, name, Status{State: StateConverting, Percent: p})
		}, im.interval)
		if raw, err = im.convert(ctx, j.partPath, j.rawPath, vsize, cm); err != nil {
			os.Remove(j.rawPath)
			return "", raw, 0, err
		}
		return j.rawPath, raw, vsize, nil
	}
	j.discard()
	return "", raw, 0, &UnsupportedFormatError{Format: format, Reason: "only raw and qcow2 images are accepted"}
}

// storeImage puts the raw image into the store, then its record, then
// drops the part (and a refreshed image's old blob unless another name
// uses it: readers holding it open keep reading the unlinked inode).
func (im *Importer) storeImage(ctx context.Context, j *importJob, rec Record, rawFile string, raw Digest, size int64, log *slog.Logger) (Record, error) {
	if _, err := im.store.commitBlob(rawFile, raw); err != nil {
		return rec, err
	}
	prev, hadPrev := im.store.verified(rec.Name)
	rec.Raw, rec.SizeBytes, rec.State, rec.Reason = raw, size, StateVerified, ""
	if err := im.store.putRecord(rec); err != nil {
		return rec, err
	}
	if hadPrev && prev.Raw != raw {
		if err := im.store.dropBlobIfUnused(prev.Raw); err != nil {
			log.Warn("remove replaced blob", "err", err)
		}
	}
	j.discard()
	if _, err := im.store.Manifest(rec.Name); err != nil { // deploy waves' piece hashes (pieces.go)
		log.Warn("piece manifest not made; plans fall back to whole-image fetches until it is", "err", err)
	}
	log.Info("image stored", "raw", raw.String(), "format", rec.SourceFormat, "bytes", size)
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
	_ = os.Remove(p + manifestSuffix) // its piece manifest (pieces.go), if made
	return nil
}
