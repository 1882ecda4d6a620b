package images

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// benchFile writes a 256 MiB random file once per benchmark.
func benchFile(b *testing.B) (string, Digest) {
	b.Helper()
	p := filepath.Join(b.TempDir(), "disk.raw")
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for range 256 {
		rand.Read(buf)
		f.Write(buf)
		h.Write(buf)
	}
	f.Close()
	return p, Digest{Algo: SHA256, Hex: hex.EncodeToString(h.Sum(nil))}
}

// BenchmarkImportLocalFile measures verify-and-store of a local raw file
// (hash, write, fsync, rename into the store). Compare with
// BenchmarkSHA256File, the hash alone; bench/images-import.sh compares a
// 2 GiB import with sha256sum and reports peak memory.
func BenchmarkImportLocalFile(b *testing.B) {
	p, d := benchFile(b)
	b.SetBytes(256 << 20)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		st, err := OpenStore(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		im, err := New(Config{Store: st, AllowFileURLs: true})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := im.Import(b.Context(), Request{Name: "d", URL: "file://" + p, Checksum: d.String()}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSHA256File is the baseline: SHA-256 of the same file.
func BenchmarkSHA256File(b *testing.B) {
	p, _ := benchFile(b)
	b.SetBytes(256 << 20)
	for b.Loop() {
		f, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		h := sha256.New()
		io.CopyBuffer(h, f, make([]byte, 1<<20))
		f.Close()
	}
}
