package images

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const mib = 1 << 20

func TestImportRawWithChecksum(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, 3*mib)
	srv.put("/x.raw", raw)
	e := newTestEnv(t, nil)
	var reports []Progress
	rec, err := e.im.Import(t.Context(), Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String(),
		Progress: func(p Progress) { reports = append(reports, p) }})
	if err != nil {
		t.Fatalf("Import() = %v", err)
	}
	if rec.State != StateVerified || rec.Raw != sha256Of(raw) || rec.SizeBytes != int64(len(raw)) || rec.SourceFormat != FormatRaw {
		t.Errorf("record = %+v", rec)
	}
	if !bytes.Equal(readBlob(t, e.store, rec), raw) {
		t.Error("stored blob differs from served bytes")
	}
	last := reports[len(reports)-1]
	if last.Phase != PhaseDownload || !last.Done || last.Bytes != int64(len(raw)) || last.Total != int64(len(raw)) {
		t.Errorf("last progress = %+v", last)
	}
	if diff := cmp.Diff([]State{StatePending, StateDownloading, StateVerified}, e.status.states()); diff != "" {
		t.Errorf("status states (-want +got):\n%s", diff)
	}
	if left := tmpEntries(t, e.store); len(left) != 0 {
		t.Errorf("tmp not empty after import: %v", left)
	}
}

func TestImportResumesAfterDroppedConnection(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, 4*mib)
	srv.put("/x.raw", raw)
	srv.inject(fault{path: "/x.raw", drop: mib + 123}, fault{path: "/x.raw", drop: mib})
	e := newTestEnv(t, nil)
	rec, err := e.im.Import(t.Context(), Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()})
	if err != nil {
		t.Fatalf("Import() = %v", err)
	}
	if !bytes.Equal(readBlob(t, e.store, rec), raw) {
		t.Fatal("stored blob differs")
	}
	etag := srv.etags["/x.raw"]
	want := []string{
		"/x.raw range= if-range=",
		"/x.raw range=bytes=1048699- if-range=" + etag,
		"/x.raw range=bytes=2097275- if-range=" + etag,
	}
	if diff := cmp.Diff(want, srv.requests("/x.raw")); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestImportResumesAcrossRestart(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, 2*mib)
	srv.put("/x.raw", raw)
	srv.inject(fault{path: "/x.raw", drop: 700_000})
	e := newTestEnv(t, func(c *Config) { c.MaxAttempts = 1 })
	req := Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()}
	if _, err := e.im.Import(t.Context(), req); err == nil {
		t.Fatal("first Import() succeeded with MaxAttempts=1 and a dropped connection")
	}
	if r, err := e.store.Lookup("x"); err != nil || r.State != StateFailed || !strings.Contains(r.Reason, "unexpected EOF") {
		t.Errorf("record after failure = %+v, %v", r, err)
	}
	// A new process: new store handle, new importer.
	st2, err := OpenStore(e.store.Root())
	if err != nil {
		t.Fatal(err)
	}
	im2, err := New(Config{Store: st2, Sleep: e.sleeps.sleep})
	if err != nil {
		t.Fatal(err)
	}
	var phases []Phase
	rec, err := im2.Import(t.Context(), Request{Name: req.Name, URL: req.URL, Checksum: req.Checksum,
		Progress: func(p Progress) {
			if p.Done {
				phases = append(phases, p.Phase)
			}
		}})
	if err != nil {
		t.Fatalf("second Import() = %v", err)
	}
	if !bytes.Equal(readBlob(t, st2, rec), raw) {
		t.Fatal("stored blob differs")
	}
	reqs := srv.requests("/x.raw")
	if len(reqs) != 2 || !strings.HasPrefix(reqs[1], "/x.raw range=bytes=700000- ") {
		t.Errorf("requests = %q, want the second to resume at 700000", reqs)
	}
	if diff := cmp.Diff([]Phase{PhaseResume, PhaseDownload}, phases); diff != "" {
		t.Errorf("phases (-want +got):\n%s", diff)
	}
}

func TestImportRestartsWhenUpstreamChanged(t *testing.T) {
	srv := newFaultServer(t)
	old := randomRaw(t, mib)
	raw := randomRaw(t, mib)
	srv.put("/x.raw", old)
	srv.inject(fault{path: "/x.raw", drop: 1000})
	e := newTestEnv(t, func(c *Config) { c.MaxAttempts = 1 })
	req := Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()}
	e.im.Import(t.Context(), req) // leaves 1000 bytes of the old file
	srv.put("/x.raw", raw)        // new ETag: If-Range fails, server sends 200
	rec, err := e.im.Import(t.Context(), req)
	if err != nil {
		t.Fatalf("Import() = %v", err)
	}
	if !bytes.Equal(readBlob(t, e.store, rec), raw) {
		t.Fatal("stored blob mixes old and new upstream bytes")
	}
}

func TestImportRetries(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, mib)
	srv.put("/x.raw", raw)
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	srv.inject(
		fault{path: "/x.raw", code: 500},
		fault{path: "/x.raw", code: 429, retryAfter: "7"},
		fault{path: "/x.raw", code: 503, retryAfter: date},
		fault{path: "/x.raw", code: 429, retryAfter: "100000"},
	)
	e := newTestEnv(t, func(c *Config) {
		c.BackoffBase = time.Second
		c.BackoffMax = 4 * time.Second
		c.MaxRetryAfter = time.Hour
	})
	if _, err := e.im.Import(t.Context(), Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()}); err != nil {
		t.Fatalf("Import() = %v", err)
	}
	w := e.sleeps.get()
	if len(w) != 4 {
		t.Fatalf("waits = %v, want 4", w)
	}
	if w[0] < 500*time.Millisecond || w[0] > time.Second {
		t.Errorf("backoff after 500 = %v, want in [0.5s,1s]", w[0])
	}
	if w[1] != 7*time.Second {
		t.Errorf("wait after 429 Retry-After: 7 = %v, want 7s", w[1])
	}
	if w[2] < 85*time.Second || w[2] > 90*time.Second {
		t.Errorf("wait after 503 Retry-After: <date+90s> = %v", w[2])
	}
	if w[3] != time.Hour {
		t.Errorf("wait after huge Retry-After = %v, want capped at MaxRetryAfter 1h", w[3])
	}
}

func TestImportGivesUp(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, 1000)
	srv.put("/x.raw", raw)
	for range 10 {
		srv.inject(fault{path: "/x.raw", code: 502})
	}
	e := newTestEnv(t, func(c *Config) { c.MaxAttempts = 3 })
	_, err := e.im.Import(t.Context(), Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()})
	var se *StatusError
	if !errors.As(err, &se) || se.Code != 502 {
		t.Fatalf("Import() = %v, want StatusError 502", err)
	}
	if n := len(srv.requests("/x.raw")); n != 3 {
		t.Errorf("requests = %d, want 3", n)
	}
	if st := e.status.last(); st.State != StateFailed || !strings.Contains(st.Reason, "502") {
		t.Errorf("last status = %+v", st)
	}
}

func TestImportNotFoundIsNotRetried(t *testing.T) {
	srv := newFaultServer(t)
	e := newTestEnv(t, nil)
	_, err := e.im.Import(t.Context(), Request{Name: "x", URL: srv.URL + "/missing.raw", Checksum: "sha256:" + hexA})
	var se *StatusError
	if !errors.As(err, &se) || se.Code != 404 {
		t.Fatalf("Import() = %v, want StatusError 404", err)
	}
	if n := len(srv.requests("/missing.raw")); n != 1 || len(e.sleeps.get()) != 0 {
		t.Errorf("requests = %d, waits = %v; want 1 and none", n, e.sleeps.get())
	}
}

func TestImportChecksumMismatch(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, mib)
	srv.put("/x.raw", raw)
	srv.put("/SHA256SUMS", []byte(hexA+" *x.raw\n"))
	e := newTestEnv(t, nil)
	_, err := e.im.Import(t.Context(), Request{Name: "x", URL: srv.URL + "/x.raw", ChecksumURL: srv.URL + "/SHA256SUMS"})
	var me *MismatchError
	if !errors.As(err, &me) || !errors.Is(err, ErrChecksumMismatch) || me.Want.Hex != hexA || me.Got != sha256Of(raw) {
		t.Fatalf("Import() = %v, want MismatchError", err)
	}
	if left := tmpEntries(t, e.store); len(left) != 0 {
		t.Errorf("mismatched download kept: %v", left)
	}
	blobs, _ := os.ReadDir(e.store.blobDir())
	if len(blobs) != 0 {
		t.Errorf("blobs = %v, want none", blobs)
	}
	r, err := e.store.Lookup("x")
	if err != nil || r.State != StateFailed || !strings.Contains(r.Reason, "checksum mismatch: want sha256:"+hexA) {
		t.Errorf("record = %+v, %v; want failed with the mismatch reason", r, err)
	}
	if _, _, err := e.store.OpenImage("x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("OpenImage() of failed image = %v, want ErrNotFound", err)
	}
}

func TestImportRedirects(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, mib)
	srv.put("/x.raw", raw)
	srv.inject(fault{path: "/a", code: 302, location: "/b"}, fault{path: "/b", code: 301, location: "/x.raw"})
	e := newTestEnv(t, nil)
	if _, err := e.im.Import(t.Context(), Request{Name: "x", URL: srv.URL + "/a", Checksum: sha256Of(raw).String()}); err != nil {
		t.Fatalf("Import() via two redirects = %v", err)
	}

	for range 10 {
		srv.inject(fault{path: "/loop", code: 302, location: "/loop"})
	}
	e2 := newTestEnv(t, func(c *Config) { c.MaxRedirects = 3 })
	_, err := e2.im.Import(t.Context(), Request{Name: "y", URL: srv.URL + "/loop", Checksum: sha256Of(raw).String()})
	if !errors.Is(err, ErrTooManyRedirects) {
		t.Fatalf("Import() via redirect loop = %v, want ErrTooManyRedirects", err)
	}
	if n := len(srv.requests("/loop")); n != 4 {
		t.Errorf("loop requests = %d, want 4 (1 + 3 redirects, no retry)", n)
	}
}

func TestImportChecksumFileFormats(t *testing.T) {
	raw := randomRaw(t, 100_000)
	d := sha256Of(raw)
	files := map[string]string{
		"gnu":     hexB + "  other.raw\n" + d.Hex + "  disk.raw\n",
		"binary":  hexB + " *other.raw\n" + d.Hex + " *disk.raw\n",
		"bsd":     "SHA256 (other.raw) = " + hexB + "\nSHA256 (disk.raw) = " + d.Hex + "\n",
		"rocky":   "# disk.raw: 100000 bytes\nSHA256 (disk.raw) = " + d.Hex + "\n",
		"pgp":     "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n" + d.Hex + "  disk.raw\n-----BEGIN PGP SIGNATURE-----\n\nabc\n-----END PGP SIGNATURE-----\n",
		"comment": "# SHA256 checksums\n\n" + d.Hex + "  disk.raw\n",
		"bare":    d.Hex + "\n",
	}
	for name, body := range files {
		t.Run(name, func(t *testing.T) {
			srv := newFaultServer(t)
			srv.put("/dir/disk.raw", raw)
			srv.put("/dir/SUMS", []byte(body))
			e := newTestEnv(t, nil)
			rec, err := e.im.Import(t.Context(), Request{Name: "disk", URL: srv.URL + "/dir/disk.raw", ChecksumURL: srv.URL + "/dir/SUMS"})
			if err != nil {
				t.Fatalf("Import() = %v", err)
			}
			if rec.Upstream != d {
				t.Errorf("upstream = %v, want %v", rec.Upstream, d)
			}
		})
	}
	for name, tc := range map[string]struct {
		body string
		err  error
	}{
		"empty":    {"", ErrEmptyChecksumFile},
		"no match": {hexB + "  other.raw\n", ErrNoChecksumEntry},
		"md5":      {"d41d8cd98f00b204e9800998ecf8427e  disk.raw\n", ErrWeakAlgorithm},
	} {
		t.Run(name, func(t *testing.T) {
			srv := newFaultServer(t)
			srv.put("/dir/disk.raw", raw)
			srv.put("/dir/SUMS", []byte(tc.body))
			e := newTestEnv(t, nil)
			_, err := e.im.Import(t.Context(), Request{Name: "disk", URL: srv.URL + "/dir/disk.raw", ChecksumURL: srv.URL + "/dir/SUMS"})
			if !errors.Is(err, tc.err) {
				t.Fatalf("Import() = %v, want %v", err, tc.err)
			}
			if n := len(srv.requests("/dir/disk.raw")); n != 0 {
				t.Errorf("image downloaded %d times without a usable checksum", n)
			}
		})
	}
}

func TestImportIdempotent(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, mib)
	srv.put("/x.raw", raw)
	e := newTestEnv(t, nil)
	req := Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()}
	r1, err := e.im.Import(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := e.im.Import(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if r1 != r2 {
		t.Errorf("second import changed the record: %+v vs %+v", r1, r2)
	}
	if n := len(srv.requests("/x.raw")); n != 1 {
		t.Errorf("image fetched %d times, want 1", n)
	}
	// Same bytes under a second name share the blob.
	req.Name = "x2"
	if _, err := e.im.Import(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Remove("x"); err != nil {
		t.Fatal(err)
	}
	if f, _, err := e.store.OpenImage("x2"); err != nil {
		t.Fatalf("blob shared with x2 removed with x: %v", err)
	} else {
		f.Close()
	}
}

func TestImportQCOW2RoundTrip(t *testing.T) {
	raw := randomRaw(t, 5*mib+4096)
	q := toQCOW2(t, raw)
	if f := detectHeader(q); f != FormatQCOW2 {
		t.Fatalf("qemu-img output detected as %s", f)
	}
	srv := newFaultServer(t)
	// Ubuntu names its qcow2 files .img: detection must not trust the name.
	srv.put("/noble.img", q)
	srv.inject(fault{path: "/noble.img", drop: int64(len(q) / 2)})
	e := newTestEnv(t, nil)
	var phases []Phase
	rec, err := e.im.Import(t.Context(), Request{Name: "noble", URL: srv.URL + "/noble.img", Checksum: sha256Of(q).String(),
		Progress: func(p Progress) {
			if p.Done {
				phases = append(phases, p.Phase)
			}
		}})
	if err != nil {
		t.Fatalf("Import() = %v", err)
	}
	if rec.SourceFormat != FormatQCOW2 || rec.Upstream != sha256Of(q) || rec.Raw != sha256Of(raw) || rec.SizeBytes != int64(len(raw)) {
		t.Errorf("record = %+v, want raw digest %v", rec, sha256Of(raw))
	}
	if !bytes.Equal(readBlob(t, e.store, rec), raw) {
		t.Error("converted blob differs from the original raw bytes")
	}
	if diff := cmp.Diff([]Phase{PhaseDownload, PhaseConvert}, phases); diff != "" {
		t.Errorf("phases (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]State{StatePending, StateDownloading, StateConverting, StateVerified}, e.status.states()); diff != "" {
		t.Errorf("states (-want +got):\n%s", diff)
	}
	if left := tmpEntries(t, e.store); len(left) != 0 {
		t.Errorf("tmp not empty: %v", left)
	}
}

func TestImportRefusesFormats(t *testing.T) {
	needQemuImg(t)
	raw := randomRaw(t, mib)
	dir := t.TempDir()
	in := dir + "/in.raw"
	os.WriteFile(in, raw, 0o600)
	qemuImg(t, "convert", "-f", "raw", "-O", "vmdk", in, dir+"/d.vmdk")
	qemuImg(t, "convert", "-f", "raw", "-O", "vhdx", in, dir+"/d.vhdx")
	qemuImg(t, "create", "-f", "qcow2", "-b", in, "-F", "raw", dir+"/backed.qcow2")
	for _, tc := range []struct {
		file   string
		format Format
	}{{"d.vmdk", FormatVMDK}, {"d.vhdx", FormatVHDX}, {"backed.qcow2", FormatQCOW2}} {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile(dir + "/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			srv := newFaultServer(t)
			srv.put("/disk.img", b)
			e := newTestEnv(t, nil)
			_, err = e.im.Import(t.Context(), Request{Name: "d", URL: srv.URL + "/disk.img", Checksum: sha256Of(b).String()})
			var ue *UnsupportedFormatError
			if !errors.As(err, &ue) || !errors.Is(err, ErrUnsupportedFormat) || ue.Format != tc.format {
				t.Fatalf("Import() = %v, want UnsupportedFormatError %s", err, tc.format)
			}
			if left := tmpEntries(t, e.store); len(left) != 0 {
				t.Errorf("refused image kept: %v", left)
			}
		})
	}
}

func TestImportCrashDuringConversionResumes(t *testing.T) {
	raw := randomRaw(t, 2*mib)
	q := toQCOW2(t, raw)
	srv := newFaultServer(t)
	srv.put("/q.img", q)
	// First run: qemu-img that fails, as if the process died mid-conversion.
	e := newTestEnv(t, func(c *Config) { c.QemuImg = "/bin/false" })
	req := Request{Name: "q", URL: srv.URL + "/q.img", Checksum: sha256Of(q).String()}
	if _, err := e.im.Import(t.Context(), req); !errors.Is(err, ErrConvert) {
		t.Fatalf("Import() with failing qemu-img = %v, want ErrConvert", err)
	}
	id := partID(req.URL, sha256Of(q))
	os.WriteFile(e.store.tmpDir()+"/"+id+".raw", []byte("half-written"), 0o640) // debris of the crash
	st2, err := OpenStore(e.store.Root())
	if err != nil {
		t.Fatal(err)
	}
	if left := tmpEntries(t, st2); len(left) != 2 { // .part and .json remain
		t.Errorf("after reopen tmp = %v, want only the verified part and its metadata", left)
	}
	im2, _ := New(Config{Store: st2})
	rec, err := im2.Import(t.Context(), req)
	if err != nil {
		t.Fatalf("second Import() = %v", err)
	}
	if !bytes.Equal(readBlob(t, st2, rec), raw) {
		t.Error("blob differs after resumed conversion")
	}
	reqs := srv.requests("/q.img")
	if len(reqs) != 2 || !strings.Contains(reqs[1], "range=bytes=") {
		t.Errorf("requests = %q; want the second to be a range request for the end (416: already complete)", reqs)
	}
}

func TestImportCancel(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, mib)
	srv.put("/x.raw", raw)
	srv.inject(fault{path: "/x.raw", code: 503, retryAfter: "5"})
	ctx, cancel := context.WithCancel(t.Context())
	e := newTestEnv(t, func(c *Config) {
		c.Sleep = func(context.Context, time.Duration) error { cancel(); return context.Canceled }
	})
	_, err := e.im.Import(ctx, Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Import() = %v, want context.Canceled", err)
	}
}

func TestImportBusy(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, 1000)
	srv.put("/x.raw", raw)
	e := newTestEnv(t, nil)
	req := Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()}
	// Hold the part lock as another process would.
	f, err := os.OpenFile(e.store.tmpDir()+"/"+partID(req.URL, sha256Of(raw))+".part", os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := lockFile(f); err != nil {
		t.Fatal(err)
	}
	if _, err := e.im.Import(t.Context(), req); !errors.Is(err, ErrBusy) {
		t.Fatalf("Import() while locked = %v, want ErrBusy", err)
	}
}

func TestImportRequestValidation(t *testing.T) {
	e := newTestEnv(t, nil)
	for _, tc := range []struct {
		req Request
		err error
	}{
		{Request{Name: "x", URL: "http://127.0.0.1:1/x"}, ErrBadChecksum},
		{Request{Name: "../etc", URL: "http://127.0.0.1:1/x", Checksum: "sha256:" + hexA}, ErrBadName},
		{Request{URL: "http://127.0.0.1:1/x", Checksum: "sha256:" + hexA}, ErrBadName},
		{Request{Name: "x", URL: "ftp://h/x", Checksum: "sha256:" + hexA}, ErrBadURL},
		{Request{Catalog: "windows-11"}, ErrUnknownImage},
		{Request{Catalog: "ubuntu-24.04", Arch: "riscv64"}, ErrUnknownArch},
		{Request{Catalog: "ubuntu-24.04", Mirrors: Mirrors{Base: "mirror.lan"}}, ErrBadURL},
		{Request{Name: "x", URL: "http://127.0.0.1:1/x", Checksum: "md5:d41d8cd98f00b204e9800998ecf8427e"}, ErrWeakAlgorithm},
	} {
		if _, err := e.im.Import(t.Context(), tc.req); !errors.Is(err, tc.err) {
			t.Errorf("Import(%+v) = %v, want %v", tc.req, err, tc.err)
		}
	}
}

func TestImportQCOW2Variants(t *testing.T) {
	needQemuImg(t)
	tailZeros := randomRaw(t, 16*mib)
	clear(tailZeros[12*mib:])
	for _, tc := range []struct {
		name  string
		raw   []byte
		extra []string
	}{
		{"compressed clusters", randomRaw(t, 16*mib), []string{"-c"}},
		{"qcow2 v2", randomRaw(t, 8*mib+512), []string{"-o", "compat=0.10"}},
		{"small clusters", randomRaw(t, 8*mib), []string{"-o", "cluster_size=4096"}},
		{"trailing zeros", tailZeros, nil},
		{"all zeros", make([]byte, 8*mib), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := toQCOW2(t, tc.raw, tc.extra...)
			srv := newFaultServer(t)
			srv.put("/q.img", q)
			e := newTestEnv(t, nil)
			var phases []Phase
			rec, err := e.im.Import(t.Context(), Request{Name: "q", URL: srv.URL + "/q.img", Checksum: sha256Of(q).String(),
				Progress: func(p Progress) {
					if p.Done {
						phases = append(phases, p.Phase)
					}
				}})
			if err != nil {
				t.Fatalf("Import() = %v", err)
			}
			if rec.Raw != sha256Of(tc.raw) || !bytes.Equal(readBlob(t, e.store, rec), tc.raw) {
				t.Errorf("raw digest %v, want %v (or blob bytes differ)", rec.Raw, sha256Of(tc.raw))
			}
			// No PhaseHash: the digest was computed while qemu-img wrote.
			if diff := cmp.Diff([]Phase{PhaseDownload, PhaseConvert}, phases); diff != "" {
				t.Errorf("phases (-want +got):\n%s", diff)
			}
		})
	}
}

func TestImportStalledBodyIsRetried(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, mib)
	srv.put("/x.raw", raw)
	srv.inject(fault{path: "/x.raw", stall: 300_000})
	e := newTestEnv(t, func(c *Config) { c.StallTimeout = 200 * time.Millisecond })
	rec, err := e.im.Import(t.Context(), Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()})
	if err != nil {
		t.Fatalf("Import() = %v", err)
	}
	if !bytes.Equal(readBlob(t, e.store, rec), raw) {
		t.Fatal("blob differs")
	}
	reqs := srv.requests("/x.raw")
	if len(reqs) != 2 || !strings.HasPrefix(reqs[1], "/x.raw range=bytes=300000- ") {
		t.Errorf("requests = %q, want a resume at 300000 after the stall", reqs)
	}
}

func TestImportFileURLs(t *testing.T) {
	raw := randomRaw(t, 100_000)
	p := t.TempDir() + "/disk.raw"
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	req := Request{Name: "f", URL: "file://" + p, Checksum: sha256Of(raw).String()}
	e := newTestEnv(t, nil)
	if _, err := e.im.Import(t.Context(), req); !errors.Is(err, ErrFileURL) {
		t.Fatalf("Import(file://) without AllowFileURLs = %v, want ErrFileURL", err)
	}
	e2 := newTestEnv(t, func(c *Config) { c.AllowFileURLs = true })
	rec, err := e2.im.Import(t.Context(), req)
	if err != nil {
		t.Fatalf("Import(file://) = %v", err)
	}
	if !bytes.Equal(readBlob(t, e2.store, rec), raw) {
		t.Fatal("blob differs")
	}
}

func TestImportKeepsVerifiedImageWhenMirrorGone(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, 100_000)
	srv.put("/d/disk.raw", raw)
	srv.put("/d/SHA256SUMS", []byte(sha256Of(raw).Hex+"  disk.raw\n"))
	e := newTestEnv(t, func(c *Config) { c.MaxAttempts = 2 })
	req := Request{Name: "disk", URL: srv.URL + "/d/disk.raw", ChecksumURL: srv.URL + "/d/SHA256SUMS"}
	if _, err := e.im.Import(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	rec, err := e.im.Import(t.Context(), req)
	if err != nil || rec.State != StateVerified || rec.Raw != sha256Of(raw) {
		t.Fatalf("Import() with mirror gone = %+v, %v; want the verified record", rec, err)
	}
	// A different source with the mirror gone is an error.
	req.Name = "other"
	if _, err := e.im.Import(t.Context(), req); err == nil {
		t.Fatal("Import() of a new image with the mirror gone succeeded")
	}
}

func TestImportResumedMismatchStartsOver(t *testing.T) {
	srv := newFaultServer(t)
	srv.noValidators = true
	old, raw := randomRaw(t, mib), randomRaw(t, mib)
	srv.put("/x.raw", old)
	srv.inject(fault{path: "/x.raw", drop: 5000})
	e := newTestEnv(t, func(c *Config) { c.MaxAttempts = 1 })
	req := Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()}
	e.im.Import(t.Context(), req) // keeps 5000 bytes of the old file
	srv.put("/x.raw", raw)        // no validators: the resume splices old and new
	rec, err := e.im.Import(t.Context(), req)
	if err != nil {
		t.Fatalf("Import() = %v", err)
	}
	if !bytes.Equal(readBlob(t, e.store, rec), raw) {
		t.Fatal("blob differs")
	}
	reqs := srv.requests("/x.raw")
	want := []string{"/x.raw range= if-range=", "/x.raw range=bytes=5000- if-range=", "/x.raw range= if-range="}
	if diff := cmp.Diff(want, reqs); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestImportRawWithSHA512(t *testing.T) {
	srv := newFaultServer(t)
	raw := randomRaw(t, mib)
	srv.put("/d/disk.raw", raw)
	h := SHA512.New()
	h.Write(raw)
	srv.put("/d/SHA512SUMS", []byte(digestHex(h)+"  disk.raw\n"))
	e := newTestEnv(t, nil)
	rec, err := e.im.Import(t.Context(), Request{Name: "d", URL: srv.URL + "/d/disk.raw", ChecksumURL: srv.URL + "/d/SHA512SUMS"})
	if err != nil {
		t.Fatalf("Import() = %v", err)
	}
	if rec.Upstream.Algo != SHA512 || rec.Raw != sha256Of(raw) {
		t.Errorf("record = %+v, want sha512 upstream and raw %v", rec, sha256Of(raw))
	}
}

func TestImportAll(t *testing.T) {
	srv := newFaultServer(t)
	good, bad := randomRaw(t, 200_000), randomRaw(t, 200_000)
	srv.put("/good.raw", good)
	srv.put("/bad.raw", bad)
	e := newTestEnv(t, nil)
	var firstStates []State
	var mu = &e.status.mu
	reqs := []Request{
		{Name: "good", URL: srv.URL + "/good.raw", Checksum: sha256Of(good).String(),
			Progress: func(Progress) {
				mu.Lock()
				if firstStates == nil {
					for _, s := range e.status.log {
						firstStates = append(firstStates, s.State)
					}
				}
				mu.Unlock()
			}},
		{Name: "bad", URL: srv.URL + "/bad.raw", Checksum: sha256Of(good).String()},
		{Name: "gone", URL: srv.URL + "/gone.raw", Checksum: sha256Of(good).String()},
		{Name: "Bad Name", URL: srv.URL + "/good.raw", Checksum: sha256Of(good).String()},
	}
	errs := e.im.ImportAll(t.Context(), reqs)
	if errs[0] != nil || !errors.Is(errs[1], ErrChecksumMismatch) || errs[2] == nil || !errors.Is(errs[3], ErrBadName) {
		t.Fatalf("ImportAll() = %v", errs)
	}
	// All three valid images were pending before the first download began.
	if diff := cmp.Diff([]State{StatePending, StatePending, StatePending, StatePending, StateDownloading}, firstStates); diff != "" {
		t.Errorf("statuses before the first transfer (-want +got):\n%s", diff)
	}
	recs, err := e.store.List()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]State{}
	for _, r := range recs {
		got[r.Name] = r.State
	}
	if diff := cmp.Diff(map[string]State{"good": StateVerified, "bad": StateFailed, "gone": StateFailed}, got); diff != "" {
		t.Errorf("store states (-want +got):\n%s", diff)
	}
	for name, reason := range map[string]string{"bad": "checksum mismatch: want " + sha256Of(good).String(), "gone": "HTTP 404"} {
		if r, _ := e.store.Lookup(name); !strings.Contains(r.Reason, reason) {
			t.Errorf("%s reason = %q, want it to contain %q", name, r.Reason, reason)
		}
	}
}

func TestImportRefresh(t *testing.T) {
	srv := newFaultServer(t)
	v1, v2 := randomRaw(t, 100_000), randomRaw(t, 100_000)
	srv.put("/d/disk.raw", v1)
	srv.put("/d/SUMS", []byte(sha256Of(v1).Hex+"  disk.raw\n"))
	e := newTestEnv(t, func(c *Config) { c.MaxAttempts = 1 })
	req := Request{Name: "disk", URL: srv.URL + "/d/disk.raw", ChecksumURL: srv.URL + "/d/SUMS"}
	r1, err := e.im.Import(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	// Upstream publishes v2 but the transfer fails: v1 stays in service.
	srv.put("/d/SUMS", []byte(sha256Of(v2).Hex+"  disk.raw\n"))
	srv.put("/d/disk.raw", v2)
	srv.inject(fault{path: "/d/disk.raw", code: 500})
	if _, err := e.im.Import(t.Context(), req); err == nil {
		t.Fatal("refresh with a failing mirror succeeded")
	}
	f, r, err := e.store.OpenImage("disk")
	if err != nil {
		t.Fatalf("OpenImage() after failed refresh = %v", err)
	}
	f.Close()
	if r.Raw != r1.Raw || !strings.HasPrefix(r.Reason, "refresh failed: ") {
		t.Errorf("record after failed refresh = %+v", r)
	}
	if st := e.status.last(); st.State != StateVerified || !strings.HasPrefix(st.Reason, "refresh failed") {
		t.Errorf("status after failed refresh = %+v", st)
	}
	// The refresh succeeds: v2 replaces v1 and v1's blob goes.
	r2, err := e.im.Import(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Raw != sha256Of(v2) || r2.Reason != "" {
		t.Errorf("refreshed record = %+v", r2)
	}
	p1, _ := e.store.BlobPath(r1.Raw)
	if _, err := os.Stat(p1); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("old blob still present: %v", err)
	}
}

func TestOpenStoreCleansStaleParts(t *testing.T) {
	dir := t.TempDir()
	st, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-PartMaxAge - time.Hour)
	for _, n := range []string{"old.part", "old.json", "young.part", "young.json", "w-1.tmp"} {
		p := filepath.Join(st.tmpDir(), n)
		os.WriteFile(p, []byte("x"), 0o640)
		if strings.HasPrefix(n, "old") || strings.HasPrefix(n, "w-") {
			os.Chtimes(p, old, old)
		}
	}
	if _, err := OpenStore(dir); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"young.json", "young.part"}, tmpEntries(t, st)); diff != "" {
		t.Errorf("tmp after reopen (-want +got):\n%s", diff)
	}
}

func TestURLSecretsNotRecorded(t *testing.T) {
	srv := newFaultServer(t)
	e := newTestEnv(t, func(c *Config) { c.MaxAttempts = 2 })
	u := strings.Replace(srv.URL, "http://", "http://user:pw-secret@", 1) + "/x.raw?sig=query-secret"
	_, err1 := e.im.Import(t.Context(), Request{Name: "x", URL: u, Checksum: "sha256:" + hexA})
	_, err2 := e.im.Import(t.Context(), Request{Name: "y", URL: "http://user:pw-secret@127.0.0.1:1/x.raw?sig=query-secret", Checksum: "sha256:" + hexA})
	rx, _ := e.store.Lookup("x")
	ry, _ := e.store.Lookup("y")
	for _, s := range []string{err1.Error(), err2.Error(), rx.Source, rx.Reason, ry.Source, ry.Reason, e.status.last().Reason} {
		if strings.Contains(s, "secret") {
			t.Errorf("secret leaked: %q", s)
		}
	}
	if rx.State != StateFailed || ry.State != StateFailed {
		t.Errorf("states = %s, %s; want failed", rx.State, ry.State)
	}
}

func TestImportRestartsWhenServerIgnoresIfRange(t *testing.T) {
	srv := newFaultServer(t)
	old, raw := randomRaw(t, mib), randomRaw(t, mib)
	srv.put("/x.raw", old)
	srv.inject(fault{path: "/x.raw", drop: 1000})
	e := newTestEnv(t, func(c *Config) { c.MaxAttempts = 1 })
	req := Request{Name: "x", URL: srv.URL + "/x.raw", Checksum: sha256Of(raw).String()}
	e.im.Import(t.Context(), req)
	srv.put("/x.raw", raw)
	srv.inject(fault{path: "/x.raw", ignoreIfRange: true}) // 206 of the new file, new ETag
	e2 := newTestEnv(t, nil)
	im2, _ := New(Config{Store: e.store, Sleep: e2.sleeps.sleep})
	rec, err := im2.Import(t.Context(), req)
	if err != nil {
		t.Fatalf("Import() = %v", err)
	}
	if !bytes.Equal(readBlob(t, e.store, rec), raw) {
		t.Fatal("blob splices two versions")
	}
	reqs := srv.requests("/x.raw")
	if len(reqs) != 3 || !strings.HasPrefix(reqs[1], "/x.raw range=bytes=1000- ") || !strings.HasPrefix(reqs[2], "/x.raw range= ") {
		t.Errorf("requests = %q, want drop, ignored If-Range, full restart", reqs)
	}
}
