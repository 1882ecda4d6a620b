package images

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	hexA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	hexB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	hex5 = "5555555555555555555555555555555555555555555555555555555555555555" +
		"5555555555555555555555555555555555555555555555555555555555555555"
)

func TestFindChecksum(t *testing.T) {
	const img = "noble-server-cloudimg-amd64.img"
	tests := []struct {
		name string
		file string
		base string
		want Digest
		err  error
	}{
		{"gnu text mode", hexB + "  other.img\n" + hexA + "  " + img + "\n", img, Digest{SHA256, hexA}, nil},
		{"gnu binary marker (ubuntu)", hexB + " *other.img\n" + hexA + " *" + img + "\n", img, Digest{SHA256, hexA}, nil},
		{"gnu single space", hexA + " " + img + "\n", img, Digest{SHA256, hexA}, nil},
		{"gnu upper-case hex", strings.ToUpper(hexA) + "  " + img + "\n", img, Digest{SHA256, hexA}, nil},
		{"gnu sha512 by length (debian)", hex5 + "  debian-12-genericcloud-amd64.qcow2\n", "debian-12-genericcloud-amd64.qcow2", Digest{SHA512, hex5}, nil},
		{"gnu escaped name", `\` + hexA + `  a\\b.img` + "\n", `a\b.img`, Digest{SHA256, hexA}, nil},
		{"crlf line ends", hexA + "  " + img + "\r\n", img, Digest{SHA256, hexA}, nil},
		{"bsd tag", "SHA256 (" + img + ") = " + hexA + "\n", img, Digest{SHA256, hexA}, nil},
		{"bsd name with parens", "SHA256 (a (1).img) = " + hexA + "\n", "a (1).img", Digest{SHA256, hexA}, nil},
		{"rocky CHECKSUM", "# Rocky-9-GenericCloud-Base.latest.x86_64.qcow2: 609812480 bytes\n" +
			"SHA256 (Rocky-9-GenericCloud-Base.latest.x86_64.qcow2) = " + hexA + "\n" +
			"# Rocky-9-GenericCloud-LVM.latest.x86_64.qcow2: 1 bytes\n" +
			"SHA256 (Rocky-9-GenericCloud-LVM.latest.x86_64.qcow2) = " + hexB + "\n",
			"Rocky-9-GenericCloud-Base.latest.x86_64.qcow2", Digest{SHA256, hexA}, nil},
		{"sha512 preferred over sha256", "SHA256 (x.img) = " + hexA + "\nSHA512 (x.img) = " + hex5 + "\n", "x.img", Digest{SHA512, hex5}, nil},
		{"comments and blanks", "# made by hand\n\n   \n" + hexA + "  x.img\n", "x.img", Digest{SHA256, hexA}, nil},
		{"bare hash", hexA + "\n", "anything.img", Digest{SHA256, hexA}, nil},
		{"bare hash sha512", "  " + hex5 + "  \n", "anything.img", Digest{SHA512, hex5}, nil},
		{"path entry", hexA + "  ./x.img\n", "x.img", Digest{SHA256, hexA}, nil},
		{"pgp clear-signed", "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n" +
			hexB + "  y.img\n" + "- " + hexA + "  x.img\n" +
			"-----BEGIN PGP SIGNATURE-----\n\niQIzBAEBCAAdFiEE\n=abcd\n-----END PGP SIGNATURE-----\n",
			"x.img", Digest{SHA256, hexA}, nil},
		{"pgp signature body ignored", "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA512\n\n" + hexA + "  x.img\n" +
			"-----BEGIN PGP SIGNATURE-----\n" + hexB + "  y.img\n-----END PGP SIGNATURE-----\n",
			"y.img", Digest{}, ErrNoChecksumEntry},
		{"no match", hexA + "  x.img\n", "y.img", Digest{}, ErrNoChecksumEntry},
		{"prefix is not a match", hexA + "  x.img.asc\n", "x.img", Digest{}, ErrNoChecksumEntry},
		{"suffix is not a match", hexA + "  old-x.img\n", "x.img", Digest{}, ErrNoChecksumEntry},
		{"pattern characters are literal", hexA + "  x?img\n" + hexB + "  *.img\n", "x.img", Digest{}, ErrNoChecksumEntry},
		{"star name literal", hexA + "  x.img\n" + hexB + " **.img\n", "*.img", Digest{SHA256, hexB}, nil},
		{"empty file", "", "x.img", Digest{}, ErrEmptyChecksumFile},
		{"only comments", "# nothing\n\n", "x.img", Digest{}, ErrEmptyChecksumFile},
		{"md5 refused", "d41d8cd98f00b204e9800998ecf8427e  x.img\n", "x.img", Digest{}, ErrWeakAlgorithm},
		{"sha1 refused", "da39a3ee5e6b4b0d3255bfef95601890afd80709  x.img\n", "x.img", Digest{}, ErrWeakAlgorithm},
		{"named md5 refused", "MD5 (x.img) = d41d8cd98f00b204e9800998ecf8427e\n", "x.img", Digest{}, ErrWeakAlgorithm},
		{"weak entries skipped", "MD5 (x.img) = d41d8cd98f00b204e9800998ecf8427e\nSHA256 (x.img) = " + hexA + "\n", "x.img", Digest{SHA256, hexA}, nil},
		{"conflicting entries", hexA + "  x.img\n" + hexB + "  x.img\n", "x.img", Digest{}, ErrAmbiguousChecksum},
		{"algorithm and length disagree", "SHA512 (x.img) = " + hexA + "\n", "x.img", Digest{}, ErrBadChecksum},
		{"garbage line", "hello world\n", "x.img", Digest{}, ErrBadChecksum},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FindChecksum([]byte(tc.file), tc.base)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("FindChecksum() error = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("FindChecksum() error = %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("FindChecksum() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseDigest(t *testing.T) {
	tests := []struct {
		in   string
		want Digest
		err  error
	}{
		{"sha256:" + hexA, Digest{SHA256, hexA}, nil},
		{"SHA256:" + strings.ToUpper(hexA), Digest{SHA256, hexA}, nil},
		{"sha512:" + hex5, Digest{SHA512, hex5}, nil},
		{hexA, Digest{SHA256, hexA}, nil},
		{"sha256:" + hex5, Digest{}, ErrBadChecksum},
		{"md5:d41d8cd98f00b204e9800998ecf8427e", Digest{}, ErrWeakAlgorithm},
		{"sha1:da39a3ee5e6b4b0d3255bfef95601890afd80709", Digest{}, ErrWeakAlgorithm},
		{"sha256:xyz", Digest{}, ErrBadChecksum},
		{"crc32:" + hexA, Digest{}, ErrBadChecksum},
		{"", Digest{}, ErrBadChecksum},
	}
	for _, tc := range tests {
		got, err := ParseDigest(tc.in)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("ParseDigest(%q) error = %v, want %v", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseDigest(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// FuzzFindChecksum checks that arbitrary checksum files never panic, and
// that any digest returned is well formed and came from a line that names
// the base literally (or is the file's only, bare hash).
func FuzzFindChecksum(f *testing.F) {
	f.Add([]byte(hexA+" *x.img\n"), "x.img")
	f.Add([]byte("SHA256 (x.img) = "+hexA+"\n"), "x.img")
	f.Add([]byte("-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n- "+hexA+"  x.img\n-----BEGIN PGP SIGNATURE-----\n"), "x.img")
	f.Add([]byte(hex5+"\n"), "y")
	f.Add([]byte(`\`+hexA+`  a\nb`+"\n"), "a\nb")
	f.Add([]byte("# c\nMD5 (x) = d41d8cd98f00b204e9800998ecf8427e\n"), "x")
	f.Fuzz(func(t *testing.T, data []byte, base string) {
		if len(data) > 64<<10 {
			return
		}
		d, err := FindChecksum(data, base)
		if err != nil {
			return
		}
		if len(d.Hex) != d.Algo.hexLen() || !isHex(d.Hex) || (d.Algo != SHA256 && d.Algo != SHA512) {
			t.Fatalf("FindChecksum returned malformed digest %+v", d)
		}
		if !strings.Contains(strings.ToLower(string(data)), d.Hex) {
			t.Fatalf("digest %s not present in input", d.Hex)
		}
		entries, err := ParseChecksumFile(data)
		if err != nil {
			t.Fatalf("FindChecksum succeeded but ParseChecksumFile failed: %v", err)
		}
		found := false
		for _, e := range entries {
			if e.Digest == d && (e.Name == "" && len(entries) == 1 || nameMatches(e.Name, base)) {
				found = true
			}
		}
		if !found {
			t.Fatalf("digest %v for %q not backed by a matching entry in %+v", d, base, entries)
		}
	})
}
