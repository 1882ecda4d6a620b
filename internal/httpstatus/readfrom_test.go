package httpstatus

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

type readerFromRecorder struct {
	*httptest.ResponseRecorder
	used bool
}

func (r *readerFromRecorder) ReadFrom(src io.Reader) (int64, error) {
	r.used = true
	return io.Copy(r.ResponseRecorder, src)
}

// TestRecorderPassesReadFrom: io.Copy through the middleware's writer
// reaches the server's ReadFrom (net/http's sendfile path) and records
// 200; a writer without ReadFrom still gets the bytes.
func TestRecorderPassesReadFrom(t *testing.T) {
	rec := &readerFromRecorder{ResponseRecorder: httptest.NewRecorder()}
	w := &Recorder{ResponseWriter: rec}
	// Wrapped so it has no WriteTo (io.Copy would prefer it), as os.File.WriteTo does for a writer that is not a network connection.
	if _, err := io.Copy(w, struct{ io.Reader }{strings.NewReader("ramdisk bytes")}); err != nil {
		t.Fatal(err)
	}
	if !rec.used || w.Code != http.StatusOK || rec.Body.String() != "ramdisk bytes" {
		t.Fatalf("ReadFrom used %v, code %d, body %q", rec.used, w.Code, rec.Body.String())
	}
	plain := httptest.NewRecorder()
	w = &Recorder{ResponseWriter: plain}
	if _, err := io.Copy(w, strings.NewReader("x")); err != nil || plain.Body.String() != "x" {
		t.Fatalf("plain writer: %v %q", err, plain.Body.String())
	}
}
