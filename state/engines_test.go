package state_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/machina-metal/machina/internal/etcdtest"
	"github.com/machina-metal/machina/state"
)

// The engine table: every state test that is not about the bbolt file
// itself (its lock, its on-disk migrations, a SIGKILL of its writer, raw
// bbolt edits) runs once per engine, as the subtests bbolt and etcd. The
// etcd runs share one 3-member cluster per test binary (etcdtest.Shared),
// each store under its own key prefix derived from its would-be file path,
// so reopening "the same path" reopens the same site.
var engines = []string{"bbolt", "etcd"}

// eachEngine runs body as a subtest per engine.
func eachEngine(t *testing.T, body func(t *testing.T)) {
	t.Helper()
	for _, e := range engines {
		t.Run(e, body)
	}
}

// engineOf returns the engine of the eachEngine subtest t runs in
// ("bbolt" outside one).
func engineOf(t testing.TB) string {
	parts := strings.Split(t.Name(), "/")
	if len(parts) > 1 && parts[1] == "etcd" {
		return "etcd"
	}
	return "bbolt"
}

// sharedCluster is the test binary's etcd cluster.
func sharedCluster(t testing.TB) *etcdtest.Cluster {
	t.Helper()
	return etcdtest.Shared(t, etcdtest.Options{Members: 3})
}

var (
	clientOnce sync.Once
	clientErr  error
	sharedCli  *clientv3.Client
)

// sharedClient is one client of sharedCluster for every store of the
// binary (Store.Close does not close a client it was given).
func sharedClient(t testing.TB) *clientv3.Client {
	t.Helper()
	c := sharedCluster(t)
	clientOnce.Do(func() { sharedCli, clientErr = clientv3.New(c.Config()) })
	if clientErr != nil {
		t.Fatalf("etcd client: %v", clientErr)
	}
	return sharedCli
}

// prefixFor is the etcd key prefix standing for the state file path.
func prefixFor(path string) string {
	sum := sha256.Sum256([]byte(path))
	return "/t/" + hex.EncodeToString(sum[:8]) + "/"
}

// openEngine opens the store "at path" on t's engine: the bbolt file, or
// the etcd prefix standing for it.
func openEngine(t testing.TB, path string, opts state.Options) (*state.Store, error) {
	t.Helper()
	if engineOf(t) == "bbolt" {
		return state.Open(path, opts)
	}
	return state.OpenEtcd(state.EtcdConfig{Client: sharedClient(t), Prefix: prefixFor(path)}, opts)
}

// rawDump returns every stored byte of the site "at path": the bbolt file,
// or every key and value under its etcd prefix.
func rawDump(t testing.TB, path string) []byte {
	t.Helper()
	if engineOf(t) == "bbolt" {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := sharedClient(t).Get(ctx, prefixFor(path), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for _, kv := range resp.Kvs {
		out = append(out, kv.Key...)
		out = append(out, kv.Value...)
	}
	if len(out) == 0 {
		t.Fatalf("nothing stored under %s", prefixFor(path))
	}
	return out
}
