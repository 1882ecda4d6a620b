package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/images"
)

// TestFirmwareOffers: a firmware catalog file (gzip magic bytes at its
// start: stored as downloaded, not refused as a compressed disk image)
// is imported with its size and sha256 checked (a wrong size is
// discarded), then offered: the URL carries a 256-bit token and the
// catalog URL's file name, serves the bytes with Range and the checksum
// header, and answers 404 for another token, another file name, after
// release and after the offer's lifetime; a blob changed at rest is not
// offered at all; more transfers than the bound get 503.
func TestFirmwareOffers(t *testing.T) {
	body := append([]byte{0x1f, 0x8b, 0x08, 0x00}, []byte(strings.Repeat("BIOS package ", 4096))...)
	sum := sha256.Sum256(body)
	checksum := "sha256:" + hex.EncodeToString(sum[:])
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", time.Time{}, strings.NewReader(string(body)))
	}))
	defer up.Close()
	store, err := images.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	im, err := images.New(images.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := im.Import(ctx, images.Request{Name: "bios-wrong-size", URL: up.URL + "/BIOS_1.9.0.bin", Checksum: checksum, SizeBytes: int64(len(body)) + 1, Firmware: true}); err == nil || !strings.Contains(err.Error(), "want sizeBytes") {
		t.Errorf("import with a wrong sizeBytes: %v; want the size refused", err)
	}
	rec, err := im.Import(ctx, images.Request{Name: "dell-bios", URL: up.URL + "/BIOS_1.9.0.bin", Checksum: checksum, SizeBytes: int64(len(body)), Firmware: true})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Raw.String() != checksum || rec.SizeBytes != int64(len(body)) {
		t.Fatalf("stored %+v; want the file as downloaded (%s, %d bytes)", rec, checksum, len(body))
	}

	o := newFirmwareOffers(store, "http://ctl.test:8080/", slog.New(slog.NewTextHandler(t.Output(), nil)))
	now := time.Now()
	o.now = func() time.Time { return now }
	uri, release, err := o.Offer(ctx, "dell-bios", checksum)
	if err != nil {
		t.Fatal(err)
	}
	rest, ok := strings.CutPrefix(uri, "http://ctl.test:8080/firmware/")
	token, file, _ := strings.Cut(rest, "/")
	if !ok || len(token) != 64 || file != "BIOS_1.9.0.bin" {
		t.Fatalf("offer URL %s; want http://ctl.test:8080/firmware/<64 hex>/BIOS_1.9.0.bin", uri)
	}
	get := func(p, rng string) (int, string, http.Header) {
		req := httptest.NewRequest(http.MethodGet, p, nil)
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		w := httptest.NewRecorder()
		o.ServeHTTP(w, req)
		b, _ := io.ReadAll(w.Result().Body)
		return w.Code, string(b), w.Result().Header
	}
	p := "/firmware/" + token + "/" + file
	if code, got, h := get(p, ""); code != http.StatusOK || got != string(body) || h.Get(images.ChecksumHeader) != checksum {
		t.Errorf("GET offer: %d, %d bytes, checksum %q; want 200 with the file and %s", code, len(got), h.Get(images.ChecksumHeader), checksum)
	}
	if code, got, _ := get(p, "bytes=4-15"); code != http.StatusPartialContent || got != string(body[4:16]) {
		t.Errorf("GET Range: %d %q; want 206 with bytes 4-15", code, got)
	}
	other := strings.Repeat("0", 64)
	for _, bad := range []string{"/firmware/" + other + "/" + file, "/firmware/" + token + "/other.bin", "/firmware/" + token, "/firmware/short/" + file} {
		if code, _, _ := get(bad, ""); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", bad, code)
		}
	}
	// The bound: every slot taken, the next transfer waits its turn.
	for range firmwareMaxTransfers {
		o.slots <- struct{}{}
	}
	if code, _, h := get(p, ""); code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
		t.Errorf("GET with every transfer slot taken: %d, Retry-After %q; want 503 with Retry-After", code, h.Get("Retry-After"))
	}
	for range firmwareMaxTransfers {
		<-o.slots
	}
	release()
	if code, _, _ := get(p, ""); code != http.StatusNotFound {
		t.Errorf("GET after release: %d, want 404", code)
	}
	uri2, _, err := o.Offer(ctx, "dell-bios", "")
	if err != nil {
		t.Fatal(err)
	}
	p2 := strings.TrimPrefix(uri2, "http://ctl.test:8080")
	now = now.Add(firmwareOfferTTL + time.Second)
	if code, _, _ := get(p2, ""); code != http.StatusNotFound {
		t.Errorf("GET after the offer's lifetime: %d, want 404", code)
	}
	if _, _, err := o.Offer(ctx, "dell-bios", "sha256:"+strings.Repeat("1", 64)); !errors.Is(err, images.ErrChecksumMismatch) {
		t.Errorf("offer against another checksum: %v; want ErrChecksumMismatch", err)
	}
	// A blob changed at rest is never offered.
	bp, err := store.BlobPath(rec.Raw)
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte{}, body...)
	bad[100] ^= 0xff
	if err := os.WriteFile(bp, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := o.Offer(ctx, "dell-bios", checksum); !errors.Is(err, images.ErrChecksumMismatch) {
		t.Errorf("offer of a corrupted blob: %v; want ErrChecksumMismatch", err)
	}
	if _, _, err := o.Open(ctx, "dell-bios", checksum); !errors.Is(err, images.ErrChecksumMismatch) {
		t.Errorf("open of a corrupted blob: %v; want ErrChecksumMismatch", err)
	}
}
