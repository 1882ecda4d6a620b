package gitops

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"
)

// WebhookConfig configures a [Webhook].
type WebhookConfig struct {
	// SecretFile holds the webhook secret shared with the Git host
	// (surrounding white space trimmed); read at each delivery, so a
	// rotated secret needs no restart. Required.
	SecretFile string
	// Branch, if set, is the inventory branch: a push to another branch
	// is acknowledged without a poll.
	Branch string
	// Trigger is called for each accepted push (Source.Trigger: it
	// coalesces and never blocks). Required.
	Trigger func()
	// MaxBodyBytes bounds a delivery's body; a larger one gets 413. Zero
	// means 1 MiB (push payloads are a few KiB; GitHub's cap is 25 MB).
	MaxBodyBytes int64
	// Rate is how many deliveries a second are verified from one source
	// address (an IPv6 source counted per /64), with Burst at once; more
	// get 429 before their body is read. Counted per source, a client
	// flooding unsigned deliveries exhausts only its own share, not the
	// Git host's (behind a reverse proxy every delivery shares the
	// proxy's address). Zeros mean 2 a second and a burst of 10.
	Rate  float64
	Burst int
	// Logger gets Info for accepted pushes, Warn for refused deliveries;
	// nil discards.
	Logger *slog.Logger
	// now is the clock (tests); nil means time.Now.
	now func() time.Time
}

// Webhook receives push notifications from Git hosts and triggers a poll:
// a push reaches the controller at once instead of at the next poll
// interval. It answers POSTs signed with the shared secret the way each
// host signs them:
//
//   - GitHub: X-Hub-Signature-256: sha256=HEX, HMAC-SHA256 of the body
//     (X-GitHub-Event: push; ping is acknowledged);
//   - Gitea and Forgejo: X-Gitea-Signature or X-Forgejo-Signature: HEX,
//     HMAC-SHA256 of the body (X-Gitea-Event: push);
//   - GitLab: X-Gitlab-Token: the secret itself (X-Gitlab-Event: Push Hook).
//
// Comparisons are constant-time. Answers: 202 a push accepted (a poll is
// triggered), 200 acknowledged without a poll (ping, another event or
// branch), 401 missing or wrong signature, 405 not a POST, 413 body over
// MaxBodyBytes, 429 over the rate, 500 the secret file unreadable. The
// body is never logged. It needs no admin token: the signature is the
// authentication. Safe for concurrent use.
type Webhook struct {
	cfg WebhookConfig
	log *slog.Logger

	mu      sync.Mutex
	sources map[string]*webhookBucket // by source key (webhookSource)
	// refusedAt is when a refusal was last logged; refusedQuiet counts
	// the refusals not logged since (refusedLog).
	refusedAt    time.Time
	refusedQuiet int
}

// webhookBucket is one source's token bucket.
type webhookBucket struct {
	tokens float64
	last   time.Time
}

// maxWebhookSources bounds the buckets kept. Past it, buckets back at
// their burst are dropped first, then arbitrary ones: a dropped bucket
// starts again full, so dropping never refuses anyone.
const maxWebhookSources = 4096

// NewWebhook checks cfg and returns the handler; errors wrap
// ErrRemoteConfig.
func NewWebhook(cfg WebhookConfig) (*Webhook, error) {
	if cfg.SecretFile == "" || cfg.Trigger == nil {
		return nil, fmt.Errorf("webhook: %w: SecretFile and Trigger are required", ErrRemoteConfig)
	}
	if _, err := readSecret(cfg.SecretFile); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 2
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 10
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Webhook{cfg: cfg, log: log.With("component", "webhook"), sources: map[string]*webhookBucket{}}, nil
}

func readSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: read webhook secret: %w", ErrRemoteConfig, err)
	}
	s := []byte(strings.TrimSpace(string(b)))
	if len(s) == 0 {
		return nil, fmt.Errorf("%w: webhook secret file %s is empty", ErrRemoteConfig, path)
	}
	return s, nil
}

// allow takes one token of source's bucket.
func (h *Webhook) allow(source string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.cfg.now()
	burst := float64(h.cfg.Burst)
	b, ok := h.sources[source]
	if !ok {
		if len(h.sources) >= maxWebhookSources {
			h.prune(now)
		}
		b = &webhookBucket{tokens: burst, last: now}
		h.sources[source] = b
	}
	b.tokens = min(burst, b.tokens+now.Sub(b.last).Seconds()*h.cfg.Rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// prune drops the buckets refilled to their burst by now, and if that
// leaves the map full, arbitrary ones until it has room. h.mu is held.
func (h *Webhook) prune(now time.Time) {
	full := time.Duration(float64(h.cfg.Burst) / h.cfg.Rate * float64(time.Second))
	for k, b := range h.sources {
		if now.Sub(b.last) >= full {
			delete(h.sources, k)
		}
	}
	for k := range h.sources {
		if len(h.sources) < maxWebhookSources {
			break
		}
		delete(h.sources, k)
	}
}

// refusedLog logs a refused delivery at Warn, at most one line a second
// (with the rate counted per source, many sources could otherwise write
// a line per delivery each); the line counts the refusals left unlogged
// before it.
func (h *Webhook) refusedLog(msg string, args ...any) {
	h.mu.Lock()
	now := h.cfg.now()
	if !h.refusedAt.IsZero() && now.Sub(h.refusedAt) < time.Second {
		h.refusedQuiet++
		h.mu.Unlock()
		return
	}
	quiet := h.refusedQuiet
	h.refusedAt, h.refusedQuiet = now, 0
	h.mu.Unlock()
	h.log.Warn(msg, append(args, "unlogged_before", quiet)...)
}

// webhookSource is the rate limiter's key for a request from remoteAddr
// (HOST:PORT): the IPv4 address, or the IPv6 address's /64 (one host
// holds a whole /64 and can send from any address in it).
func webhookSource(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

var errBadSignature = errors.New("missing or wrong signature")

// ServeHTTP implements http.Handler.
func (h *Webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	if !h.allow(webhookSource(r.RemoteAddr)) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many deliveries", http.StatusTooManyRequests)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			h.refusedLog("webhook delivery refused: body too large", "limit", h.cfg.MaxBodyBytes, "from", r.RemoteAddr)
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	secret, err := readSecret(h.cfg.SecretFile)
	if err != nil {
		h.log.Error("webhook secret unreadable", "err", err)
		http.Error(w, "webhook not configured", http.StatusInternalServerError)
		return
	}
	host, event, err := verify(r.Header, body, secret)
	if err != nil {
		h.refusedLog("webhook delivery refused", "err", err.Error(), "from", r.RemoteAddr)
		http.Error(w, "unauthorised", http.StatusUnauthorized)
		return
	}
	delivery := firstNonEmpty(r.Header.Get("X-GitHub-Delivery"), r.Header.Get("X-Gitea-Delivery"), r.Header.Get("X-Gitlab-Event-UUID"))
	if !isPush(event) {
		h.log.Debug("webhook event ignored", "host", host, "event", event, "delivery", delivery)
		w.WriteHeader(http.StatusOK)
		return
	}
	var payload struct {
		Ref string `json:"ref"`
	}
	_ = json.Unmarshal(body, &payload)
	if h.cfg.Branch != "" && payload.Ref != "" && payload.Ref != "refs/heads/"+h.cfg.Branch {
		h.log.Debug("webhook push to another branch ignored", "host", host, "ref", payload.Ref, "delivery", delivery)
		w.WriteHeader(http.StatusOK)
		return
	}
	h.log.Info("webhook push, polling the inventory now", "host", host, "ref", payload.Ref, "delivery", delivery)
	h.cfg.Trigger()
	w.WriteHeader(http.StatusAccepted)
}

// verify checks the delivery's signature against secret and returns the
// host kind and the event name.
func verify(hd http.Header, body, secret []byte) (host, event string, err error) {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	sum := mac.Sum(nil)
	hexEqual := func(got string) bool {
		b, err := hex.DecodeString(strings.TrimSpace(got))
		return err == nil && hmac.Equal(b, sum)
	}
	switch {
	case hd.Get("X-Hub-Signature-256") != "":
		v, ok := strings.CutPrefix(hd.Get("X-Hub-Signature-256"), "sha256=")
		if !ok || !hexEqual(v) {
			return "github", "", errBadSignature
		}
		return "github", hd.Get("X-GitHub-Event"), nil
	case hd.Get("X-Gitea-Signature") != "" || hd.Get("X-Forgejo-Signature") != "":
		if !hexEqual(firstNonEmpty(hd.Get("X-Forgejo-Signature"), hd.Get("X-Gitea-Signature"))) {
			return "gitea", "", errBadSignature
		}
		return "gitea", firstNonEmpty(hd.Get("X-Forgejo-Event"), hd.Get("X-Gitea-Event")), nil
	case hd.Get("X-Gitlab-Token") != "":
		if subtle.ConstantTimeCompare([]byte(hd.Get("X-Gitlab-Token")), secret) != 1 {
			return "gitlab", "", errBadSignature
		}
		return "gitlab", hd.Get("X-Gitlab-Event"), nil
	}
	return "", "", errBadSignature
}

func isPush(event string) bool {
	return event == "push" || event == "Push Hook"
}

func firstNonEmpty(v ...string) string {
	for _, s := range v {
		if s != "" {
			return s
		}
	}
	return ""
}
