package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func put(t *testing.T, cli *clientv3.Client, k, v string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, k, v); err != nil {
		t.Fatalf("put %s: %v", k, err)
	}
}

// putAcrossFailover writes k=v while a member has just been killed or
// stopped. If that member led the cluster, a write a follower forwarded to
// it is dropped and etcd answers it only after its request timeout
// (5 s + 2 × election timeout) with "request timed out, possibly due to
// previous leader failure" (seen in CI), or "leader changed" / "no leader"
// during the election: the write is retried (the same value, so a retry of a write
// that did land changes nothing) until 30 s have passed.
func putAcrossFailover(t *testing.T, cli *clientv3.Client, k, v string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := cli.Put(ctx, k, v)
		cancel()
		if err == nil {
			if attempt > 1 {
				t.Logf("put %s landed on attempt %d", k, attempt)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("put %s: no write for 30 s after a member went down: %v", k, err)
		}
		t.Logf("put %s attempt %d: %v", k, attempt, err)
		time.Sleep(200 * time.Millisecond)
	}
}

func get(t *testing.T, cli *clientv3.Client, k string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := cli.Get(ctx, k)
	if err != nil {
		t.Fatalf("get %s: %v", k, err)
	}
	if len(r.Kvs) == 0 {
		return ""
	}
	return string(r.Kvs[0].Value)
}

func TestSingleMember(t *testing.T) {
	c := Start(t, Options{})
	if len(c.Endpoints()) != 1 {
		t.Fatalf("endpoints = %v", c.Endpoints())
	}
	cli := c.Client(t)
	put(t, cli, "a", "1")
	if got := get(t, cli, "a"); got != "1" {
		t.Fatalf("get a = %q", got)
	}
}

// TestThreeMembersSurviveOneKill: a 3-member cluster keeps quorum with one
// member killed, and the restarted member catches up from its own data dir.
func TestThreeMembersSurviveOneKill(t *testing.T) {
	c := Start(t, Options{Members: 3})
	cli := c.Client(t)
	put(t, cli, "k", "before")
	m := c.Member(1)
	pid := m.PID()
	if pid == 0 {
		t.Fatal("member 1 has no pid")
	}
	m.Kill()
	if m.Running() || m.PID() != 0 {
		t.Fatal("member 1 still running after Kill")
	}
	putAcrossFailover(t, cli, "k", "during")
	m.Restart()
	if m.PID() == 0 || m.PID() == pid {
		t.Fatalf("restarted pid = %d (old %d)", m.PID(), pid)
	}
	// Read through the restarted member alone: it has the write made
	// while it was down.
	one, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	if got := get(t, one, "k"); got != "during" {
		t.Fatalf("restarted member reads %q, want during", got)
	}
	c.Member(2).Stop()
	putAcrossFailover(t, cli, "k", "after")
}

// TestTLSClientCertRequired: a TLS cluster serves a client with the test
// CA's client certificate and refuses one without a certificate.
func TestTLSClientCertRequired(t *testing.T) {
	c := Start(t, Options{TLS: true})
	if c.TLS() == nil {
		t.Fatal("no TLS files")
	}
	cli := c.Client(t)
	put(t, cli, "tls", "yes")

	cfg := c.TLSConfig()
	cfg.Certificates = nil
	bare, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), TLS: cfg, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err == nil {
		defer bare.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if _, err := bare.Get(ctx, "tls"); err == nil {
			t.Fatal("a client without a certificate read from a --client-cert-auth cluster")
		}
	}
}
