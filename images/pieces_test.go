package images

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"testing"
)

// TestManifestOfImportedImage imports a real image (10.5 MiB: two full
// pieces and a short one) and checks the piece manifest the import made
// against pieces hashed independently from the served bytes, then that it
// is cached next to the blob and a corrupted cache is rebuilt.
func TestManifestOfImportedImage(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, 10*mib+mib/2)
	srv.put("/x.raw", raw)
	e := newTestEnv(t, nil)
	rec, err := e.im.Import(t.Context(), Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()})
	if err != nil {
		t.Fatalf("Import() = %v", err)
	}
	m, ok := e.store.CachedManifest("x")
	if !ok {
		t.Fatal("CachedManifest() after the import = false, want the manifest the import made")
	}
	var want []string
	for off := 0; off < len(raw); off += 4 << 20 {
		s := sha256.Sum256(raw[off:min(off+4<<20, len(raw))])
		want = append(want, hex.EncodeToString(s[:]))
	}
	if len(m.Pieces) != 3 || len(want) != 3 {
		t.Fatalf("manifest has %d pieces, independent hash %d; want 3", len(m.Pieces), len(want))
	}
	for i := range want {
		if m.Pieces[i] != want[i] {
			t.Errorf("piece %d = %s, want %s", i, m.Pieces[i], want[i])
		}
	}
	if m.Raw != rec.Raw || m.SizeBytes != int64(len(raw)) || m.PieceBytes != PieceBytes {
		t.Errorf("manifest = {raw %s size %d piece %d}, want {%s %d %d}", m.Raw, m.SizeBytes, m.PieceBytes, rec.Raw, len(raw), PieceBytes)
	}
	blob, _ := e.store.BlobPath(rec.Raw)
	if _, err := os.Stat(blob + ".pieces.json"); err != nil {
		t.Fatalf("manifest not cached next to the blob: %v", err)
	}
	os.Chmod(blob+".pieces.json", 0o644)
	if err := os.WriteFile(blob+".pieces.json", []byte(`{"pieceBytes":4194304,"sizeBytes":1,"pieces":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.store.CachedManifest("x"); ok {
		t.Error("CachedManifest() with a corrupt cache = true")
	}
	m2, err := e.store.Manifest("x")
	if err != nil || len(m2.Pieces) != 3 || m2.Pieces[2] != want[2] {
		t.Errorf("Manifest() after a corrupt cache = %d pieces, %v; want it rebuilt", len(m2.Pieces), err)
	}
	if _, err := e.store.Manifest("nope"); err == nil {
		t.Error("Manifest(unknown image) = nil error")
	}
}
