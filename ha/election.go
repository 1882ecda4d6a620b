package ha

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Reasons a term ends; context.Cause of the OnElected context and the
// reason given to OnDeposed wrap one of them.
var (
	// ErrLeaseLost: etcd answered that the session lease is gone (expired
	// or revoked), or the session ended.
	ErrLeaseLost = errors.New("ha: session lease lost")
	// ErrUnreachable: no keepalive was answered for long enough that the
	// lease may have lapsed on the server (etcd unreachable, partitioned
	// or too slow).
	ErrUnreachable = errors.New("ha: etcd unreachable for a lease TTL")
	// ErrKeyGone: the election key of this term was deleted or replaced
	// (e.g. by an operator's `etcdctl del`).
	ErrKeyGone = errors.New("ha: election key deleted")
	// ErrResigned: OnElected returned before its context ended, so the
	// candidate gave up leadership.
	ErrResigned = errors.New("ha: resigned")
	// ErrShutdown: Run's context ended.
	ErrShutdown = errors.New("ha: shutting down")
)

// Candidate is what a controller campaigns with: the JSON value of its
// election key, which standbys read to find the leader.
type Candidate struct {
	// ID names the controller, unique in the group (e.g. its host name).
	ID string `json:"id"`
	// AdminURL is the base URL of its admin API (https://host:port), where
	// standbys forward writes. Empty: standbys cannot forward to it.
	AdminURL string `json:"adminURL,omitempty"`
}

// Term is one leadership of this candidate.
type Term struct {
	// Key is the election key (Prefix + "/" + lease ID in hex) and Rev
	// its create revision: the pair a state write compares to stay
	// fenced (concurrency.Election's Key and Rev).
	Key string
	Rev int64
	// Value is the campaign value (Candidate as JSON) stored under Key.
	Value string
	// Lease is the session lease the key is attached to.
	Lease clientv3.LeaseID
	// Elected is when Campaign returned.
	Elected time.Time
}

// ElectorConfig configures an [Elector].
type ElectorConfig struct {
	// Client is the etcd client. Required. The elector never closes it.
	Client *clientv3.Client
	// Prefix is the election's key prefix. Zero: "/machina/leader".
	Prefix string
	// Self is this controller's candidate value; Self.ID is required.
	Self Candidate
	// TTL is the session lease's time to live, a whole number of seconds
	// (etcd leases count seconds; the server raises a TTL below its minimum,
	// 1.5 election timeouts, rounded up). A leader that cannot renew steps
	// down within one TTL; a standby takes over about one TTL after the
	// leader died. Zero: 10 s.
	TTL time.Duration
	// Metrics, if not nil, gets the leader gauge and the counters.
	Metrics *Metrics
	// Logger: Info on elections and step-downs, Warn on etcd errors. Nil:
	// discard.
	Logger *slog.Logger
}

// Handlers are what the controller does on elections.
type Handlers struct {
	// OnElected runs each time this candidate becomes leader, with a
	// context that is cancelled, with the reason as its cause
	// (context.Cause: ErrUnreachable, ErrLeaseLost, ErrKeyGone,
	// ErrShutdown), when the term ends. It MUST stop everything only a
	// leader may do (boot services, BMC actions, status writes, the VIP)
	// and return promptly once the context is done: the elector does not
	// campaign again before it returns. Returning while the context is
	// live resigns the term (and the candidate campaigns again after a
	// backoff). Required.
	OnElected func(ctx context.Context, t Term) error
	// OnDeposed, if not nil, runs after OnElected returned, with the
	// reason the term ended (ErrResigned joined with OnElected's error
	// when it returned by itself).
	OnDeposed func(t Term, reason error)
}

// Elector campaigns for leadership of one election on etcd
// (concurrency.Election on a concurrency.Session lease) and observes who
// leads. Create it with [NewElector] and run it with [Elector.Run]; Leader
// and IsLeader are safe for concurrent use.
//
// Safety: a term ends locally no later than 0.9 TTL after the last
// keepalive request that etcd answered was sent, which is before etcd can
// expire the lease (it counts TTL from when it received that request) and
// so before another candidate can be elected, if clocks run at the same
// rate. Writes that must not outlive the term are fenced in etcd besides
// (state's leader check compares Term.Key and Term.Rev in the same
// transaction), which holds even when the process is paused.
type Elector struct {
	cfg    ElectorConfig
	log    *slog.Logger
	prefix string // with the trailing "/", as concurrency.Election uses
	value  string
	ttl    time.Duration

	mu       sync.Mutex
	leader   Candidate
	hasLead  bool
	leading  bool
	leadCh   chan struct{} // closed and replaced whenever leader changes
	observed bool
}

// NewElector validates cfg.
func NewElector(cfg ElectorConfig) (*Elector, error) {
	if cfg.Client == nil {
		return nil, errors.New("ha: elector: etcd client is required")
	}
	if cfg.Self.ID == "" {
		return nil, errors.New("ha: elector: candidate id is required (--ha-id)")
	}
	if strings.ContainsAny(cfg.Self.ID, "\x00\n\r") || len(cfg.Self.ID) > 253 {
		return nil, fmt.Errorf("ha: elector: candidate id %q: at most 253 bytes, no control characters", cfg.Self.ID)
	}
	if cfg.TTL == 0 {
		cfg.TTL = 10 * time.Second
	}
	if cfg.TTL < time.Second || cfg.TTL%time.Second != 0 {
		return nil, fmt.Errorf("ha: elector: ttl %s: must be a whole number of seconds, at least 1s", cfg.TTL)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/machina/leader"
	}
	cfg.Prefix = strings.TrimSuffix(cfg.Prefix, "/")
	v, err := json.Marshal(cfg.Self)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Elector{cfg: cfg, log: log.With("ha_id", cfg.Self.ID), prefix: cfg.Prefix + "/", value: string(v), ttl: cfg.TTL,
		leadCh: make(chan struct{})}, nil
}

// Leader returns the current leader as last observed in etcd, and false
// when there is none (or none observed yet).
func (e *Elector) Leader() (Candidate, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leader, e.hasLead
}

// LeaderChanged returns a channel closed at the next change of the
// observed leader.
func (e *Elector) LeaderChanged() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leadCh
}

// TTL returns the session lease's time to live.
func (e *Elector) TTL() time.Duration { return e.ttl }

// IsLeader reports whether this candidate holds a term now (between
// OnElected's start and the end of its context).
func (e *Elector) IsLeader() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leading
}

func (e *Elector) setLeader(c Candidate, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.observed && ok == e.hasLead && c == e.leader {
		return
	}
	e.leader, e.hasLead, e.observed = c, ok, true
	close(e.leadCh)
	e.leadCh = make(chan struct{})
}

func (e *Elector) setLeading(v bool) {
	e.mu.Lock()
	e.leading = v
	e.mu.Unlock()
	e.cfg.Metrics.setLeader(v)
}

// Run campaigns, runs h.OnElected for each term won, and campaigns again
// after each term, until ctx is done; then it ends the current term
// (cause ErrShutdown), revokes its lease so a standby takes over at once,
// and returns nil. etcd errors are retried with a capped, jittered backoff;
// Run returns an error only for a bad h.
func (e *Elector) Run(ctx context.Context, h Handlers) error {
	if h.OnElected == nil {
		return errors.New("ha: elector: OnElected is required")
	}
	octx, ocancel := context.WithCancel(ctx)
	defer ocancel()
	go e.observe(octx)
	backoff := e.minBackoff()
	for ctx.Err() == nil {
		resigned, err := e.term(ctx, h)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			e.log.Warn("ha campaign", "err", err)
		}
		wait := backoff
		if resigned {
			// Give the other candidates a TTL to take over first: a
			// controller that could not start its services should not win
			// again at once.
			wait = e.ttl
		}
		if !e.sleep(ctx, wait) {
			return nil
		}
		if err != nil {
			backoff = min(backoff*2, e.ttl)
		} else {
			backoff = e.minBackoff()
		}
	}
	return nil
}

func (e *Elector) minBackoff() time.Duration { return min(500*time.Millisecond, e.ttl/4) }

// sleep waits d with ±20 % jitter; false if ctx ended.
func (e *Elector) sleep(ctx context.Context, d time.Duration) bool {
	d = time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// term runs one session: campaign, then lead until the term ends. It
// returns campaign errors (a term that ran returns nil), and whether the
// term ended by resignation.
func (e *Elector) term(ctx context.Context, h Handlers) (resigned bool, err error) {
	sess, err := concurrency.NewSession(e.cfg.Client, concurrency.WithTTL(int(e.ttl/time.Second)), concurrency.WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("ha: new session: %w", err)
	}
	defer e.revoke(ctx, sess)
	el := concurrency.NewElection(sess, e.cfg.Prefix)
	// Campaign runs in its own goroutine: on cancel it resigns with the
	// client's context, which blocks while etcd is unreachable. It ends
	// when etcd answers or the client is closed.
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	campaigned := make(chan error, 1)
	go func() { campaigned <- el.Campaign(cctx, e.value) }()
	select {
	case err = <-campaigned:
	case <-sess.Done():
		return false, fmt.Errorf("ha: campaign: %w", ErrLeaseLost)
	case <-ctx.Done():
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("ha: campaign: %w", err)
	}
	t := Term{Key: el.Key(), Rev: el.Rev(), Value: e.value, Lease: sess.Lease(), Elected: time.Now()}
	// Campaign can return after the lease lapsed while it waited: renew it
	// (the answered renewal starts the term's deadline) and make sure the
	// key is still ours before acting.
	gctx, gcancel := context.WithTimeout(ctx, e.ttl/2)
	defer gcancel()
	sent := time.Now()
	ka, err := e.cfg.Client.KeepAliveOnce(gctx, t.Lease)
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			err = ErrLeaseLost
		}
		return false, fmt.Errorf("ha: renew lease after campaign: %w", err)
	}
	resp, err := e.cfg.Client.Get(gctx, t.Key)
	if err != nil {
		return false, fmt.Errorf("ha: check election key: %w", err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != t.Rev || clientv3.LeaseID(resp.Kvs[0].Lease) != t.Lease {
		return false, fmt.Errorf("ha: campaign won with a key no longer ours: %w", ErrKeyGone)
	}
	gcancel()
	reason := e.lead(ctx, sess, t, h, resp.Header.Revision, sent.Add(time.Duration(ka.TTL)*time.Second))
	return errors.Is(reason, ErrResigned), nil
}

// lead runs OnElected until the term ends.
func (e *Elector) lead(ctx context.Context, sess *concurrency.Session, t Term, h Handlers, rev int64, expires time.Time) error {
	lctx, lcancel := context.WithCancelCause(ctx)
	defer lcancel(nil)
	log := e.log.With("key", t.Key, "rev", t.Rev)
	log.Info("elected leader")
	e.cfg.Metrics.elected()
	e.setLeading(true)

	done := make(chan error, 1)
	go func() { done <- h.OnElected(lctx, t) }()
	mctx, mcancel := context.WithCancel(ctx)
	lost := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); lost <- e.keepAlive(mctx, sess, expires) }()
	go func() { defer wg.Done(); lost <- e.watchKey(mctx, t, rev) }()

	var reason error
	select {
	case err := <-done:
		reason = errors.Join(ErrResigned, err)
		if ctx.Err() != nil {
			reason = ErrShutdown
		}
		lcancel(reason)
		e.setLeading(false)
	case reason = <-lost:
		if ctx.Err() != nil {
			reason = ErrShutdown
		}
		e.setLeading(false)
		lcancel(reason)
		<-done
	case <-ctx.Done():
		reason = ErrShutdown
		e.setLeading(false)
		lcancel(reason)
		<-done
	}
	mcancel()
	wg.Wait()
	e.cfg.Metrics.steppedDown(reason)
	log.Info("stepped down", "reason", reason)
	if h.OnDeposed != nil {
		h.OnDeposed(t, reason)
	}
	return reason
}

// keepAlive renews the lease every TTL/3 with its own KeepAliveOnce and
// returns when the term must end: ErrLeaseLost when etcd says the lease is
// gone or the session ended, ErrUnreachable at 0.9 TTL after the last
// answered renewal was sent (expires is the first renewal's send time plus
// the TTL etcd answered), or nil when ctx ends.
func (e *Elector) keepAlive(ctx context.Context, sess *concurrency.Session, expires time.Time) error {
	expire := func(sent time.Time, ttl time.Duration) time.Time { return sent.Add(ttl - ttl/10) }
	deadline := expires.Add(-e.ttl / 10)
	tick := time.NewTicker(e.ttl / 3)
	defer tick.Stop()
	for {
		dl := time.NewTimer(time.Until(deadline))
		select {
		case <-ctx.Done():
			dl.Stop()
			return nil
		case <-sess.Done():
			dl.Stop()
			return ErrLeaseLost
		case <-dl.C:
			return fmt.Errorf("%w: no keepalive answered since %s", ErrUnreachable, deadline.Add(-e.ttl+e.ttl/10).Format(time.RFC3339Nano))
		case <-tick.C:
			dl.Stop()
		}
		sent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, deadline)
		resp, err := e.cfg.Client.KeepAliveOnce(rctx, sess.Lease())
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			return ErrLeaseLost
		case err != nil:
			e.log.Warn("ha keepalive", "err", err)
		case resp.TTL <= 0:
			return ErrLeaseLost
		default:
			deadline = expire(sent, time.Duration(resp.TTL)*time.Second)
		}
	}
}

// watchKey returns ErrKeyGone when t's key is deleted or recreated, nil
// when ctx ends.
func (e *Elector) watchKey(ctx context.Context, t Term, rev int64) error {
	for {
		wch := e.cfg.Client.Watch(clientv3.WithRequireLeader(ctx), t.Key, clientv3.WithRev(rev+1))
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete || ev.Kv.CreateRevision != t.Rev {
					return ErrKeyGone
				}
			}
			if wr.Err() != nil {
				break
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		// The watch ended (compaction, lost etcd leader): look again. The
		// keepalive side bounds how long etcd may stay unreachable.
		if !e.sleep(ctx, e.minBackoff()) {
			return nil
		}
		gctx, cancel := context.WithTimeout(ctx, e.ttl/3)
		resp, err := e.cfg.Client.Get(gctx, t.Key)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			continue
		}
		if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != t.Rev {
			return ErrKeyGone
		}
		rev = resp.Header.Revision
	}
}

// revoke ends sess and revokes its lease (deleting the election key), so a
// standby does not wait a TTL; bounded to 2 s (etcd may be unreachable: the
// lease then lapses by itself).
func (e *Elector) revoke(ctx context.Context, sess *concurrency.Session) {
	sess.Orphan()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if _, err := e.cfg.Client.Revoke(rctx, sess.Lease()); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		e.log.Debug("ha revoke lease", "err", err)
	}
}

// observe keeps Leader up to date: the election's first key by create
// revision is the leader (concurrency.Election.Leader), re-read on every
// change under the prefix.
func (e *Elector) observe(ctx context.Context) {
	for ctx.Err() == nil {
		gctx, cancel := context.WithTimeout(ctx, e.ttl)
		resp, err := e.cfg.Client.Get(gctx, e.prefix, clientv3.WithFirstCreate()...)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				e.log.Debug("ha observe", "err", err)
			}
			e.sleep(ctx, e.minBackoff())
			continue
		}
		if len(resp.Kvs) == 0 {
			e.setLeader(Candidate{}, false)
		} else {
			var c Candidate
			if err := json.Unmarshal(resp.Kvs[0].Value, &c); err != nil {
				e.log.Warn("ha observe: leader value is not a candidate", "key", string(resp.Kvs[0].Key), "err", err)
			}
			e.setLeader(c, true)
		}
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := e.cfg.Client.Watch(wctx, e.prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wch {
			if wr.Err() != nil || len(wr.Events) > 0 {
				break
			}
		}
		wcancel()
	}
}
