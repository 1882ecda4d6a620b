package controller

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/state"
)

// FirmwarePath is where the controller serves offered firmware files:
// GET/HEAD {FirmwarePath}{token}/{file}.
const FirmwarePath = "/firmware/"

// Bounds of the firmware handler: an offer lives at most this long
// (an update's download from a BMC on a slow management network, and
// its retries, fit in it), and at most this many transfers run at once
// (a BMC fetches one file per update; the bound keeps a misbehaving BMC
// or a leaked URL from taking the controller's disk and uplink).
const (
	firmwareOfferTTL      = 2 * time.Hour
	firmwareMaxTransfers  = 8
	firmwareTokenBytes    = 32
	firmwareRetryAfterSec = "30"
)

// firmwareOffers serves the firmware catalog's files (images.yaml
// firmware, imported into the image store) to BMCs; it implements
// reconciler.FirmwareImages.
//
// Gate: an unguessable path. A BMC is handed only a URI
// (UpdateService.SimpleUpdate ImageURI, DSP0268): it sends no bearer
// token of ours, and SimpleUpdate's Username/Password are credentials
// for the transfer protocol's server that vendors honour unevenly. So
// each offer gets 256 random bits as a path segment, valid for one
// image, until the firmware step releases it or firmwareOfferTTL ends;
// the map holds only the SHA-256 of each token, so a lookup reveals
// nothing through timing. The file is hashed again before every offer
// (images.Store.VerifyImage): a blob corrupted at rest is never offered.
// Offers live in memory: after a restart the resumed step offers anew.
type firmwareOffers struct {
	store *images.Store
	base  string // public URL + FirmwarePath, as BMCs reach the controller
	log   *slog.Logger
	now   func() time.Time
	ttl   time.Duration
	slots chan struct{} // transfers running

	fails *importFailures // the import's last failure per name; nil: none kept

	mu     sync.Mutex
	offers map[string]firmwareOffer // by hex SHA-256 of the token
}

// Ready implements reconciler.FirmwareImages: nil once the file is
// imported and verified, else the import's failure or its state.
func (o *firmwareOffers) Ready(name string) error {
	rec, err := o.store.Lookup(name)
	if err == nil && rec.State == images.StateVerified {
		return nil
	}
	if o.fails != nil {
		if ferr := o.fails.reason(name); ferr != nil {
			return fmt.Errorf("firmware image %s: %w", name, ferr)
		}
	}
	if err != nil {
		return fmt.Errorf("firmware image %s: %w", name, err)
	}
	return fmt.Errorf("firmware image %s is %s, not verified yet", name, rec.State)
}

type firmwareOffer struct {
	image, file string
	expires     time.Time
}

func newFirmwareOffers(store *images.Store, publicURL string, log *slog.Logger) *firmwareOffers {
	return &firmwareOffers{store: store, base: strings.TrimSuffix(publicURL, "/") + FirmwarePath, log: log, now: time.Now,
		ttl: firmwareOfferTTL, slots: make(chan struct{}, firmwareMaxTransfers), offers: map[string]firmwareOffer{}}
}

// safeFile is a file name that goes into a URL path unescaped.
var safeFile = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$`)

// verify hashes the stored file again and returns its record and the
// file name BMCs are given: the catalog URL's last path segment (BMCs
// check it: iDRAC's .exe or .d9, iLO's .fwpkg), else the image's name.
func (o *firmwareOffers) verify(ctx context.Context, name, checksum string) (images.Record, string, error) {
	var want images.Digest
	if checksum != "" {
		d, err := images.ParseDigest(checksum)
		if err != nil {
			return images.Record{}, "", fmt.Errorf("firmware image %s: %w", name, err)
		}
		want = d
	}
	rec, err := o.store.VerifyImage(ctx, name, want)
	if err != nil {
		return images.Record{}, "", fmt.Errorf("firmware image %s: %w", name, err)
	}
	file := name
	if u, err := url.Parse(rec.Source); err == nil && safeFile.MatchString(path.Base(u.Path)) {
		file = path.Base(u.Path)
	}
	return rec, file, nil
}

// Offer implements reconciler.FirmwareImages.
func (o *firmwareOffers) Offer(ctx context.Context, name, checksum string) (string, func(), error) {
	_, file, err := o.verify(ctx, name, checksum)
	if err != nil {
		return "", nil, err
	}
	b := make([]byte, firmwareTokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", nil, fmt.Errorf("firmware image %s: token: %w", name, err)
	}
	token := hex.EncodeToString(b)
	key := tokenKey(token)
	o.mu.Lock()
	now := o.now()
	for k, of := range o.offers {
		if now.After(of.expires) {
			delete(o.offers, k)
		}
	}
	o.offers[key] = firmwareOffer{image: name, file: file, expires: now.Add(o.ttl)}
	o.mu.Unlock()
	o.log.Info("firmware image offered", "image", name, "file", file, "expires", now.Add(o.ttl).UTC())
	release := func() {
		o.mu.Lock()
		delete(o.offers, key)
		o.mu.Unlock()
	}
	return o.base + token + "/" + file, release, nil
}

// Open implements reconciler.FirmwareImages.
func (o *firmwareOffers) Open(ctx context.Context, name, checksum string) (io.ReadCloser, string, error) {
	rec, file, err := o.verify(ctx, name, checksum)
	if err != nil {
		return nil, "", err
	}
	f, got, err := o.store.OpenImage(name)
	if err != nil {
		return nil, "", fmt.Errorf("firmware image %s: %w", name, err)
	}
	if got.Raw != rec.Raw {
		f.Close()
		return nil, "", fmt.Errorf("firmware image %s: replaced while opened", name)
	}
	return f, file, nil
}

func tokenKey(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// errNoOffer: the token is unknown, expired or released, or names
// another file.
var errNoOffer = errors.New("no such offer")

func (o *firmwareOffers) lookup(token, file string) (firmwareOffer, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	of, ok := o.offers[tokenKey(token)]
	if !ok || o.now().After(of.expires) || of.file != file {
		return firmwareOffer{}, errNoOffer
	}
	return of, nil
}

// ServeHTTP serves GET/HEAD {FirmwarePath}{token}/{file} while the offer
// lives, with Range (BMCs resume), the file's SHA-256 in
// X-Machina-Checksum and as the ETag. 404 for anything else than a live
// offer (an unknown, expired or released token says no more than a
// wrong path), 405 for other methods, 503 with Retry-After when
// firmwareMaxTransfers are running.
func (o *firmwareOffers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	rest, _ := strings.CutPrefix(r.URL.Path, FirmwarePath)
	token, file, ok := strings.Cut(rest, "/")
	if !ok || len(token) != 2*firmwareTokenBytes {
		http.NotFound(w, r)
		return
	}
	of, err := o.lookup(token, file)
	if err != nil {
		o.log.Warn("firmware request refused", "remote", r.RemoteAddr, "err", err)
		http.NotFound(w, r)
		return
	}
	select {
	case o.slots <- struct{}{}:
		defer func() { <-o.slots }()
	default:
		w.Header().Set("Retry-After", firmwareRetryAfterSec)
		http.Error(w, "too many firmware transfers", http.StatusServiceUnavailable)
		return
	}
	f, rec, err := o.store.OpenImage(of.image)
	if err != nil {
		o.log.Error("open firmware image", "image", of.image, "err", err)
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	o.log.Info("firmware image fetched", "image", of.image, "remote", r.RemoteAddr, "range", r.Header.Get("Range"))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("ETag", `"`+rec.Raw.String()+`"`)
	w.Header().Set(images.ChecksumHeader, rec.Raw.String())
	w.Header().Set("Cache-Control", "no-store")
	http.ServeContent(w, r, "", st.ModTime(), f)
}

// MountFirmwareRead adds GET /api/v1/servers/{name}/firmware (admin
// token, viewer): the server's last firmware read (state.Firmware: BIOS
// attributes and registry, storage, firmware inventory, Secure Boot, the
// volumes Machina created), what `machinactl plan` checks a profile's
// firmware block against. 404 when the server is unknown or its
// firmware was never read.
func MountFirmwareRead(srv *api.Server, st *state.Store) error {
	return srv.HandleAdmin("GET /api/v1/servers/{name}/firmware", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := st.Server(r.PathValue("name"))
		switch {
		case errors.Is(err, state.ErrNotFound):
			writeErr(w, http.StatusNotFound, "not_found", "no server "+r.PathValue("name"))
		case err != nil:
			writeErr(w, http.StatusInternalServerError, "internal", "read the server: "+err.Error())
		case s.Firmware == nil:
			writeErr(w, http.StatusNotFound, "not_read", "the firmware of "+s.Name+" has not been read from its BMC")
		default:
			writeJSON(w, http.StatusOK, s.Firmware)
		}
	}))
}
