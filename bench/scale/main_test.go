package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestScanLogAllowList: the bench fails on a controller WARN or ERROR line
// its allow-list does not name; an allowed one is counted apart, and an
// ERROR line is never allowed by a warning's entry.
func TestScanLogAllowList(t *testing.T) {
	path := filepath.Join(t.TempDir(), "controller.log")
	log := strings.Join([]string{
		`time=2026-12-06T06:04:51Z level=INFO msg="controller listening"`,
		`time=2026-12-06T06:04:51Z level=WARN msg="secrets are stored unsealed: set MACHINA_API_KEY_MASTER_KEY to encrypt them at rest"`,
		`time=2026-12-06T06:04:52Z level=WARN msg="host lost: no heartbeat" host=s00008`,
		`time=2026-12-06T06:04:53Z level=ERROR msg="secrets are stored unsealed" err=x`,
	}, "\n") + "\n"
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := scanLog(path, controllerAllowed)
	if err != nil {
		t.Fatal(err)
	}
	if got.warns != 1 || got.errs != 1 || got.allowed["secrets are stored unsealed"] != 1 || len(got.unexpected) != 2 ||
		!strings.Contains(got.unexpected[0], "host lost: no heartbeat") {
		t.Fatalf("scanLog = %+v; want the lost host's warning and the error unexpected, the unsealed warning allowed", got)
	}
	if _, err := scanLog(filepath.Join(t.TempDir(), "missing.log"), nil); err == nil {
		t.Error("scanLog of a missing log = nil error")
	}
}

// TestBoltTxID: the commit count read from a bbolt file's meta pages is
// bbolt's own transaction ID.
func TestBoltTxID(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists([]byte("b")); return err }); err != nil {
			t.Fatal(err)
		}
	}
	var want int
	_ = db.View(func(tx *bolt.Tx) error { want = tx.ID(); return nil })
	if got := boltTxID(path); got != int64(want) || want < 5 {
		t.Errorf("boltTxID = %d, want %d (at least 5)", got, want)
	}
	db.Close()
}
