package state_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/machina-metal/machina/state"
	bolt "go.etcd.io/bbolt"
)

func TestOpenLockedFailsFast(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	openAt(t, path, state.Options{})
	start := time.Now()
	_, err := state.Open(path, state.Options{Timeout: 100 * time.Millisecond})
	if !errors.Is(err, state.ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	t.Logf("second Open refused after %v: %v", time.Since(start), err)
}

// TestMigrateFromV1 writes a version-1 file by hand (power as a bare
// string, no hosts/admin buckets) and checks Open upgrades it.
func TestMigrateFromV1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v1.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	updated := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	err = db.Update(func(tx *bolt.Tx) error {
		meta, _ := tx.CreateBucket([]byte("meta"))
		v := make([]byte, 8)
		binary.BigEndian.PutUint64(v, 1)
		if err := meta.Put([]byte("schema_version"), v); err != nil {
			return err
		}
		servers, _ := tx.CreateBucket([]byte("servers"))
		rec, _ := json.Marshal(map[string]any{"name": "old-1", "zone": "zone-a", "lifecycle": "ready", "power": "powered_on", "updatedAt": updated})
		if err := servers.Put([]byte("old-1"), rec); err != nil {
			return err
		}
		rec, _ = json.Marshal(map[string]any{"name": "old-2", "lifecycle": "new"})
		if err := servers.Put([]byte("old-2"), rec); err != nil {
			return err
		}
		_, err := tx.CreateBucket([]byte("events"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()

	s := openAt(t, path, state.Options{})
	got, err := s.Server("old-1")
	if err != nil {
		t.Fatal(err)
	}
	want := state.PowerStatus{State: state.PowerOn, At: updated}
	if diff := cmp.Diff(want, got.Power); diff != "" {
		t.Errorf("migrated power (-want +got):\n%s", diff)
	}
	if got.Lifecycle != state.LifecycleReady || got.Zone != "zone-a" || got.Revision != 1 {
		t.Errorf("migrated server = %+v", got)
	}
	got2, _ := s.Server("old-2")
	if got2.Power.State != state.PowerRegistered {
		t.Errorf("old-2 power = %q, want registered", got2.Power.State)
	}
	// Version-2 features work on the migrated file.
	if _, err := s.PutHost(state.Host{Name: "h1"}); err != nil {
		t.Errorf("PutHost on migrated file: %v", err)
	}
	if _, err := s.Transition("old-1", state.LifecycleReady, state.LifecycleAllocated, "after migration"); err != nil {
		t.Errorf("Transition on migrated file: %v", err)
	}
}

func TestOpenRefusesNewerVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v99.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Update(func(tx *bolt.Tx) error {
		meta, _ := tx.CreateBucket([]byte("meta"))
		v := make([]byte, 8)
		binary.BigEndian.PutUint64(v, state.SchemaVersion+1)
		return meta.Put([]byte("schema_version"), v)
	})
	db.Close()
	if _, err := state.Open(path, state.Options{}); !errors.Is(err, state.ErrSchemaVersion) {
		t.Fatalf("Open(newer) = %v, want ErrSchemaVersion", err)
	}
}

func TestServersCRUDAndList(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		if _, err := s.CreateServer(state.Server{Name: "Bad_Name"}); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("bad name: %v", err)
		}
		if _, err := s.CreateServer(state.Server{Name: "x", BootMAC: "zz"}); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("bad MAC: %v", err)
		}
		srv := mustCreate(t, s, state.Server{Name: "a1", Zone: "zone-a", BootMAC: "52:54:00:AA:BB:CC"})
		if srv.BootMAC != "52:54:00:aa:bb:cc" || srv.Lifecycle != state.LifecycleNew || srv.Power.State != state.PowerRegistered {
			t.Errorf("created = %+v", srv)
		}
		if _, err := s.CreateServer(state.Server{Name: "a1"}); !errors.Is(err, state.ErrExists) {
			t.Errorf("duplicate: %v", err)
		}
		for _, n := range []string{"a2", "a3", "b1", "b2"} {
			zone := "zone-a"
			if n[0] == 'b' {
				zone = "zone-b"
			}
			mustCreate(t, s, state.Server{Name: n, Zone: zone})
		}
		if _, err := s.Transition("a2", state.LifecycleNew, state.LifecycleCommissioning, ""); err != nil {
			t.Fatal(err)
		}
		names := func(p state.ServerPage) []string {
			var out []string
			for _, s := range p.Servers {
				out = append(out, s.Name)
			}
			return out
		}
		cases := []struct {
			opts     state.ListOptions
			want     []string
			wantNext string
		}{
			{state.ListOptions{}, []string{"a1", "a2", "a3", "b1", "b2"}, ""},
			{state.ListOptions{Limit: 2}, []string{"a1", "a2"}, "a2"},
			{state.ListOptions{Limit: 2, After: "a2"}, []string{"a3", "b1"}, "b1"},
			{state.ListOptions{Limit: 2, After: "b1"}, []string{"b2"}, ""},
			{state.ListOptions{Zone: "zone-b"}, []string{"b1", "b2"}, ""},
			{state.ListOptions{Zone: "zone-a", Lifecycle: state.LifecycleNew}, []string{"a1", "a3"}, ""},
			{state.ListOptions{Lifecycle: state.LifecycleCommissioning}, []string{"a2"}, ""},
			{state.ListOptions{After: "a15"}, []string{"a2", "a3", "b1", "b2"}, ""},
		}
		for _, c := range cases {
			p, err := s.ListServers(c.opts)
			if err != nil {
				t.Fatalf("ListServers(%+v) = %v", c.opts, err)
			}
			if diff := cmp.Diff(c.want, names(p)); diff != "" || p.Next != c.wantNext {
				t.Errorf("ListServers(%+v) next=%q (-want +got):\n%s", c.opts, p.Next, diff)
			}
		}
		if _, err := s.ListServers(state.ListOptions{Lifecycle: "bogus"}); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("bogus lifecycle filter: %v", err)
		}
		counts, err := s.CountServers()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(map[state.Lifecycle]int{state.LifecycleNew: 4, state.LifecycleCommissioning: 1}, counts); diff != "" {
			t.Errorf("CountServers (-want +got):\n%s", diff)
		}

		up, err := s.UpdateServer("a1", func(srv *state.Server) error {
			srv.Hardware = &state.Hardware{Cores: 16, MemoryBytes: 64 << 30}
			srv.LastError = "none"
			srv.Actions = map[string]int64{"commission": 1}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if up.Revision != srv.Revision+1 || up.Hardware.Cores != 16 {
			t.Errorf("updated = %+v", up)
		}
		if _, err := s.UpdateServer("nope", func(*state.Server) error { return nil }); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("update missing: %v", err)
		}
	})
}

func TestSetPower(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		c := newClock()
		s := openTest(t, state.Options{Now: c.Now})
		mustCreate(t, s, state.Server{Name: "p1"})
		c.Advance(time.Minute)
		got, err := s.SetPower("p1", state.PowerOn, state.PowerSourceCommand)
		if err != nil {
			t.Fatal(err)
		}
		want := state.PowerStatus{State: state.PowerOn, Source: state.PowerSourceCommand, At: c.Now()}
		if diff := cmp.Diff(want, got.Power); diff != "" {
			t.Errorf("power (-want +got):\n%s", diff)
		}
		c.Advance(time.Minute)
		if _, err := s.SetPower("p1", state.PowerOn, state.PowerSourceBMC); err != nil { // same state: no event
			t.Fatal(err)
		}
		if _, err := s.SetPower("p1", "on", state.PowerSourceBMC); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("invalid power: %v", err)
		}
		var powerEvents int
		for _, e := range allEvents(t, s, state.EventQuery{Server: "p1"}) {
			if e.Kind == state.EventPower {
				powerEvents++
			}
		}
		if powerEvents != 1 {
			t.Errorf("%d power events, want 1", powerEvents)
		}
		// Power never moves the lifecycle.
		srv, _ := s.Server("p1")
		if srv.Lifecycle != state.LifecycleNew || srv.Power.Source != state.PowerSourceBMC {
			t.Errorf("server = %+v", srv)
		}
	})
}

func TestEventRetention(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		c := newClock()
		s := openTest(t, state.Options{Now: c.Now, NoSync: true,
			Retention: state.Retention{MaxEvents: 50, MaxPerServer: 10, MaxAge: time.Hour}})
		mustCreate(t, s, state.Server{Name: "r1"})
		for range 30 {
			if _, err := s.AppendEvent(state.Event{Server: "r1", Message: "tick"}); err != nil {
				t.Fatal(err)
			}
		}
		if n := len(allEvents(t, s, state.EventQuery{Server: "r1"})); n != 10 {
			t.Errorf("per-server retention: %d events for r1, want 10", n)
		}
		for range 80 {
			if _, err := s.AppendEvent(state.Event{Message: "global"}); err != nil {
				t.Fatal(err)
			}
		}
		all := allEvents(t, s, state.EventQuery{})
		if len(all) != 50 {
			t.Errorf("global retention: %d events, want 50", len(all))
		}
		last, _ := s.LastEventSeq()
		if all[len(all)-1].Seq != last {
			t.Errorf("newest event %d, LastEventSeq %d", all[len(all)-1].Seq, last)
		}
		// r1's events were the oldest and fell out of the global log; its index must follow.
		if n := len(allEvents(t, s, state.EventQuery{Server: "r1"})); n != 0 {
			t.Errorf("r1 index holds %d events after global pruning, want 0", n)
		}
		// An index emptied by pruning is dropped, and the server can log again.
		if _, err := s.AppendEvent(state.Event{Server: "r1", Message: "again"}); err != nil {
			t.Fatal(err)
		}
		if n := len(allEvents(t, s, state.EventQuery{Server: "r1"})); n != 1 {
			t.Errorf("r1 after re-logging: %d events, want 1", n)
		}
		last, _ = s.LastEventSeq()
		// Age: everything is older than an hour after advancing the clock.
		c.Advance(2 * time.Hour)
		res, err := s.Prune()
		if err != nil {
			t.Fatal(err)
		}
		if res.Events != 50 {
			t.Errorf("Prune removed %d events, want 50 (the global cap)", res.Events)
		}
		if n := len(allEvents(t, s, state.EventQuery{})); n != 0 {
			t.Errorf("%d events after age prune", n)
		}
		// Sequence numbers are never reused.
		e, _ := s.AppendEvent(state.Event{Message: "after"})
		if e.Seq != last+1 {
			t.Errorf("seq after prune = %d, want %d", e.Seq, last+1)
		}
	})
}

func TestNotifyWakesAfterCommit(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		ch, stop := s.Notify()
		defer stop()
		mustCreate(t, s, state.Server{Name: "w1"})
		<-ch // CreateServer appended an event
		evs, err := s.Events(state.EventQuery{})
		if err != nil || len(evs) != 1 {
			t.Fatalf("events after wake = %v, %v", evs, err)
		}
	})
}

func TestHostsAndJoinLog(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		if _, err := s.PutHost(state.Host{Name: "h1", Server: "r1-n01", Site: "lab1", Tags: []string{"kvm"}}); err != nil {
			t.Fatal(err)
		}
		h, err := s.Host("h1")
		if err != nil || h.Site != "lab1" || h.JoinedAt.IsZero() {
			t.Errorf("Host = %+v, %v", h, err)
		}
		if _, err := s.Host("h2"); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("missing host: %v", err)
		}
		for _, m := range []string{"network br0 applied", "pool default applied"} {
			if _, err := s.AppendJoinLog("h1", state.JoinLogEntry{Message: m}); err != nil {
				t.Fatal(err)
			}
		}
		log, _ := s.JoinLog("h1")
		if len(log) != 2 || log[0].Seq != 1 || log[1].Message != "pool default applied" {
			t.Errorf("JoinLog = %+v", log)
		}
		hosts, _ := s.Hosts()
		if len(hosts) != 1 {
			t.Errorf("Hosts = %+v", hosts)
		}
	})
}

func TestSnapshot(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		mustCreate(t, s, state.Server{Name: "s1", Zone: "z"})
		mustCreate(t, s, state.Server{Name: "s2"})
		if _, err := s.UpdateServer("s1", func(srv *state.Server) error {
			srv.Hardware = &state.Hardware{Cores: 8, Disks: []state.Disk{{Name: "sda"}}}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutHost(state.Host{Name: "h1", Server: "s1"}); err != nil {
			t.Fatal(err)
		}
		snap, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		last, _ := s.LastEventSeq()
		if len(snap.Servers) != 2 || len(snap.Hosts) != 1 || snap.LastEventSeq != last || snap.Servers["s1"].Hardware.Cores != 8 {
			t.Fatalf("Snapshot = %+v", snap)
		}
		// Records are shared and read-only: a caller copies one before
		// changing it (a pointer replaced, not written through) and may
		// put the copy in its map; that changes neither the store nor a
		// later snapshot.
		v := *snap.Servers["s1"]
		v.Hardware = &state.Hardware{Cores: 1}
		v.Zone = "changed"
		snap.Servers["s1"] = &v
		again, _ := s.Snapshot()
		if got := again.Servers["s1"]; got.Hardware.Cores != 8 || got.Hardware.Disks[0].Name != "sda" || got.Zone != "z" {
			t.Errorf("a later snapshot sees an earlier one's change: %+v", got)
		}
	})
}

// TestForgetHostsOf: the hosts of a released server are marked released
// with their certificate fingerprint cleared and one host.forgotten event
// each; hosts of other servers are untouched; a second call changes
// nothing; an unknown status is refused.
func TestForgetHostsOf(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		for _, h := range []state.Host{
			{Name: "h1", Server: "s1", CertFingerprint: "aa", JoinStatus: "joined"},
			{Name: "h2", Server: "s2", CertFingerprint: "bb", JoinStatus: "joined"},
		} {
			if _, err := s.PutHost(h); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.ForgetHostsOf("s1", state.HostReleased, "server s1 released: count lowered")
		if err != nil || len(got) != 1 || got[0] != "h1" {
			t.Fatalf("ForgetHostsOf = %v, %v; want [h1]", got, err)
		}
		h1, _ := s.Host("h1")
		h2, _ := s.Host("h2")
		if h1.JoinStatus != state.HostReleased || h1.CertFingerprint != "" || h1.JoinReason != "server s1 released: count lowered" {
			t.Errorf("h1 = %+v", h1)
		}
		if h2.JoinStatus != "joined" || h2.CertFingerprint != "bb" {
			t.Errorf("h2 (other server) changed: %+v", h2)
		}
		if again, err := s.ForgetHostsOf("s1", state.HostReleased, "again"); err != nil || len(again) != 0 {
			t.Errorf("second call = %v, %v; want nothing", again, err)
		}
		n := 0
		for _, e := range allEvents(t, s, state.EventQuery{}) {
			if e.Kind == state.EventHostForgotten {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d host.forgotten events, want 1", n)
		}
		if _, err := s.ForgetHostsOf("s2", "gone", "x"); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("unknown status: %v, want ErrInvalid", err)
		}
	})
}

// TestObserveBMC: a BMC read writes the record only when power or health
// changed, with one event per change; a power state commanded after the
// read started is kept; the sweep list leaves out servers without a BMC and
// stalled ones.
func TestObserveBMC(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		mustCreate(t, s, state.Server{Name: "s1", BMC: state.BMCFacts{Driver: "redfish", Address: "https://10.0.0.1", Credentials: "c"}})
		mustCreate(t, s, state.Server{Name: "s2"})
		mustCreate(t, s, state.Server{Name: "s3", BMC: state.BMCFacts{Driver: "ipmi", Address: "10.0.0.3", Credentials: "c"}})
		if _, err := s.UpdateServer("s3", func(srv *state.Server) error { srv.Stalled = "credential refused"; return nil }); err != nil {
			t.Fatal(err)
		}
		names, err := s.ServersWithBMC()
		if err != nil || len(names) != 1 || names[0] != "s1" {
			t.Fatalf("ServersWithBMC = %q, %v; want [s1]", names, err)
		}

		before, _ := s.LastEventSeq()
		rev0, _ := s.Server("s1")
		changed, err := s.ObserveBMC("s1", time.Now(), state.PowerOn, "OK")
		if err != nil || !changed {
			t.Fatalf("first observation: changed %v, %v", changed, err)
		}
		srv, _ := s.Server("s1")
		if srv.Power.State != state.PowerOn || srv.Power.Source != state.PowerSourceBMC || srv.Health != "OK" || srv.Revision != rev0.Revision+1 {
			t.Fatalf("after observation: power %+v health %q revision %d", srv.Power, srv.Health, srv.Revision)
		}
		evs, _ := s.Events(state.EventQuery{Server: "s1", After: before})
		var msgs []string
		for _, e := range evs {
			msgs = append(msgs, string(e.Kind)+" "+e.Message)
		}
		want := []string{"power power registered→powered_on (bmc)", "health health unknown→OK"}
		if strings.Join(msgs, "|") != strings.Join(want, "|") {
			t.Errorf("events %q, want %q", msgs, want)
		}

		// The same reading again writes nothing.
		if changed, err := s.ObserveBMC("s1", time.Now(), state.PowerOn, "OK"); err != nil || changed {
			t.Errorf("unchanged observation: changed %v, %v", changed, err)
		}
		if again, _ := s.Server("s1"); again.Revision != srv.Revision {
			t.Errorf("unchanged observation wrote the record (revision %d → %d)", srv.Revision, again.Revision)
		}

		// A read that started before Machina's own command is older than it.
		readAt := time.Now().Add(-time.Second)
		if _, err := s.SetPower("s1", state.PowerOff, state.PowerSourceCommand); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ObserveBMC("s1", readAt, state.PowerOn, "Critical"); err != nil {
			t.Fatal(err)
		}
		srv, _ = s.Server("s1")
		if srv.Power.State != state.PowerOff || srv.Power.Source != state.PowerSourceCommand || srv.Health != "Critical" {
			t.Errorf("stale read: power %+v health %q; want the command's off kept and health Critical", srv.Power, srv.Health)
		}
		// A BMC that stops reporting health: unknown again.
		if _, err := s.ObserveBMC("s1", time.Now(), "", ""); err != nil {
			t.Fatal(err)
		}
		if srv, _ = s.Server("s1"); srv.Health != "" || srv.Power.State != state.PowerOff {
			t.Errorf("no health, no power read: health %q power %s", srv.Health, srv.Power.State)
		}

		// A failed read is recorded once per distinct reason; a good read clears it.
		for range 2 {
			if _, err := s.BMCReadFailed("s1", "bmc: login: HTTP 401"); err != nil {
				t.Fatal(err)
			}
		}
		if srv, _ = s.Server("s1"); srv.BMCError != "bmc: login: HTTP 401" {
			t.Errorf("BMCError = %q", srv.BMCError)
		}
		if changed, err := s.ObserveBMC("s1", time.Now(), "", ""); err != nil || !changed {
			t.Errorf("good read after a failure: changed %v, %v", changed, err)
		}
		if srv, _ = s.Server("s1"); srv.BMCError != "" {
			t.Errorf("BMCError after a good read = %q", srv.BMCError)
		}
		evs, _ = s.Events(state.EventQuery{Server: "s1", After: before})
		reads := 0
		for _, e := range evs {
			if e.Kind == state.EventBMCRead {
				reads++
			}
		}
		if reads != 2 {
			t.Errorf("%d bmc.read events, want 2 (failed once, read again)", reads)
		}

		if _, err := s.ObserveBMC("nope", time.Now(), state.PowerOn, "OK"); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("unknown server: %v", err)
		}
		if _, err := s.ObserveBMC("s1", time.Now(), "sideways", "OK"); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("invalid power: %v", err)
		}
	})
}

// TestRevokeAdminTokenKeepOne: the API's revocation refuses the only admin
// token (in the same transaction as the delete) and revokes any other.
func TestRevokeAdminTokenKeepOne(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		for _, n := range []string{"a", "b"} {
			if _, _, err := s.CreateAdminToken(n, "test"); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.RevokeAdminTokenKeepOne("a", "test"); err != nil {
			t.Fatalf("revoke one of two: %v", err)
		}
		if err := s.RevokeAdminTokenKeepOne("b", "test"); !errors.Is(err, state.ErrLastAdminToken) {
			t.Errorf("revoke the last: %v, want ErrLastAdminToken", err)
		}
		if toks, _ := s.AdminTokens(); len(toks) != 1 || toks[0].Name != "b" {
			t.Errorf("tokens left: %+v", toks)
		}
		if err := s.RevokeAdminToken("b", "test"); err != nil {
			t.Errorf("machina token may still revoke the last one offline: %v", err)
		}
	})
}

// TestAgeSweepOnAppend: an append deletes events past MaxAge (up to the
// sweep bound) without Prune, also after appends that skipped the sweep
// because the oldest event was young.
func TestAgeSweepOnAppend(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		c := newClock()
		s := openTest(t, state.Options{Now: c.Now, NoSync: true, Retention: state.Retention{MaxAge: time.Hour}})
		for range 5 {
			if _, err := s.AppendEvent(state.Event{Message: "old"}); err != nil {
				t.Fatal(err)
			}
			c.Advance(time.Minute)
		}
		c.Advance(2 * time.Hour)
		if _, err := s.AppendEvent(state.Event{Message: "new"}); err != nil {
			t.Fatal(err)
		}
		all := allEvents(t, s, state.EventQuery{})
		if len(all) != 1 || all[0].Message != "new" {
			t.Fatalf("after the age sweep: %d events %+v, want only the new one", len(all), all)
		}
	})
}
