// Package eventsout delivers the controller's events to outgoing webhooks
// as CloudEvents 1.0 (JSON event format, structured content mode: one
// event per POST, Content-Type application/cloudevents+json).
//
// The queue is the state store's event log itself (state.Store.Events,
// the machine and audit logs merged by Seq): each webhook keeps a
// delivery cursor, the Seq of the last event it delivered, in the store
// (state.Store.WebhookCursor), so deliveries resume after a restart where
// they stopped. Delivery is at least once, in Seq order: an event is
// retried, with exponential backoff, until the receiver answers 2xx; the
// cursor moves only past a delivered (or filtered-out) event. Events the
// log's retention evicted before delivery (a Seq gap after the cursor)
// are counted in machina_webhook_dropped_total and recorded as one
// state.EventWebhookDropped event, never skipped silently.
//
// Each request is signed: X-Machina-Timestamp is the Unix time in
// seconds, X-Machina-Signature is "sha256=" and the lower-case hex
// HMAC-SHA256, keyed with the webhook's secret, of the timestamp, ".",
// and the request body (Verify checks it).
package eventsout

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/machina-metal/machina/state"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Config.
const (
	DefaultTimeout    = 10 * time.Second // one delivery attempt, connection to response
	DefaultMinBackoff = time.Second      // wait after the first failed attempt
	DefaultMaxBackoff = time.Minute      // the backoff doubles up to this
	DefaultSource     = "machina"        // CloudEvents source without a controller URL
	// ContentType is the CloudEvents structured-mode media type
	// (CloudEvents HTTP protocol binding 1.0, section 3.2).
	ContentType = "application/cloudevents+json"
	// HeaderTimestamp and HeaderSignature carry the request's signature.
	HeaderTimestamp = "X-Machina-Timestamp"
	HeaderSignature = "X-Machina-Signature"
	// TypePrefix prefixes an event's Kind in its CloudEvents type.
	TypePrefix = "io.machina."
)

// pageSize is how many events one read of the log returns.
const pageSize = 100

// Webhook is one outgoing webhook.
type Webhook struct {
	// URL is where events are POSTed: http or https, with a host.
	URL string
	// Secret keys the HMAC-SHA256 signature; it must not be empty.
	Secret []byte
	// Kinds, if set, delivers only events whose Kind starts with one of
	// these prefixes ("lifecycle", "server.", "webhook."); empty delivers
	// every event.
	Kinds []string
}

// Name is the webhook's name in metrics, logs and its stored cursor:
// URL without user information, query or fragment.
func (w Webhook) Name() string {
	u, err := url.Parse(w.URL)
	if err != nil {
		return w.URL
	}
	u.User, u.RawQuery, u.Fragment, u.ForceQuery = nil, "", "", false
	return u.String()
}

// Validate checks w: an absolute http or https URL with a host, without
// user information, and a non-empty secret.
func (w Webhook) Validate() error {
	u, err := url.Parse(w.URL)
	if err != nil {
		return fmt.Errorf("eventsout: webhook URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("eventsout: webhook URL %q: scheme %q, want http or https", w.Name(), u.Scheme)
	}
	if u.Host == "" {
		return fmt.Errorf("eventsout: webhook URL %q: no host", w.Name())
	}
	if u.User != nil {
		return fmt.Errorf("eventsout: webhook URL %q: user information in the URL (the secret file signs requests)", w.Name())
	}
	if len(w.Secret) == 0 {
		return fmt.Errorf("eventsout: webhook %q: empty secret", w.Name())
	}
	return nil
}

// Config configures a Sender.
type Config struct {
	// Store is the state store whose event log is delivered. Required.
	Store *state.Store
	// Webhooks are the receivers; each has its own cursor and goroutine.
	Webhooks []Webhook
	// Source is the CloudEvents source (the controller's URL); "" means
	// DefaultSource.
	Source string
	// Timeout bounds one delivery attempt; zero means DefaultTimeout.
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between attempts of one
	// event (doubling from MinBackoff); zero means the defaults.
	MinBackoff, MaxBackoff time.Duration
	// Poll is how often the log is read without a store notification;
	// zero means 5 s.
	Poll time.Duration
	// Client sends the requests; nil means a client with Timeout.
	Client *http.Client
	// Logger receives delivery failures and drops; nil discards.
	Logger *slog.Logger
	// Now is the clock of the signature timestamp; nil means time.Now.
	Now func() time.Time
}

// Sender delivers the event log to Config.Webhooks.
type Sender struct {
	cfg                        Config
	delivered, failed, dropped *prometheus.CounterVec
}

// New validates cfg and returns its Sender. Errors name the webhook at
// fault.
func New(cfg Config) (*Sender, error) {
	if cfg.Store == nil {
		return nil, errors.New("eventsout: no state store")
	}
	seen := map[string]bool{}
	for _, w := range cfg.Webhooks {
		if err := w.Validate(); err != nil {
			return nil, err
		}
		if seen[w.Name()] {
			return nil, fmt.Errorf("eventsout: webhook %q configured twice", w.Name())
		}
		seen[w.Name()] = true
	}
	if cfg.Source == "" {
		cfg.Source = DefaultSource
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 5 * time.Second
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.Timeout}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Sender{cfg: cfg,
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "machina_webhook_delivered_total",
			Help: "Events an outgoing webhook answered 2xx to, by webhook."}, []string{"webhook"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "machina_webhook_failed_total",
			Help: "Failed delivery attempts (error, timeout or non-2xx answer; each is retried), by webhook."}, []string{"webhook"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "machina_webhook_dropped_total",
			Help: "Events evicted from the event log before an outgoing webhook received them, by webhook."}, []string{"webhook"}),
	}, nil
}

// Collectors are the Sender's metrics, to register with a registry.
func (s *Sender) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.delivered, s.failed, s.dropped}
}

// Run delivers to every webhook until ctx is done, then returns nil. A
// store error is logged and retried after the backoff, never fatal.
func (s *Sender) Run(ctx context.Context) error {
	done := make(chan struct{}, len(s.cfg.Webhooks))
	for _, w := range s.cfg.Webhooks {
		go func() {
			defer func() { done <- struct{}{} }()
			s.run(ctx, w)
		}()
	}
	for range s.cfg.Webhooks {
		<-done
	}
	return nil
}

// run is one webhook's loop: read the log after the cursor, deliver, wait
// for a store notification or the poll.
func (s *Sender) run(ctx context.Context, w Webhook) {
	name := w.Name()
	log := s.cfg.Logger.With("webhook", name)
	// Touch every series so a scrape shows zeros from the start.
	s.delivered.WithLabelValues(name)
	s.failed.WithLabelValues(name)
	s.dropped.WithLabelValues(name)
	wake, stop := s.cfg.Store.Notify()
	defer stop()
	backoff := s.cfg.MinBackoff
	var cursor uint64
	for ctx.Err() == nil {
		c, err := s.cfg.Store.WebhookCursor(name)
		if err == nil {
			cursor = c
			break
		}
		log.Warn("webhook: read the delivery cursor", "err", err)
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
	for ctx.Err() == nil {
		var more bool
		var err error
		cursor, more, err = s.pass(ctx, w, cursor, log)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("webhook: read the event log", "err", err)
			if !sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, s.cfg.MaxBackoff)
			continue
		}
		backoff = s.cfg.MinBackoff
		if more {
			continue
		}
		t := time.NewTimer(s.cfg.Poll)
		select {
		case <-ctx.Done():
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// pass delivers one page of events after cursor (w's stored cursor, kept
// in memory between passes: reading it is a write when it is missing) and
// returns the cursor it stored; more reports a full page (read again at
// once). On an error the returned cursor is the last one stored.
func (s *Sender) pass(ctx context.Context, w Webhook, cursor uint64, log *slog.Logger) (stored uint64, more bool, err error) {
	name := w.Name()
	st := s.cfg.Store
	stored = cursor
	// Every Seq up to last was assigned before the read below: one not
	// returned by it was evicted.
	last, err := st.LastEventSeq()
	if err != nil {
		return stored, false, err
	}
	evs, err := st.Events(state.EventQuery{After: cursor, Limit: pageSize})
	if err != nil {
		return stored, false, err
	}
	moved := cursor
	for _, e := range evs {
		if gap := e.Seq - moved - 1; e.Seq > moved+1 {
			if err := s.drop(name, e.Seq-1, gap, log); err != nil {
				return stored, false, err
			}
			stored = e.Seq - 1
		}
		if w.wants(e.Kind) {
			if err := s.deliver(ctx, w, e, log); err != nil {
				return stored, false, err
			}
			if err := st.SetWebhookCursor(name, e.Seq, 0); err != nil {
				return stored, false, err
			}
			stored = e.Seq
		}
		moved = e.Seq
	}
	if len(evs) < pageSize && last > moved {
		// The rest of the log up to last is gone.
		if err := s.drop(name, last, last-moved, log); err != nil {
			return stored, false, err
		}
		moved, stored = last, last
	}
	if moved > stored {
		// Events the Kinds filter passed over.
		if err := st.SetWebhookCursor(name, moved, 0); err != nil {
			return stored, false, err
		}
		stored = moved
	}
	return stored, len(evs) == pageSize, nil
}

// drop records n events up to seq evicted before delivery: the metric,
// the log line, and (with the cursor move) one state event.
func (s *Sender) drop(name string, seq, n uint64, log *slog.Logger) error {
	if err := s.cfg.Store.SetWebhookCursor(name, seq, n); err != nil {
		return err
	}
	s.dropped.WithLabelValues(name).Add(float64(n))
	log.Warn("webhook: events evicted from the log before delivery", "dropped", n, "through_seq", seq)
	return nil
}

// wants reports whether an event of kind passes w's Kinds filter.
func (w Webhook) wants(kind state.EventKind) bool {
	if len(w.Kinds) == 0 {
		return true
	}
	for _, p := range w.Kinds {
		if strings.HasPrefix(string(kind), p) {
			return true
		}
	}
	return false
}

// deliver POSTs e until w answers 2xx, backing off between attempts; it
// returns only ctx's error.
func (s *Sender) deliver(ctx context.Context, w Webhook, e state.Event, log *slog.Logger) error {
	body, err := json.Marshal(Envelope(s.cfg.Source, e))
	if err != nil {
		return fmt.Errorf("encode event %d: %w", e.Seq, err)
	}
	name := w.Name()
	backoff := s.cfg.MinBackoff
	for {
		err := s.post(ctx, w, body)
		if err == nil {
			s.delivered.WithLabelValues(name).Inc()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.failed.WithLabelValues(name).Inc()
		log.Warn("webhook: delivery failed", "seq", e.Seq, "err", err, "retry_in", backoff)
		if !sleep(ctx, backoff) {
			return ctx.Err()
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
}

// post sends one signed attempt, bounded by Timeout.
func (s *Sender) post(ctx context.Context, w Webhook, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("post: %w", err)
	}
	ts := strconv.FormatInt(s.cfg.Now().Unix(), 10)
	req.Header.Set("Content-Type", ContentType)
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, Sign(w.Secret, ts, body))
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return fmt.Errorf("post: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("post: answered %s", resp.Status)
	}
	return nil
}

// CloudEvent is a CloudEvents 1.0 event in the JSON event format
// (structured content mode) as Machina sends it.
type CloudEvent struct {
	SpecVersion     string      `json:"specversion"`       // "1.0"
	ID              string      `json:"id"`                // the event's Seq, decimal
	Source          string      `json:"source"`            // the controller's URL, or DefaultSource
	Type            string      `json:"type"`              // TypePrefix + Kind
	Time            time.Time   `json:"time"`              // the event's At (RFC 3339)
	Subject         string      `json:"subject,omitempty"` // the server (or host) the event is about
	DataContentType string      `json:"datacontenttype"`   // "application/json"
	Data            state.Event `json:"data"`
}

// Envelope wraps e as a CloudEvent from source.
func Envelope(source string, e state.Event) CloudEvent {
	return CloudEvent{SpecVersion: "1.0", ID: strconv.FormatUint(e.Seq, 10), Source: source,
		Type: TypePrefix + string(e.Kind), Time: e.At, Subject: e.Server,
		DataContentType: "application/json", Data: e}
}

// Sign returns the X-Machina-Signature value of body sent at timestamp
// ts (Unix seconds, decimal): "sha256=" and the hex HMAC-SHA256 keyed with
// secret over ts + "." + body.
func Sign(secret []byte, ts string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Verify checks a received request's timestamp and signature headers as
// a receiver should: the signature must match (compared in constant time)
// and the timestamp must lie within maxSkew of now, which rejects a
// replayed old request. Errors say which check failed.
func Verify(secret []byte, ts, sig string, body []byte, now time.Time, maxSkew time.Duration) error {
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("eventsout: verify: timestamp %q: %w", ts, err)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > maxSkew || d < -maxSkew {
		return fmt.Errorf("eventsout: verify: timestamp %s is %s from now, more than %s", ts, d.Round(time.Second), maxSkew)
	}
	if !hmac.Equal([]byte(sig), []byte(Sign(secret, ts, body))) {
		return errors.New("eventsout: verify: signature does not match")
	}
	return nil
}

// sleep waits d or until ctx is done; false means ctx is done.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
