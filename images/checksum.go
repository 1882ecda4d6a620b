package images

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strings"
)

// Algorithm names a checksum algorithm Machina accepts for image verification.
type Algorithm string

// Accepted algorithms. MD5 and SHA-1 are recognised only to be refused
// (see [ErrWeakAlgorithm]).
const (
	SHA256 Algorithm = "sha256"
	SHA512 Algorithm = "sha512"
)

// MaxChecksumFileBytes caps the size of a checksum file Machina reads or
// parses (1 MiB); upstream files are a few kilobytes.
const MaxChecksumFileBytes = 1 << 20

// Errors returned by checksum parsing and verification.
var (
	// ErrWeakAlgorithm: the checksum uses MD5 or SHA-1 (named, or a 32/40
	// hex-digit hash), which Machina refuses.
	ErrWeakAlgorithm = errors.New("weak checksum algorithm refused")
	// ErrEmptyChecksumFile: the checksum file holds no entries.
	ErrEmptyChecksumFile = errors.New("checksum file has no entries")
	// ErrNoChecksumEntry: no entry in the checksum file names the image.
	ErrNoChecksumEntry = errors.New("no checksum entry for image")
	// ErrAmbiguousChecksum: several entries for the image disagree.
	ErrAmbiguousChecksum = errors.New("conflicting checksum entries for image")
	// ErrBadChecksum: a checksum string (sha256:HEX) is malformed.
	ErrBadChecksum = errors.New("malformed checksum")
	// ErrChecksumMismatch: the downloaded bytes do not match the expected digest.
	ErrChecksumMismatch = errors.New("checksum mismatch")
)

// Digest is an expected or computed checksum: algorithm and lower-case hex.
type Digest struct {
	Algo Algorithm `json:"algo"`
	Hex  string    `json:"hex"`
}

// String renders d as "algo:hex", the form [ParseDigest] reads.
func (d Digest) String() string {
	if d.Hex == "" {
		return ""
	}
	return string(d.Algo) + ":" + d.Hex
}

// IsZero reports whether d is unset.
func (d Digest) IsZero() bool { return d.Hex == "" }

// New returns a fresh hash for d's algorithm.
func (a Algorithm) New() hash.Hash {
	if a == SHA512 {
		return sha512.New()
	}
	return sha256.New()
}

// hexLen is the digest length in hex digits.
func (a Algorithm) hexLen() int {
	if a == SHA512 {
		return 128
	}
	return 64
}

// ParseDigest reads "sha256:HEX" or "sha512:HEX" (algorithm case-insensitive,
// hex normalised to lower case). A bare HEX of 64 or 128 digits is accepted,
// the algorithm following its length. "md5:" and "sha1:" and 32/40-digit bare
// hashes return [ErrWeakAlgorithm]; anything else [ErrBadChecksum].
func ParseDigest(s string) (Digest, error) {
	s = strings.TrimSpace(s)
	algo, hx, found := strings.Cut(s, ":")
	if !found {
		hx, algo = algo, ""
	}
	d, err := digestFrom(algo, hx)
	if err != nil {
		return Digest{}, fmt.Errorf("parse checksum %q: %w", truncate(s, 80), err)
	}
	return d, nil
}

// digestFrom combines an optional algorithm name with a hex string.
func digestFrom(algo, hx string) (Digest, error) {
	hx = strings.ToLower(hx)
	if !isHex(hx) {
		return Digest{}, ErrBadChecksum
	}
	var a Algorithm
	switch normAlgo(algo) {
	case "":
		switch len(hx) {
		case 64:
			a = SHA256
		case 128:
			a = SHA512
		case 32, 40:
			return Digest{}, ErrWeakAlgorithm
		default:
			return Digest{}, ErrBadChecksum
		}
	case "sha256":
		a = SHA256
	case "sha512":
		a = SHA512
	case "md5", "sha1":
		return Digest{}, ErrWeakAlgorithm
	default:
		return Digest{}, fmt.Errorf("%w: unknown algorithm %q", ErrBadChecksum, truncate(algo, 20))
	}
	if len(hx) != a.hexLen() {
		return Digest{}, fmt.Errorf("%w: %s needs %d hex digits, got %d", ErrBadChecksum, a, a.hexLen(), len(hx))
	}
	return Digest{Algo: a, Hex: hx}, nil
}

// normAlgo maps the spellings found in checksum files (SHA256, SHA-256,
// sha256sum, SHA2-256, MD5, SHA1) to "sha256", "sha512", "md5", "sha1" or
// the lower-cased input.
func normAlgo(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimSuffix(s, "sum")
	if rest, ok := strings.CutPrefix(s, "sha2-"); ok {
		s = "sha" + rest
	}
	s = strings.ReplaceAll(s, "-", "")
	switch s {
	case "sha256", "sha512", "md5", "sha1", "":
		return s
	case "sha": // "SHA-2" alone is ambiguous; "sha" is SHA-1's old name
		return "sha1"
	}
	return s
}

func isHex(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ChecksumEntry is one line of a checksum file.
type ChecksumEntry struct {
	Name   string // file name as written (binary marker removed); "" for a bare hash
	Digest Digest
}

// ParseChecksumFile parses a checksum file and returns its entries in order.
// It accepts, mixed in one file:
//
//   - GNU coreutils: "HEX  name", "HEX *name" (binary marker), "HEX name",
//     and the escaped form "\HEX  name\\with\nescapes";
//   - BSD and coreutils --tag: "SHA256 (name) = HEX";
//   - Rocky/Fedora CHECKSUM files (BSD lines plus "# name: N bytes" comments);
//   - a PGP clear-signed wrapper (RFC 4880 section 7; dash-escaping undone,
//     signature NOT verified);
//   - comments ("#" lines) and blank lines;
//   - a file holding only a bare hash (an entry with an empty Name).
//
// Entries whose algorithm is MD5 or SHA-1 are skipped; if every entry is weak
// the error wraps [ErrWeakAlgorithm]. A file with no entries returns
// [ErrEmptyChecksumFile]. Input beyond [MaxChecksumFileBytes] is refused.
func ParseChecksumFile(data []byte) ([]ChecksumEntry, error) {
	if len(data) > MaxChecksumFileBytes {
		return nil, fmt.Errorf("parse checksum file: %d bytes exceeds %d", len(data), MaxChecksumFileBytes)
	}
	data = unwrapClearSigned(data)
	var entries []ChecksumEntry
	weak := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), MaxChecksumFileBytes+1)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimRight(sc.Text(), " \t\r")
		trimmed := strings.TrimLeft(line, " \t")
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		e, err := parseChecksumLine(trimmed)
		if errors.Is(err, ErrWeakAlgorithm) {
			weak++
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("parse checksum file: line %d: %w", lineNo, err)
		}
		entries = append(entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("parse checksum file: %w", err)
	}
	if len(entries) == 0 {
		if weak > 0 {
			return nil, fmt.Errorf("parse checksum file: only MD5/SHA-1 entries: %w", ErrWeakAlgorithm)
		}
		return nil, fmt.Errorf("parse checksum file: %w", ErrEmptyChecksumFile)
	}
	return entries, nil
}

// parseChecksumLine parses one non-blank, non-comment line.
func parseChecksumLine(line string) (ChecksumEntry, error) {
	// BSD / --tag: ALGO (name) = HEX
	if i := strings.Index(line, " ("); i > 0 && !strings.ContainsAny(line[:i], " \t") {
		if j := strings.LastIndex(line, ") = "); j > i {
			d, err := digestFrom(line[:i], strings.TrimSpace(line[j+4:]))
			if err != nil {
				return ChecksumEntry{}, err
			}
			return ChecksumEntry{Name: line[i+2 : j], Digest: d}, nil
		}
	}
	// GNU: [\]HEX( [ *]name)?
	escaped := false
	if strings.HasPrefix(line, `\`) {
		escaped = true
		line = line[1:]
	}
	hx, rest, hasName := strings.Cut(line, " ")
	if !hasName {
		if t, r, ok := strings.Cut(line, "\t"); ok {
			hx, rest, hasName = t, r, true
		}
	}
	d, err := digestFrom("", hx)
	if err != nil {
		return ChecksumEntry{}, err
	}
	if !hasName {
		return ChecksumEntry{Digest: d}, nil
	}
	// "HEX  name" (text mode), "HEX *name" (binary), "HEX name" (single space).
	if strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "*") {
		rest = rest[1:]
	}
	if escaped {
		rest = unescapeGNU(rest)
	}
	if rest == "" {
		return ChecksumEntry{}, fmt.Errorf("%w: entry has no file name", ErrBadChecksum)
	}
	return ChecksumEntry{Name: rest, Digest: d}, nil
}

// unescapeGNU undoes coreutils' escaping of "\\" and "\n" in names.
func unescapeGNU(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			switch s[i+1] {
			case '\\':
				b.WriteByte('\\')
				i++
				continue
			case 'n':
				b.WriteByte('\n')
				i++
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unwrapClearSigned returns the signed text of an RFC 4880 section 7
// cleartext-signed message, or data unchanged if it is not one.
func unwrapClearSigned(data []byte) []byte {
	const begin = "-----BEGIN PGP SIGNED MESSAGE-----"
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if !bytes.HasPrefix(trimmed, []byte(begin)) {
		return data
	}
	lines := strings.Split(string(trimmed), "\n")
	var out []string
	i := 1
	// Armor headers ("Hash: SHA256") end at the first blank line.
	for ; i < len(lines); i++ {
		if strings.TrimRight(lines[i], "\r \t") == "" {
			i++
			break
		}
	}
	for ; i < len(lines); i++ {
		l := strings.TrimRight(lines[i], "\r")
		if strings.HasPrefix(l, "-----BEGIN PGP SIGNATURE-----") {
			break
		}
		out = append(out, strings.TrimPrefix(l, "- "))
	}
	return []byte(strings.Join(out, "\n"))
}

// FindChecksum returns the digest the checksum file data gives for the file
// called base (the exact base name of the image URL). Names are compared
// literally, never as patterns: an entry matches when it equals base, or
// equals "./"+base or ends in "/"+base. A file holding a single bare hash
// matches any base. When several entries match, the strongest algorithm wins
// (SHA-512 over SHA-256); disagreeing entries of that algorithm return
// [ErrAmbiguousChecksum]. No match returns [ErrNoChecksumEntry].
func FindChecksum(data []byte, base string) (Digest, error) {
	entries, err := ParseChecksumFile(data)
	if err != nil {
		return Digest{}, err
	}
	if len(entries) == 1 && entries[0].Name == "" {
		return entries[0].Digest, nil
	}
	var best Digest
	for _, e := range entries {
		if !nameMatches(e.Name, base) {
			continue
		}
		switch {
		case best.IsZero(), e.Digest.Algo == SHA512 && best.Algo == SHA256:
			best = e.Digest
		case e.Digest.Algo == best.Algo && e.Digest.Hex != best.Hex:
			return Digest{}, fmt.Errorf("find checksum for %q: %w", truncate(base, 200), ErrAmbiguousChecksum)
		}
	}
	if best.IsZero() {
		return Digest{}, fmt.Errorf("find checksum for %q: %w", truncate(base, 200), ErrNoChecksumEntry)
	}
	return best, nil
}

func nameMatches(entry, base string) bool {
	if base == "" || entry == "" {
		return false
	}
	return entry == base || strings.HasSuffix(entry, "/"+base)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// digestHex returns h's sum as lower-case hex.
func digestHex(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }
