package images

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"golang.org/x/time/rate"
)

// ErrTokenRejected is what a [TokenChecker] returns (wrapped) for a missing,
// unknown, expired or already-used token; the handler answers 403.
var ErrTokenRejected = errors.New("deploy token rejected")

// TokenChecker authorises the ramdisk's image requests. CheckImageToken
// returns nil when token allows reading image, an error wrapping
// [ErrTokenRejected] when it does not, and any other error for a failure of
// the checker itself (the handler answers 503). The ramdisk may issue
// several Range requests for one deploy (resuming), so the token SHOULD be
// short-lived rather than consumed by the first request. Implementations
// MUST be safe for concurrent use and compare tokens in constant time
// against stored hashes.
type TokenChecker interface {
	CheckImageToken(ctx context.Context, token, image string) error
}

// HandlerConfig configures [NewHandler].
type HandlerConfig struct {
	// Store holds the images. Required.
	Store *Store
	// Tokens authorises requests. Required: images are never served ungated.
	Tokens TokenChecker
	// Prefix is the URL path the handler is mounted at; "" means "/images/".
	Prefix string
	// Logger logs refused requests; nil discards.
	Logger *slog.Logger
	// EgressBytesPerSecond caps the bytes per second of all image
	// responses together (one token bucket, egress.go), so deploys leave
	// the controller's uplink room for everything else; zero or less is
	// unlimited.
	EgressBytesPerSecond int64
}

// Handler serves raw images at GET/HEAD {Prefix}{name} with
// "Authorization: Bearer <token>". It answers with Range support
// (RFC 9110 section 14; via http.ServeContent over the *os.File, which lets
// net/http use sendfile(2)), an ETag of the raw digest, and the header
// X-Machina-Checksum: sha256:<hex> that the ramdisk verifies before writing.
// Status codes: 401 no token, 403 token rejected, 404 unknown or unverified
// image, 405 other methods, 503 token checker failure.
type Handler struct {
	store  *Store
	tokens TokenChecker
	prefix string
	log    *slog.Logger
	egress *rate.Limiter
}

// NewHandler returns a Handler for cfg.
func NewHandler(cfg HandlerConfig) (*Handler, error) {
	if cfg.Store == nil || cfg.Tokens == nil {
		return nil, errors.New("images: new handler: Store and Tokens are required")
	}
	h := &Handler{store: cfg.Store, tokens: cfg.Tokens, prefix: cfg.Prefix, log: cfg.Logger, egress: newEgress(cfg.EgressBytesPerSecond)}
	if h.prefix == "" {
		h.prefix = "/images/"
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	return h, nil
}

// ChecksumHeader carries the raw image's digest ("sha256:<hex>").
const ChecksumHeader = "X-Machina-Checksum"

// ServeHTTP implements http.Handler; see [Handler] for the contract.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, h.prefix)
	if !ok || ValidateName(name) != nil {
		http.NotFound(w, r)
		return
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="machina-images"`)
		http.Error(w, "deploy token required", http.StatusUnauthorized)
		return
	}
	if err := h.tokens.CheckImageToken(r.Context(), token, name); err != nil {
		if errors.Is(err, ErrTokenRejected) {
			h.log.Warn("image request refused", "image", name, "remote", r.RemoteAddr, "err", err)
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		h.log.Error("image token check", "image", name, "err", err)
		http.Error(w, "token check unavailable", http.StatusServiceUnavailable)
		return
	}
	f, rec, err := h.store.OpenImage(name)
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			h.log.Error("open image", "image", name, "err", err)
		}
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("ETag", `"`+rec.Raw.String()+`"`)
	w.Header().Set(ChecksumHeader, rec.Raw.String())
	w.Header().Set("Cache-Control", "no-store")
	if h.egress != nil {
		w = &pacedWriter{ResponseWriter: w, ctx: r.Context(), lim: h.egress}
	}
	http.ServeContent(w, r, "", st.ModTime(), f)
}
