package api

import (
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	authFailures prometheus.Counter
}

// newMetrics registers:
//   - machina_api_requests_total{route,code}
//   - machina_api_request_duration_seconds{route}
//   - machina_api_auth_failures_total
//   - machina_servers{lifecycle} (read from the store at scrape time)
//   - machina_secrets{form="sealed"|"unsealed"} and machina_secrets_sealing (1 when a master key is set)
//   - machina_events_last_seq
//   - machina_api_conns_refused_total (connections closed at accept: their address had MaxConnsPerIP open, or the
//     listener was at its descriptor budget; machina_listener_conns_refused_total{listener,reason} splits them)
//   - machina_machine_unknown_tokens_total (machine requests with a token value naming no token)
//   - machina_machine_refusals_total{reason} (machine requests with a known token refused; state.RefusalReason)
//   - on the etcd engine, its requests and waits (etcdCollector, state.EtcdStats):
//     machina_state_etcd_requests_total{kind="txn"|"update_range"|"view_range"|"revision"},
//     machina_state_etcd_request_seconds_total{kind}, machina_state_etcd_conflicts_total,
//     machina_state_etcd_txn_{ops,compares}_total, machina_state_etcd_updates_total,
//     machina_state_etcd_update_calls_total, machina_state_etcd_cache_reads_total{result="hit"|"miss"},
//     machina_state_etcd_cache_reruns_total, machina_state_etcd_views_total{source="replica"|"etcd"} and
//     machina_state_etcd_wait_seconds_total{what="writer_lock"|"view"}
//   - with git set, the Git side's health (gitCollector): machina_git_{poll,push}_last_success_timestamp_seconds,
//     machina_git_{poll,push}_consecutive_failures, machina_git_behind_commits and machina_git_revision_info{commit,digest}
func newMetrics(reg prometheus.Registerer, st *state.Store, refused func() float64, git func() v1.GitHealth) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "machina_api_requests_total", Help: "HTTP requests answered, by route pattern and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "machina_api_request_duration_seconds", Help: "HTTP request latency by route pattern.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 8),
		}, []string{"route"}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "machina_api_auth_failures_total", Help: "Requests refused for an invalid or revoked admin token.",
		}),
	}
	connsRefused := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "machina_api_conns_refused_total", Help: "Connections closed at accept because their source address had MaxConnsPerIP open or the listener was at its descriptor budget.",
	}, refused)
	unknownTokens := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "machina_machine_unknown_tokens_total", Help: "Machine requests refused for a token value that names no token (counted, never written).",
	}, func() float64 { return float64(st.UnknownTokenRefusals()) })
	cs := []prometheus.Collector{m.requests, m.duration, m.authFailures, connsRefused, unknownTokens, refusalCollector{st: st}, &storeCollector{st: st}}
	if git != nil {
		cs = append(cs, gitCollector{git: git})
	}
	if _, ok := st.EtcdStats(); ok {
		cs = append(cs, etcdCollector{st: st})
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// storeCollector reads counts from the store at scrape time.
type storeCollector struct{ st *state.Store }

var (
	descServers  = prometheus.NewDesc("machina_servers", "Servers by lifecycle.", []string{"lifecycle"}, nil)
	descSecrets  = prometheus.NewDesc("machina_secrets", "Stored secrets by form.", []string{"form"}, nil)
	descSealing  = prometheus.NewDesc("machina_secrets_sealing", "1 when secrets are sealed with a master key, else 0.", nil, nil)
	descLastSeq  = prometheus.NewDesc("machina_events_last_seq", "Sequence number of the newest event.", nil, nil)
	descScrapeOK = prometheus.NewDesc("machina_state_up", "1 when the state store answered the scrape.", nil, nil)
)

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descServers
	ch <- descSecrets
	ch <- descSealing
	ch <- descLastSeq
	ch <- descScrapeOK
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	counts, err1 := c.st.CountServers()
	sec, err2 := c.st.SecretsStatus()
	seq, err3 := c.st.LastEventSeq()
	if err1 != nil || err2 != nil || err3 != nil {
		ch <- prometheus.MustNewConstMetric(descScrapeOK, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(descScrapeOK, prometheus.GaugeValue, 1)
	for _, l := range state.Lifecycles() {
		ch <- prometheus.MustNewConstMetric(descServers, prometheus.GaugeValue, float64(counts[l]), string(l))
	}
	ch <- prometheus.MustNewConstMetric(descSecrets, prometheus.GaugeValue, float64(sec.Sealed), "sealed")
	ch <- prometheus.MustNewConstMetric(descSecrets, prometheus.GaugeValue, float64(sec.Unsealed), "unsealed")
	sealing := 0.0
	if sec.Sealing {
		sealing = 1
	}
	ch <- prometheus.MustNewConstMetric(descSealing, prometheus.GaugeValue, sealing)
	ch <- prometheus.MustNewConstMetric(descLastSeq, prometheus.CounterValue, float64(seq))
}

// etcdCollector reads the etcd engine's counters at scrape time.
type etcdCollector struct{ st *state.Store }

var (
	descEtcdRequests  = prometheus.NewDesc("machina_state_etcd_requests_total", "etcd requests of the state store by kind: txn (commits), update_range and view_range (range reads of write and read transactions), revision (the read replica's current-revision reads).", []string{"kind"}, nil)
	descEtcdReqSecs   = prometheus.NewDesc("machina_state_etcd_request_seconds_total", "Summed round-trip time of the state store's etcd requests by kind.", []string{"kind"}, nil)
	descEtcdConflicts = prometheus.NewDesc("machina_state_etcd_conflicts_total", "etcd commits whose compares failed (rerun from a new snapshot, or refused by the fence).", nil, nil)
	descEtcdOps       = prometheus.NewDesc("machina_state_etcd_txn_ops_total", "Operations carried by the etcd commits.", nil, nil)
	descEtcdCmps      = prometheus.NewDesc("machina_state_etcd_txn_compares_total", "Compares carried by the etcd commits.", nil, nil)
	descEtcdUpdates   = prometheus.NewDesc("machina_state_etcd_updates_total", "Write transactions committed on etcd.", nil, nil)
	descEtcdCalls     = prometheus.NewDesc("machina_state_etcd_update_calls_total", "Store write calls carried by the committed etcd transactions (several share one).", nil, nil)
	descEtcdCache     = prometheus.NewDesc("machina_state_etcd_cache_reads_total", "Point reads of write transactions, from the write cache (hit) or etcd (miss).", []string{"result"}, nil)
	descEtcdReruns    = prometheus.NewDesc("machina_state_etcd_cache_reruns_total", "Write transactions that failed after reading the write cache and were rerun from a snapshot.", nil, nil)
	descEtcdViews     = prometheus.NewDesc("machina_state_etcd_views_total", "Read transactions by source: the watch-fed replica, or etcd directly.", []string{"source"}, nil)
	descEtcdWait      = prometheus.NewDesc("machina_state_etcd_wait_seconds_total", "Summed time callers waited: writer_lock (write calls for the process's writer lock), view (views for the replica to reach etcd's current revision).", []string{"what"}, nil)
)

func (c etcdCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEtcdRequests, descEtcdReqSecs, descEtcdConflicts, descEtcdOps, descEtcdCmps,
		descEtcdUpdates, descEtcdCalls, descEtcdCache, descEtcdReruns, descEtcdViews, descEtcdWait} {
		ch <- d
	}
}

func (c etcdCollector) Collect(ch chan<- prometheus.Metric) {
	s, ok := c.st.EtcdStats()
	if !ok {
		return
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	counter(descEtcdRequests, float64(s.Commits), "txn")
	counter(descEtcdRequests, float64(s.UpdateReads), "update_range")
	counter(descEtcdRequests, float64(s.ViewReads), "view_range")
	counter(descEtcdRequests, float64(s.RevisionReads), "revision")
	counter(descEtcdReqSecs, s.CommitTime.Seconds(), "txn")
	counter(descEtcdReqSecs, s.UpdateReadTime.Seconds(), "update_range")
	counter(descEtcdReqSecs, s.ViewReadTime.Seconds(), "view_range")
	counter(descEtcdReqSecs, s.RevisionReadTime.Seconds(), "revision")
	counter(descEtcdConflicts, float64(s.Conflicts))
	counter(descEtcdOps, float64(s.Ops))
	counter(descEtcdCmps, float64(s.Compares))
	counter(descEtcdUpdates, float64(s.Updates))
	counter(descEtcdCalls, float64(s.Calls))
	counter(descEtcdCache, float64(s.CacheHits), "hit")
	counter(descEtcdCache, float64(s.CacheMisses), "miss")
	counter(descEtcdReruns, float64(s.CacheReruns))
	counter(descEtcdViews, float64(s.Views-s.ViewsDirect), "replica")
	counter(descEtcdViews, float64(s.ViewsDirect), "etcd")
	counter(descEtcdWait, s.WriterWait.Seconds(), "writer_lock")
	counter(descEtcdWait, s.ViewWait.Seconds(), "view")
}

// gitCollector reads the Git side's health at scrape time.
type gitCollector struct{ git func() v1.GitHealth }

var (
	descGitLastSuccess = prometheus.NewDesc("machina_git_last_success_timestamp_seconds",
		"Unix time of the last successful poll of the inventory branch (loop=\"poll\") or status write (loop=\"push\": pushed, or nothing to change); 0 before the first.",
		[]string{"loop"}, nil)
	descGitFailures = prometheus.NewDesc("machina_git_consecutive_failures",
		"Failed polls (loop=\"poll\") or status writes (loop=\"push\") since the last success.", []string{"loop"}, nil)
	descGitBehind = prometheus.NewDesc("machina_git_behind_commits",
		"Commits the remote branch tip is ahead of the tip the poller last evaluated; -1 when the remote tip could not be fetched.", nil, nil)
	descGitRevision = prometheus.NewDesc("machina_git_revision_info",
		"Always 1; its labels name the inventory revision acted on (commit, digest; empty before the first good one).", []string{"commit", "digest"}, nil)
	descGitPackBytes = prometheus.NewDesc("machina_git_status_pack_bytes",
		"Size of the packfile the last status commit pushed.", nil, nil)
)

func (c gitCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descGitLastSuccess, descGitFailures, descGitBehind, descGitRevision, descGitPackBytes} {
		ch <- d
	}
}

func (c gitCollector) Collect(ch chan<- prometheus.Metric) {
	g := c.git()
	for _, l := range []struct {
		name string
		h    v1.GitLoopHealth
	}{{"poll", g.Poll}, {"push", g.Push}} {
		ts := 0.0
		if l.h.LastSuccess != nil {
			ts = float64(l.h.LastSuccess.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(descGitLastSuccess, prometheus.GaugeValue, ts, l.name)
		ch <- prometheus.MustNewConstMetric(descGitFailures, prometheus.GaugeValue, float64(l.h.ConsecutiveFailures), l.name)
	}
	ch <- prometheus.MustNewConstMetric(descGitBehind, prometheus.GaugeValue, float64(g.Behind))
	ch <- prometheus.MustNewConstMetric(descGitRevision, prometheus.GaugeValue, 1, g.ActingCommit, g.ActingDigest)
	ch <- prometheus.MustNewConstMetric(descGitPackBytes, prometheus.GaugeValue, float64(g.LastStatusPackBytes))
}
