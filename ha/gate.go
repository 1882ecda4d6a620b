package ha

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// ForwardedHeader marks a request a standby forwarded to the leader, with
// the standby's id. A request that arrives with it at a controller that is
// not the leader either is refused (503) rather than forwarded again, so
// two controllers that each think the other leads never loop.
const ForwardedHeader = "X-Machina-Forwarded-By"

// LeaderView is what [Gate] needs of an [Elector].
type LeaderView interface {
	IsLeader() bool
	Leader() (Candidate, bool)
}

// GateConfig configures [Gate].
type GateConfig struct {
	// Leader tells whether this controller leads and who does. Required.
	Leader LeaderView
	// Self is this controller's id (ForwardedHeader's value).
	Self string
	// Transport reaches the leader's admin API; it must trust the admin
	// API's certificate (the same CA bundle machinactl uses). Nil: a clone
	// of http.DefaultTransport (system roots).
	Transport http.RoundTripper
	// RetryAfter is the Retry-After of a 503 while no leader is known.
	// Zero: 10 s (one default TTL).
	RetryAfter time.Duration
	// Logger: Warn when forwarding fails. Nil: discard.
	Logger *slog.Logger
}

// Gate returns middleware for the admin API of a controller in a group:
// on the leader it passes every request through; on a standby it serves
// reads (GET, HEAD, OPTIONS) from the shared store and forwards writes to
// the leader's admin URL (a reverse proxy: the caller's Authorization
// header and body go along unchanged, so the leader authenticates and
// authorises the request itself; X-Forwarded-For names the caller). With
// no leader, or a leader without an admin URL, writes answer 503 with
// Retry-After and code "unavailable".
func Gate(cfg GateConfig) (func(http.Handler) http.Handler, error) {
	if cfg.Leader == nil {
		return nil, errors.New("ha: gate: Leader is required")
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = 10 * time.Second
	}
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	retry := strconv.Itoa(int((cfg.RetryAfter + time.Second - 1) / time.Second))
	unavailable := func(w http.ResponseWriter, msg string) {
		w.Header().Set("Retry-After", retry)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(v1.Error{Message: msg, Code: v1.CodeUnavailable})
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.Method {
			case http.MethodGet, http.MethodHead, http.MethodOptions:
				next.ServeHTTP(w, r)
				return
			}
			if cfg.Leader.IsLeader() {
				next.ServeHTTP(w, r)
				return
			}
			if by := r.Header.Get(ForwardedHeader); by != "" {
				unavailable(w, "this controller is not the leader (request forwarded by "+by+"); the leader changed, retry")
				return
			}
			c, ok := cfg.Leader.Leader()
			if !ok || c.AdminURL == "" || c.ID == cfg.Self {
				unavailable(w, "this controller is a standby and no leader is known; retry")
				return
			}
			target, err := url.Parse(c.AdminURL)
			if err != nil || (target.Scheme != "https" && target.Scheme != "http") || target.Host == "" {
				unavailable(w, "the leader advertises no usable admin URL")
				return
			}
			rp := &httputil.ReverseProxy{
				Rewrite: func(pr *httputil.ProxyRequest) {
					pr.SetURL(target)
					pr.SetXForwarded()
					pr.Out.Host = target.Host
					pr.Out.Header.Set(ForwardedHeader, cfg.Self)
				},
				Transport: cfg.Transport,
				ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
					log.Warn("ha: forward to leader", "leader", c.ID, "method", r.Method, "path", r.URL.Path, "err", err)
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusBadGateway)
					_ = json.NewEncoder(w).Encode(v1.Error{Message: "forwarding to the leader " + c.ID + " failed", Code: v1.CodeUnavailable})
				},
			}
			rp.ServeHTTP(w, r)
		})
	}, nil
}
