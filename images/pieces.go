package images

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
)

// PieceBytes is the piece size of a [Manifest]: 4 MiB, the ramdisk agent's
// write chunk. A 2 GiB image has 512 pieces, so its manifest (about 33 KiB
// of hex) travels inline in the deploy plan; a piece is large enough that
// one HTTP request per piece costs under 0.1% of the bytes.
const PieceBytes = 4 << 20

// Manifest is an image's piece manifest: the SHA-256 of every PieceBytes
// piece of the raw image (the last may be short) with the whole image's
// digest and size. Machines sharing an image check every piece a peer sent
// against it before using it.
type Manifest struct {
	PieceBytes int64    `json:"pieceBytes"`
	SizeBytes  int64    `json:"sizeBytes"`
	Raw        Digest   `json:"raw"`
	Pieces     []string `json:"pieces"` // lower-case hex SHA-256 of piece i
}

// manifestSuffix names a blob's cached manifest: blobs/sha256/<hex> plus it.
const manifestSuffix = ".pieces.json"

// manifestMu serialises the first computation of a manifest in this
// process (concurrent plans of one wave would otherwise hash it in
// parallel); the file's atomic rename keeps other processes safe.
var manifestMu sync.Mutex

// Manifest returns the piece manifest of verified image name. It is
// computed from the blob once (one sequential read: the import does it
// when it stores the image) and cached next to it as
// blobs/sha256/<hex>.pieces.json; a cached manifest whose digest or
// size differ from the record is recomputed. Errors wrap [ErrNotFound] for
// an unknown or unverified image.
func (s *Store) Manifest(name string) (Manifest, error) {
	f, rec, err := s.OpenImage(name)
	if err != nil {
		return Manifest{}, fmt.Errorf("piece manifest: %w", err)
	}
	defer f.Close()
	blob, err := s.BlobPath(rec.Raw)
	if err != nil {
		return Manifest{}, fmt.Errorf("piece manifest %s: %w", name, err)
	}
	cache := blob + manifestSuffix
	manifestMu.Lock()
	defer manifestMu.Unlock()
	// A missing, torn or stale cache file is rebuilt below.
	if m, err := readManifest(cache); err == nil && m.Raw == rec.Raw && m.SizeBytes == rec.SizeBytes && m.PieceBytes == PieceBytes {
		return m, nil
	}
	m, err := HashPieces(f, rec.SizeBytes)
	if err != nil {
		return Manifest{}, fmt.Errorf("piece manifest %s: %w", name, err)
	}
	if m.Raw != rec.Raw {
		return Manifest{}, fmt.Errorf("piece manifest %s: blob hashes to %s, record says %s", name, m.Raw, rec.Raw)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return Manifest{}, fmt.Errorf("piece manifest %s: %w", name, err)
	}
	if err := s.writeAtomic(cache, b, 0o444); err != nil {
		return Manifest{}, fmt.Errorf("piece manifest %s: cache: %w", name, err)
	}
	return m, nil
}

func readManifest(path string) (Manifest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Manifest{}, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, err
	}
	if want := (m.SizeBytes + m.PieceBytes - 1) / max(m.PieceBytes, 1); int64(len(m.Pieces)) != want {
		return Manifest{}, fmt.Errorf("manifest %s: %d pieces, want %d", path, len(m.Pieces), want)
	}
	return m, nil
}

// HashPieces reads exactly size bytes from r and returns their manifest
// (PieceBytes pieces). A short stream is an error.
func HashPieces(r io.Reader, size int64) (Manifest, error) {
	m := Manifest{PieceBytes: PieceBytes, SizeBytes: size}
	whole := sha256.New()
	buf := make([]byte, PieceBytes)
	for off := int64(0); off < size; off += PieceBytes {
		n := min(PieceBytes, size-off)
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return Manifest{}, fmt.Errorf("hash pieces at %d: %w", off, err)
		}
		sum := sha256.Sum256(buf[:n])
		m.Pieces = append(m.Pieces, hex.EncodeToString(sum[:]))
		whole.Write(buf[:n])
	}
	m.Raw = Digest{Algo: SHA256, Hex: hex.EncodeToString(whole.Sum(nil))}
	return m, nil
}

// CachedManifest returns name's manifest only if it is already cached
// (no hashing), and false otherwise: a deploy plan must not wait for a
// large image to be hashed.
func (s *Store) CachedManifest(name string) (Manifest, bool) {
	rec, ok := s.verified(name)
	if !ok {
		return Manifest{}, false
	}
	blob, err := s.BlobPath(rec.Raw)
	if err != nil {
		return Manifest{}, false
	}
	m, err := readManifest(blob + manifestSuffix)
	if err != nil || m.Raw != rec.Raw || m.SizeBytes != rec.SizeBytes || m.PieceBytes != PieceBytes {
		return Manifest{}, false
	}
	return m, true
}
