package main

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/etcdtest"
	"github.com/machina-metal/machina/state"
)

const testMasterKey = "0123456789abcdef-master-key-for-cmd-tests"

// seedSite makes a bbolt site with a bit of everything: servers moved
// through the lifecycle (events), an admin token, a sealed secret, a host
// with a join log, a machine token.
func seedSite(t *testing.T, path string) string {
	t.Helper()
	st, err := state.Open(path, state.Options{MasterKey: []byte(testMasterKey)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tok, _, err := st.CreateAdminToken("ops", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"r1-n01", "r1-n02", "r2-n01"} {
		if _, err := st.CreateServer(state.Server{Name: n, Lifecycle: state.LifecycleReady}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Transition("r1-n01", state.LifecycleReady, state.LifecycleAllocated, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutSecret("bmc-default", state.Credential{Username: "admin", Password: "s3cret-bmc-pass"}, "ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutHost(state.Host{Name: "h1", Server: "r1-n01", JoinedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.AppendJoinLog("h1", state.JoinLogEntry{Message: "joined"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.IssueToken(state.TokenSpec{Purpose: state.PurposeBoot, Server: "r1-n02"}); err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestStateMigrateThenServeOnEtcd: `machina state migrate` copies a bbolt
// site into a real etcd (TLS with a client certificate) and verifies it;
// the etcd site then reads the same as the file (servers, events, secrets
// under the same master key, hosts, join logs); a second migrate into the
// same prefix fails before writing; and `machina serve --state etcd://...`
// serves the migrated site's admin API with the migrated admin token.
func TestStateMigrateThenServeOnEtcd(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{TLS: true})
	tf := c.TLS()
	host := strings.TrimPrefix(c.Endpoints()[0], "https://")
	target := "etcd://" + host + "/site-a"
	path := filepath.Join(t.TempDir(), "state.db")
	tok := seedSite(t, path)

	tlsArgs := []string{"--etcd-ca", tf.CAFile, "--etcd-cert", tf.CertFile, "--etcd-key", tf.KeyFile}
	var out, errb bytes.Buffer
	args := append([]string{"state", "migrate", "--from", path, "--to", target}, tlsArgs...)
	if code := run(context.Background(), args, nil, &out, &errb); code != 0 {
		t.Fatalf("migrate: exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "copied and verified") || !strings.Contains(out.String(), "servers 3") {
		t.Fatalf("migrate output:\n%s", out.String())
	}
	if strings.Contains(out.String()+errb.String(), "s3cret-bmc-pass") || strings.Contains(out.String()+errb.String(), tok) {
		t.Fatal("migrate printed a secret")
	}

	// Into a prefix that is not empty: refused, nothing changed.
	out.Reset()
	errb.Reset()
	if code := run(context.Background(), args, nil, &out, &errb); code == 0 || !strings.Contains(errb.String(), "not empty") {
		t.Fatalf("second migrate: exit %d, %q", code, errb.String())
	}
	// Without the client certificate etcd refuses the connection.
	errb.Reset()
	if code := run(context.Background(), []string{"state", "migrate", "--from", path, "--to", "etcd://" + host + "/site-b", "--etcd-ca", tf.CAFile}, nil, &out, &errb); code == 0 {
		t.Fatal("migrate without a client certificate succeeded")
	}

	// The etcd site reads the same as the file.
	bs, err := state.Open(path, state.Options{MasterKey: []byte(testMasterKey)})
	if err != nil {
		t.Fatal(err)
	}
	es, err := state.OpenTarget(target, state.EtcdTLSFiles{CAFile: tf.CAFile, CertFile: tf.CertFile, KeyFile: tf.KeyFile},
		state.Options{MasterKey: []byte(testMasterKey), MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*state.Store{bs, es} {
		if got, err := s.Secret("bmc-default"); err != nil || got.Password != "s3cret-bmc-pass" {
			t.Fatalf("%s: Secret = %v, %v", s.Engine(), got, err)
		}
	}
	bsnap, _ := bs.Snapshot()
	esnap, _ := es.Snapshot()
	if !reflect.DeepEqual(bsnap, esnap) {
		t.Fatalf("snapshots differ:\nbbolt %+v\netcd  %+v", bsnap, esnap)
	}
	bev, _ := bs.Events(state.EventQuery{Limit: 1000})
	eev, _ := es.Events(state.EventQuery{Limit: 1000})
	if len(bev) == 0 || !reflect.DeepEqual(bev, eev) {
		t.Fatalf("events differ: %d vs %d", len(bev), len(eev))
	}
	bj, _ := bs.JoinLog("h1")
	ej, _ := es.JoinLog("h1")
	if len(bj) != 1 || !reflect.DeepEqual(bj, ej) {
		t.Fatalf("join logs differ: %+v vs %+v", bj, ej)
	}
	// Sequences came along: the next event continues the file's numbering.
	if _, err := es.Transition("r1-n02", state.LifecycleReady, state.LifecycleAllocated, "after migrate"); err != nil {
		t.Fatal(err)
	}
	if last, _ := es.LastEventSeq(); last != bev[len(bev)-1].Seq+1 {
		t.Fatalf("etcd next event seq %d, want %d", last, bev[len(bev)-1].Seq+1)
	}
	bs.Close()
	es.Close()

	// machina serve on the etcd site, through the flags.
	ready := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := ServeConfig{StatePath: target, EtcdTLS: state.EtcdTLSFiles{CAFile: tf.CAFile, CertFile: tf.CertFile, KeyFile: tf.KeyFile},
		Listen: "127.0.0.1:0", MasterKey: []byte(testMasterKey), OnReady: func(a net.Addr) { ready <- a }}
	done := make(chan error, 1)
	go func() { done <- cfg.Run(ctx) }()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("serve on etcd returned early: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve on etcd not ready in 30 s")
	}
	cl, _ := v1.NewClient("http://"+addr.String(), tok)
	srv, err := cl.Server(context.Background(), "r1-n01")
	if err != nil || srv.Lifecycle != "allocated" {
		t.Fatalf("Server over the admin API on etcd = %+v, %v", srv, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve = %v", err)
	}

	// The flags reach ServeConfig: --print-config names them, and a URL
	// with a password is refused before anything runs.
	out.Reset()
	if code := run(context.Background(), append([]string{"serve", "--state", target, "--print-config"}, tlsArgs...), nil, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), `etcd-ca: "`+tf.CAFile+`"`) {
		t.Fatalf("print-config: exit %d\n%s", code, out.String())
	}
	errb.Reset()
	if code := run(context.Background(), []string{"state", "migrate", "--from", path, "--to", "etcd://root:pw@" + host + "/x"}, nil, &out, &errb); code == 0 ||
		!strings.Contains(errb.String(), "secrets never in argv") || strings.Contains(errb.String(), "pw@") {
		t.Fatalf("password URL: exit %d, %q", code, errb.String())
	}
}

// TestStateZoneClaims: machina state zone-claims lists the groups' claims
// of an etcd site and --delete removes one group's, leaving the others.
func TestStateZoneClaims(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	target := "etcd://" + strings.TrimPrefix(c.Endpoints()[0], "http://") + "/site"
	st, err := state.OpenEtcd(state.EtcdConfig{Client: c.Client(t), Prefix: "/site/"}, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for g, zs := range map[string][]string{"east": {"zone-a"}, "north": {"zone-c", "zone-b"}} {
		if err := st.PutZoneClaim(g, zs, g+"-1"); err != nil {
			t.Fatal(err)
		}
	}
	_ = st.Close()
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"state", "zone-claims", "--state", target}, nil, &out, &errb); code != 0 {
		t.Fatalf("zone-claims: exit %d\n%s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "east\tzone-a\teast-1\t") || !strings.HasPrefix(lines[1], "north\tzone-b,zone-c\tnorth-1\t") {
		t.Fatalf("zone-claims output:\n%s", out.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"state", "zone-claims", "--state", target, "--delete", "north"}, nil, &out, &errb); code != 0 {
		t.Fatalf("zone-claims --delete: exit %d\n%s", code, errb.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"state", "zone-claims", "--state", target}, nil, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "east\t") || strings.Contains(out.String(), "north") {
		t.Fatalf("after delete: exit %d, %q", code, out.String())
	}
}
